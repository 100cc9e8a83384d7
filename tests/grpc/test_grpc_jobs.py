"""Jobs over gRPC: submit, watch (one message per finished group, then the end), get the
result (the Score answer), idempotency, cancel, tenant isolation; and health and reflection."""

from __future__ import annotations

import copy

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc.convert import rows_of
from tests.grpc.conftest import KEY, OTHER_KEY, auth
from tests.grpc.requests import SCORE, score_message
from tests.grpc.test_grpc_errors import call_error, status_of

pytestmark = pytest.mark.e2e


def submit(stub, data: dict | None = None, key: str | None = None) -> pb.JobSubmitted:
    request = pb.SubmitJobRequest(request=score_message(data))
    if key is not None:
        request.idempotency_key = key
    return stub.SubmitJob(request, metadata=auth(), timeout=60)


def test_a_job_streams_its_groups_then_ends_and_its_result_is_scores(grpc_server):
    stub = grpc_server.stub()
    job = submit(stub)
    assert len(job.id) == 32 and job.links.status == f"/v1/jobs/{job.id}"
    assert not job.existing
    events = list(stub.WatchJob(pb.WatchJobRequest(id=job.id), metadata=auth(), timeout=120))
    groups = [e.group for e in events if e.WhichOneof("event") == "group"]
    assert sorted(g.group_id for g in groups) == ["HumanEval/0", "g2"]
    by_id = {g.group_id: g for g in groups}
    assert [r.reward for r in by_id["g2"].rollouts] == [1.25, 0.25]
    assert events[-1].WhichOneof("event") == "end"
    assert events[-1].end.state == "succeeded" and events[-1].end.id == job.id
    seqs = [e.seq for e in events if e.WhichOneof("event") != "progress"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    status = stub.GetJob(pb.GetJobRequest(id=job.id), metadata=auth(), timeout=60)
    assert status.state == "succeeded" and status.progress.done == status.progress.total == 12
    scored = stub.Score(score_message(), metadata=auth(), timeout=60)
    assert rows_of(status.result.advantages) == rows_of(scored.advantages)
    # one process, one job store: REST sees the job gRPC submitted, with the same result
    rest = httpx.get(f"{grpc_server.url}/v1/jobs/{job.id}",
                     headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()
    assert rest["state"] == "succeeded"
    assert [r["reward"] for g in rest["result"]["groups"] for r in g["rollouts"]] == \
        [r.reward for g in status.result.groups for r in g.rollouts]
    # resume after the first group: only what came later
    later = list(stub.WatchJob(pb.WatchJobRequest(id=job.id, after=seqs[0]), metadata=auth(),
                               timeout=60))
    assert [e.seq for e in later] == seqs[1:]


def test_idempotency_key_returns_the_same_job_and_refuses_another_body(grpc_server):
    stub = grpc_server.stub()
    first = submit(stub, key="grpc-idem-1")
    again = submit(stub, key="grpc-idem-1")
    assert (again.id, again.existing) == (first.id, True)
    other = copy.deepcopy(SCORE)
    other["run_id"] = "another-run"
    request = pb.SubmitJobRequest(request=score_message(other), idempotency_key="grpc-idem-1")
    code, got = call_error(stub.SubmitJob, request, metadata=auth())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert got["violations"] == [("header.Idempotency-Key", "idempotency_key_reused")]
    request = pb.SubmitJobRequest(request=score_message(), idempotency_key="k" * 256)
    code, got = call_error(stub.SubmitJob, request, metadata=auth())
    assert [f for f, _ in got["violations"]] == ["header.Idempotency-Key"]


def test_an_invalid_job_is_refused_at_submit(grpc_server):
    data = copy.deepcopy(SCORE)
    data["rewards"][0]["verifier"] = "nope"
    code, got = call_error(grpc_server.stub().SubmitJob,
                           pb.SubmitJobRequest(request=score_message(data)), metadata=auth())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert got["violations"] == [("body.rewards.0.verifier", "value_error")]


def test_cancel_ends_the_stream_and_other_tenants_see_no_job(grpc_server):
    stub = grpc_server.stub()
    data = copy.deepcopy(SCORE)
    data["rewards"] = [{"name": "slow", "verifier": "test_sleep", "params": {"seconds": 300},
                        "timeout_s": 400}]
    job = submit(stub, data)
    code, _ = call_error(stub.GetJob, pb.GetJobRequest(id=job.id), metadata=auth(OTHER_KEY))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = call_error(stub.CancelJob, pb.CancelJobRequest(id=job.id),
                         metadata=auth(OTHER_KEY))
    assert code == grpc.StatusCode.NOT_FOUND
    cancelled = stub.CancelJob(pb.CancelJobRequest(id=job.id), metadata=auth(), timeout=60)
    assert cancelled.state == "cancelled" and not cancelled.HasField("result")
    events = list(stub.WatchJob(pb.WatchJobRequest(id=job.id), metadata=auth(), timeout=60))
    assert events[-1].end.state == "cancelled"


def test_watch_after_an_id_the_stream_never_sent_names_the_field(grpc_server):
    stub = grpc_server.stub()
    job = submit(stub)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.WatchJob(pb.WatchJobRequest(id=job.id, after=10**6), metadata=auth(),
                           timeout=60))
    code, got = status_of(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in got["violations"]] == ["after"]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.WatchJob(pb.WatchJobRequest(id="f" * 32), metadata=auth(), timeout=60))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_and_reflection(grpc_server):
    checker = health_pb2_grpc.HealthStub(grpc_server.channel)
    for service in ("", "rewardd.v1.Rewardd"):
        reply = checker.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(grpc_server.channel)
    [reply] = list(reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30))
    names = {s.name for s in reply.list_services_response.service}
    assert {"rewardd.v1.Rewardd", "grpc.health.v1.Health"} <= names
