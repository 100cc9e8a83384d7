"""Issue 28, "what to build" 1: every route that takes a batch bounds its rollouts
(REWARDD_MAX_ROLLOUTS_PER_REQUEST) and the per-token advantages of its answer
(REWARDD_MAX_DENSE_TOKENS), refused with a 422 at body.groups naming the setting before any
verifier or advantage work starts (row 18: a 1.4 MB /v1/advantages body asking for 2^26
dense tokens built a 1.3 GB answer)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient

from rewardd.advantages import compute_advantages
from rewardd.advantages.checks import MAX_TOKENS_PER_REQUEST
from rewardd.service import pipeline
from rewardd.service.app import create_app
from rewardd.service.models import AdvantagesRequest
from rewardd.service.settings import Settings
from tests.support.executors import GatedExecutor, RefusingExecutor

LIMITS = {"max_dense_tokens": 100, "max_rollouts_per_request": 4}


@pytest.fixture
def client() -> Iterator[TestClient]:
    executor = RefusingExecutor()
    with TestClient(create_app(Settings(pool_size=1, **LIMITS), executor=executor)) as c:
        yield c
    assert executor.run_calls == 0, "an oversized request reached the executor"


def rollouts(count: int, tokens: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"rollout_id": f"r{i}", "completion": "x", "num_tokens": tokens, **extra}
            for i in range(count)]


def scored(count: int, tokens: int, output: str = "dense") -> dict[str, Any]:
    return {"groups": [{"group_id": "g0", "reference": {"answer": "1"},
                        "rollouts": rollouts(count, tokens)}],
            "rewards": [{"name": "acc", "verifier": "math"}], "advantage": {"output": output}}


def given(count: int, tokens: int, output: str = "dense") -> dict[str, Any]:
    return {"groups": [{"group_id": "g0", "rollouts": [
                {**r, "reward": float(i % 2)} for i, r in enumerate(rollouts(count, tokens))]}],
            "advantage": {"output": output}}


def refusal(resp: Any) -> str:
    assert resp.status_code == 422, resp.text
    [only] = resp.json()["detail"]
    assert only["loc"] == ["body", "groups"], only
    return only["msg"]


@pytest.mark.parametrize("output", ["dense", "rle"])
def test_advantages_over_the_dense_token_bound_are_refused_naming_it(client, output):
    msg = refusal(client.post("/v1/advantages", json=given(4, 26, output)))
    assert msg.startswith("104 tokens in one request is over the limit of 100 "
                          "(REWARDD_MAX_DENSE_TOKENS)")
    assert client.post("/v1/advantages", json=given(4, 25, output)).status_code == 200
    assert client.post("/v1/advantages", json=given(4, 26, "scalar")).status_code == 200


def test_advantages_over_the_rollout_bound_are_refused_naming_it(client):
    msg = refusal(client.post("/v1/advantages", json=given(5, 1, "scalar")))
    assert msg.startswith("5 rollouts in one request is over the limit of 4 "
                          "(REWARDD_MAX_ROLLOUTS_PER_REQUEST)")


@pytest.mark.parametrize("route", ["/v1/score", "/v1/jobs"])
def test_scoring_with_dense_advantages_is_bounded_before_any_verifier(client, route):
    msg = refusal(client.post(route, json=scored(4, 26)))
    assert "over the limit of 100 (REWARDD_MAX_DENSE_TOKENS) for output 'dense'" in msg


def test_a_session_add_is_bounded_per_call(client):
    opened = client.post("/v1/sessions", json={
        "rewards": [{"name": "acc", "verifier": "math"}], "group_size": 8,
        "advantage": {"output": "dense"}})
    assert opened.status_code == 201, opened.text
    sid = opened.json()["session_id"]
    body = {"groups": [{"group_id": "g0", "reference": {"answer": "1"},
                        "rollouts": rollouts(4, 26)}]}
    assert "(REWARDD_MAX_DENSE_TOKENS)" in refusal(
        client.post(f"/v1/sessions/{sid}/rollouts", json=body))
    body["groups"][0]["rollouts"] = rollouts(5, 1)
    assert "(REWARDD_MAX_ROLLOUTS_PER_REQUEST)" in refusal(
        client.post(f"/v1/sessions/{sid}/rollouts", json=body))


def test_the_grpc_and_offline_entry_uses_the_settings_and_in_process_the_library_bound():
    """pipeline.advantages is what gRPC Advantages and `rewardd score` call with the
    settings; the in-process library keeps its own (larger) bound."""
    from rewardd.advantages.errors import RequestInvalid

    request = AdvantagesRequest.model_validate(given(4, 26))
    with pytest.raises(RequestInvalid, match="REWARDD_MAX_DENSE_TOKENS"):
        pipeline.advantages(request, None, Settings(**LIMITS))
    assert len(compute_advantages(given(4, 26))["groups"][0]["rollouts"]) == 4
    huge = given(9, 1 << 24)
    with pytest.raises(RequestInvalid, match=f"over the limit of {MAX_TOKENS_PER_REQUEST} "
                       "for output 'dense'"):
        compute_advantages(huge)


def test_the_default_dense_bound_is_a_few_million_tokens():
    assert Settings().max_dense_tokens == 4_194_304


def test_a_sessions_adds_together_are_bounded_by_the_answer_they_build():
    """The close answers with every group's dense advantages: many small adds may not build
    the answer one request may not (the tokens are counted per session, over every pod)."""
    executor = GatedExecutor()
    executor.gate.set()
    with TestClient(create_app(Settings(pool_size=1, **LIMITS), executor=executor)) as client:
        opened = client.post("/v1/sessions", json={
            "rewards": [{"name": "acc", "verifier": "math"}], "group_size": 4,
            "advantage": {"output": "dense"}})
        sid = opened.json()["session_id"]

        def add(group: str, tokens: int) -> Any:
            return client.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
                {"group_id": group, "reference": {"answer": "1"},
                 "rollouts": rollouts(3, tokens)}]})

        assert add("g0", 26).status_code == 200  # 78 tokens
        msg = refusal(add("g1", 8))  # 102 > 100
        assert f"session {sid} would answer with 102 tokens, over the limit of 100 " \
               "(REWARDD_MAX_DENSE_TOKENS)" in msg
        assert add("g1", 7).status_code == 200  # 99: the refused add was not counted
