"""Score, Rewards, Advantages, Verify and the catalogue over gRPC against a real server,
each compared with the same request over REST on the same server."""

from __future__ import annotations

import math
import time

import grpc

import httpx
import numpy as np
import pytest
from google.protobuf import json_format

from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc.convert import rows_of
from tests.grpc.conftest import KEY, OTHER_KEY, auth
from tests.grpc.requests import SCORE, body, message, score_message

pytestmark = pytest.mark.e2e
HEADERS = {"Authorization": f"Bearer {KEY}"}


def rest(server, path: str, data: dict) -> dict:
    response = httpx.post(f"{server.url}{path}", json=data, headers=HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def rest_rows(out: dict, key: str = "advantages") -> list:
    return [r[key] for g in out["groups"] for r in g["rollouts"]]


def test_score_dense_is_rests_advantages_as_float32(grpc_server):
    got = grpc_server.stub().Score(score_message(), metadata=auth(), timeout=60)
    want = rest(grpc_server, "/v1/score", SCORE)
    assert got.advantages.WhichOneof("values") == "dense"
    assert list(got.advantages.dense.row_offsets) == [0, 5, 8, 15, 16, 20, 22]
    for row, expected in zip(rows_of(got.advantages), rest_rows(want)):
        assert row == np.asarray(expected, dtype=np.float32).tolist()
    # hand-computed: group 1 rewards (1.25, 0.25, 1.25, 0), mean 0.6875, squared deviations
    # sum 1.296875, unbiased std sqrt(1.296875 / 3); grpo's eps 1e-6 below the fraction;
    # c's masked tokens are exactly 0
    rows = rows_of(got.advantages)
    a = np.float32(0.5625 / (math.sqrt(1.296875 / 3) + 1e-6)).item()
    assert rows[0] == [a] * 5 and a == pytest.approx(0.85552645)
    assert rows[2][2:4] == [0.0, 0.0]
    for g_got, g_want in zip(got.groups, want["groups"]):
        assert g_got.group_id == g_want["group_id"]
        for r_got, r_want in zip(g_got.rollouts, g_want["rollouts"]):
            assert r_got.rollout_id == r_want["rollout_id"]
            assert r_got.reward == r_want["reward"]
            assert json_format.MessageToDict(r_got.rewards) == r_want["rewards"]
            assert {k: v.ok for k, v in r_got.status.items()} == \
                {k: v["ok"] for k, v in r_want["status"].items()}
    assert got.summary.rollouts == want["summary"]["rollouts"] == 6
    assert got.summary.reward_mean == want["summary"]["reward_mean"]
    assert got.estimator == want["estimator"] and got.run_id == "grpc-run"


def test_score_rle_is_rests_rle_bit_for_bit(grpc_server):
    data = body(output="rle")
    got = grpc_server.stub().Score(score_message(data), metadata=auth(), timeout=60)
    want = rest(grpc_server, "/v1/score", data)
    runs = [run for row in rest_rows(want) for run in row["rle"]]
    assert list(got.advantages.rle.values) == [v for v, _ in runs]
    assert list(got.advantages.rle.lengths) == [n for _, n in runs]
    dense = rest_rows(rest(grpc_server, "/v1/score", body(output="dense")))
    assert rows_of(got.advantages) == dense  # float64 runs decode to REST's dense exactly


def test_scalar_and_none_outputs(grpc_server):
    data = body(output="scalar")
    data["groups"][0]["rollouts"][2].pop("mask")
    got = grpc_server.stub().Score(score_message(data), metadata=auth(), timeout=60)
    assert list(got.advantages.scalar.values) == rest_rows(rest(grpc_server, "/v1/score", data))
    none = grpc_server.stub().Score(score_message(body(output="none")), metadata=auth(),
                                    timeout=60)
    assert not none.HasField("advantages")


def test_rewards_has_no_advantages(grpc_server):
    data = {k: v for k, v in SCORE.items() if k != "advantage"}
    got = grpc_server.stub().Rewards(message(pb.RewardsRequest, data), metadata=auth(),
                                     timeout=60)
    assert not got.HasField("advantages")
    assert [r.reward for g in got.groups for r in g.rollouts] == [1.25, 0.25, 1.25, 0.0, 1.25,
                                                                  0.25]


def test_advantages_from_given_rewards_with_per_token_inputs(grpc_server):
    data = {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "num_tokens": 3, "reward": 1.0, "mask": [1, 0, 1]},
        {"rollout_id": "b", "num_tokens": 2, "reward": 0.0},
        {"rollout_id": "c", "num_tokens": 1, "reward": 0.5}]}],
        "advantage": {"estimator": "grpo", "output": "rle"}}
    got = grpc_server.stub().Advantages(message(pb.AdvantagesRequest, data), metadata=auth(),
                                        timeout=60)
    want = rest(grpc_server, "/v1/advantages", data)
    assert rows_of(got.advantages) == [
        [v for v, n in r["rle"] for _ in range(n)] for r in rest_rows(want)]
    # rewards (1, 0, 0.5): mean 0.5, std 0.5 (+ eps 1e-6) -> (±0.5 / 0.500001, 0); a's masked
    # token exactly 0
    a = 0.5 / (0.5 + 1e-6)
    assert rows_of(got.advantages) == [[a, 0.0, a], [-a, -a], [0.0]]


def test_verify_one_completion(grpc_server):
    got = grpc_server.stub().Verify(pb.VerifyRequest(
        verifier="math", completion="so \\boxed{\\frac{1}{2}}", reference={"answer": "0.5"}),
        metadata=auth(), timeout=60)
    want = rest(grpc_server, "/v1/verify/math",
                {"completion": "so \\boxed{\\frac{1}{2}}", "reference": {"answer": "0.5"}})
    assert (got.ok, got.reward, got.HasField("error")) == (True, 1.0, False)
    assert json_format.MessageToDict(got.detail) == want["detail"]


def test_catalogue_lists_what_rest_lists(grpc_server):
    stub = grpc_server.stub()
    verifiers = stub.ListVerifiers(pb.ListVerifiersRequest(), metadata=auth(), timeout=30)
    want = httpx.get(f"{grpc_server.url}/v1/verifiers", headers=HEADERS).json()
    assert [v.name for v in verifiers.verifiers] == [v["name"] for v in want]
    assert "test_sleep" in [v.name for v in verifiers.verifiers]
    filters = stub.ListEstimators(pb.ListEstimatorsRequest(kind="filter"), metadata=auth())
    want = httpx.get(f"{grpc_server.url}/v1/estimators", params={"kind": "filter"},
                     headers=HEADERS).json()
    assert [e.name for e in filters.estimators] == [e["name"] for e in want]
    assert {e.kind for e in filters.estimators} == {"filter"}
    everything = stub.ListEstimators(pb.ListEstimatorsRequest(), metadata=auth())
    assert len(everything.estimators) == len(
        httpx.get(f"{grpc_server.url}/v1/estimators", headers=HEADERS).json())


def test_gae_with_per_token_values_returns_both_tensors_as_rest(grpc_server):
    data = {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "num_tokens": 3, "reward": 1.0, "values": [0.5, 0.25, 0.125]},
        {"rollout_id": "b", "num_tokens": 2, "reward": 0.0, "values": [0.1, -0.2]}]}],
        "advantage": {"estimator": "gae", "output": "dense"}}
    got = grpc_server.stub().Advantages(message(pb.AdvantagesRequest, data), metadata=auth(),
                                        timeout=60)
    want = rest(grpc_server, "/v1/advantages", data)
    for key in ("advantages", "returns"):
        assert rows_of(getattr(got, key)) == [np.asarray(r, np.float32).tolist()
                                              for r in rest_rows(want, key)]
    assert list(got.returns.dense.row_offsets) == [0, 3, 5]


def test_precomputed_components_with_a_missing_value(grpc_server):
    data = {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "num_tokens": 1, "rewards": {"x": 1.0, "y": 0.5}},
        {"rollout_id": "b", "num_tokens": 1, "rewards": {"x": 0.0, "y": None}},
        {"rollout_id": "c", "num_tokens": 1, "rewards": {"x": 0.0, "y": 0.0}}]}],
        "advantage": {"estimator": "grpo", "output": "scalar", "weights": {"y": 2.0}}}
    got = grpc_server.stub().Advantages(message(pb.AdvantagesRequest, data), metadata=auth(),
                                        timeout=60)
    want = rest(grpc_server, "/v1/advantages", data)
    rollouts = got.groups[0].rollouts
    assert [r.reward if r.HasField("reward") else None for r in rollouts] == \
        [r["reward"] for r in want["groups"][0]["rollouts"]] == [2.0, None, 0.0]
    assert rollouts[1].excluded and rollouts[1].status["y"].error == "missing"
    assert list(got.advantages.scalar.values) == rest_rows(want)


def test_rewards_over_grpc_are_recorded_with_their_source(grpc_server):
    data = {k: v for k, v in SCORE.items() if k != "advantage"}
    data = {**data, "run_id": "grpc-recorded", "step": 5,
            "groups": [{**g, "source": "humaneval"} for g in data["groups"]]}
    got = grpc_server.stub().Rewards(message(pb.RewardsRequest, data), metadata=auth(),
                                     timeout=60)
    assert [g.source for g in got.groups] == ["humaneval", "humaneval"]
    view = None
    for _ in range(600):  # the record is written off the request path: a guard, not a bound
        response = httpx.get(f"{grpc_server.url}/v1/runs/grpc-recorded", headers=HEADERS,
                             timeout=60)
        if response.status_code == 200 and response.json()["record"]["rollouts"] == 6:
            view = response.json()
            break
        time.sleep(0.1)
    assert view is not None, response.text
    [step] = view["steps"]
    assert (step["step"], step["sources"]) == (5, {"humaneval": 6})
    assert step["components"]["fmt"]["mean"] == pytest.approx(5 / 6)
    other = httpx.get(f"{grpc_server.url}/v1/runs/grpc-recorded",
                      headers={"Authorization": f"Bearer {OTHER_KEY}"}, timeout=60)
    assert other.status_code == 404

    # the same record through gRPC: ListRuns and GetRun answer what REST answers
    stub = grpc_server.stub()
    listed = stub.ListRuns(pb.ListRunsRequest(), metadata=auth(), timeout=60)
    rest_list = httpx.get(f"{grpc_server.url}/v1/runs", headers=HEADERS, timeout=60).json()
    [via_grpc] = [run for run in json_format.MessageToDict(
        listed, preserving_proto_field_name=True)["runs"] if run["run_id"] == "grpc-recorded"]
    [via_rest] = [run for run in rest_list["runs"] if run["run_id"] == "grpc-recorded"]
    assert via_grpc == {k: str(v) if isinstance(v, int) else v  # int64: strings in proto JSON
                        for k, v in via_rest.items() if v is not None}
    got = stub.GetRun(pb.GetRunRequest(run_id="grpc-recorded"), metadata=auth(), timeout=60)
    assert got.record.rollouts == 6 and got.steps[0].sources == {"humaneval": 6}
    assert got.steps[0].components["fmt"].mean == pytest.approx(5 / 6)
    assert not got.HasField("state")
    with pytest.raises(grpc.RpcError) as missing:
        stub.GetRun(pb.GetRunRequest(run_id="grpc-recorded"), metadata=auth(OTHER_KEY),
                    timeout=60)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as bad:
        stub.ListRuns(pb.ListRunsRequest(limit=0), metadata=auth(), timeout=60)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit" in bad.value.details()
