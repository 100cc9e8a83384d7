"""Errors over gRPC: bad input names REST's field paths, auth, the tenant's limits (quota
with RetryInfo, body size), unknown names, and deadlines that cancel the checks."""

from __future__ import annotations

import copy
import math
import time

import grpc
import httpx
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from rewardd.service.grpc import rewardd_pb2 as pb
from tests.grpc.conftest import KEY, SMALL_KEY, auth
from tests.grpc.requests import SCORE, score_message

pytestmark = pytest.mark.e2e


def status_of(exc: grpc.RpcError) -> tuple[grpc.StatusCode, dict]:
    """(code, {'violations': [(field, reason)], 'info': reason, 'retry_s': seconds})."""
    status = rpc_status.from_call(exc)
    out: dict = {"violations": [], "info": None, "retry_s": None}
    for detail in status.details:
        for kind in (error_details_pb2.BadRequest, error_details_pb2.ErrorInfo,
                     error_details_pb2.RetryInfo):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                if kind is error_details_pb2.BadRequest:
                    out["violations"] = [(v.field, v.reason) for v in message.field_violations]
                elif kind is error_details_pb2.ErrorInfo:
                    out["info"] = (message.domain, message.reason)
                else:
                    out["retry_s"] = message.retry_delay.seconds
    return exc.code(), out


def call_error(fn, request, **kwargs) -> tuple[grpc.StatusCode, dict]:
    with pytest.raises(grpc.RpcError) as caught:
        fn(request, timeout=kwargs.pop("timeout", 60), **kwargs)
    return status_of(caught.value)


def mutate(path: tuple, value) -> dict:
    data = copy.deepcopy(SCORE)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return data


BAD = {
    "mask longer than num_tokens": mutate(("groups", 0, "rollouts", 2, "mask"), [1] * 8),
    "negative num_tokens": mutate(("groups", 0, "rollouts", 0, "num_tokens"), -1),
    "empty rollout id": mutate(("groups", 1, "rollouts", 0, "rollout_id"), ""),
    "duplicate rollout id": mutate(("groups", 1, "rollouts", 1, "rollout_id"), "e"),
    "unknown verifier": mutate(("rewards", 1, "verifier"), "nope"),
    "unknown estimator": mutate(("advantage", "estimator"), "nope"),
    "unknown output": mutate(("advantage", "output"), "sparse"),
    "bad regex params": mutate(("rewards", 1, "params"), {"pattern": "("}),
    "no rewards": {k: v for k, v in SCORE.items() if k != "rewards"},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_same_fields_as_rests_422(grpc_server, case):
    data = BAD[case]
    response = httpx.post(f"{grpc_server.url}/v1/score", json=data,
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert response.status_code == 422, response.text
    want = [(".".join(map(str, e["loc"])), e["type"]) for e in response.json()["detail"]]
    code, got = call_error(grpc_server.stub().Score, score_message(data), metadata=auth())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert got["violations"] == want
    assert got["info"] == ("rewardd", "request_invalid")


def test_a_non_finite_per_token_value_names_its_element(grpc_server):
    data = copy.deepcopy(SCORE)
    data["groups"][0]["rollouts"][0]["token_rewards"] = [0.0, math.nan, 0.0, 0.0, 0.0]
    code, got = call_error(grpc_server.stub().Score, score_message(data), metadata=auth())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert got["violations"] == [("body.groups.0.rollouts.0.token_rewards.1", "finite_number")]


def test_a_row_that_is_not_whole_float32s_names_its_bytes(grpc_server):
    request = score_message()
    request.groups[0].rollouts[0].values.data_f32le = np.zeros(5, "<f4").tobytes()[:-1]
    code, got = call_error(grpc_server.stub().Score, request, metadata=auth())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert got["violations"] == [("body.groups.0.rollouts.0.values.data_f32le", "value_error")]


def test_unknown_estimator_kind_names_the_query_field(grpc_server):
    code, got = call_error(grpc_server.stub().ListEstimators,
                           pb.ListEstimatorsRequest(kind="nope"), metadata=auth())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in got["violations"]] == ["query.kind"]


def test_unknown_verifier_is_not_found(grpc_server):
    code, got = call_error(grpc_server.stub().Verify,
                           pb.VerifyRequest(verifier="nope", completion="x"), metadata=auth())
    assert code == grpc.StatusCode.NOT_FOUND and got["info"] == ("rewardd", "not_found")


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),),
                                      (("authorization", f"Basic {KEY}"),)])
def test_calls_without_a_valid_key_are_unauthenticated(grpc_server, metadata):
    for fn, request in ((grpc_server.stub().Score, score_message()),
                        (grpc_server.stub().ListVerifiers, pb.ListVerifiersRequest()),
                        (grpc_server.stub().GetJob, pb.GetJobRequest(id="0" * 32))):
        code, got = call_error(fn, request, metadata=metadata)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert got["info"] == ("rewardd", "unauthenticated")


def test_a_message_over_the_tenants_body_limit_is_refused(grpc_server):
    data = copy.deepcopy(SCORE)
    data["groups"][0]["prompt"] = "x" * 5000  # tenant 'small' may send 4096 bytes
    code, got = call_error(grpc_server.stub().Score, score_message(data),
                           metadata=auth(SMALL_KEY))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert got["info"] == ("rewardd", "body_too_large")


def sleeper(seconds: float) -> pb.VerifyRequest:
    """A check that sleeps ``seconds`` under a verifier time limit longer than that (the
    server's default of 10 s would end it early and hide a cancel that did not happen)."""
    return pb.VerifyRequest(verifier="test_sleep", completion="x", params={"seconds": seconds},
                            timeout_s=seconds + 60)


def test_a_busy_tenant_gets_retry_info_and_its_slot_back_after_a_cancel(grpc_server):
    stub = grpc_server.stub()
    held = stub.Verify.future(sleeper(300), metadata=auth(SMALL_KEY), timeout=300)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the held call has its slot (the tenant's only one)
            try:
                stub.Verify(pb.VerifyRequest(verifier="exact_match", completion="a",
                                             reference={"answer": "a"}),
                            metadata=auth(SMALL_KEY), timeout=60)
            except grpc.RpcError as exc:
                code, got = status_of(exc)
                break
            assert time.monotonic() < deadline, "the held call never took the slot"
            time.sleep(0.2)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert got["info"] == ("rewardd", "tenant_busy") and got["retry_s"] == 2
    finally:
        held.cancel()
    # the cancelled call gave its slot back and the check stopped: the next call of the
    # tenant is admitted and answered long before the 300 s sleep would have ended
    started = time.monotonic()
    deadline = started + 90
    while True:
        try:
            reply = stub.Verify(pb.VerifyRequest(verifier="exact_match", completion="a",
                                                 reference={"answer": "a"}),
                                metadata=auth(SMALL_KEY), timeout=90)
            break
        except grpc.RpcError as exc:
            assert status_of(exc)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "the slot was not given back"
            time.sleep(0.5)
    assert reply.ok and time.monotonic() - started < 90


def test_a_call_past_its_deadline_cancels_its_check(grpc_server):
    stub = grpc_server.stub()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        stub.Verify(sleeper(300), metadata=auth(), timeout=3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # one pool worker: had the sleep gone on, this check would wait ~300 s behind it
    reply = stub.Verify(pb.VerifyRequest(verifier="exact_match", completion="a",
                                         reference={"answer": "a"}), metadata=auth(),
                        timeout=90)
    assert reply.ok and reply.reward == 1.0
    assert time.monotonic() - started < 90
