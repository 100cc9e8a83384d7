"""The advantage library's in-process entry point: the server's response, without a server.

``rewardd.advantages.compute_advantages`` takes the body a trainer would POST to
``/v1/advantages`` and must answer the very body the route answers, bit for bit (the route
runs the same functions); and the documented golden values of docs/estimators.md come out of it.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import orjson
import pytest
from fastapi.testclient import TestClient

from rewardd.advantages import compute_advantages
from rewardd.advantages.errors import RequestInvalid
from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as c:
        yield c


def body(rewards: list[list[float | None]], **advantage: Any) -> dict[str, Any]:
    groups = [{"group_id": f"g{gi}", "rollouts": [
        {"rollout_id": f"g{gi}-{ri}", "num_tokens": 3 + ri,
         "rewards": {"acc": r}} for ri, r in enumerate(group)]}
        for gi, group in enumerate(rewards)]
    return {"groups": groups, "advantage": advantage}


CASES = [
    body([[1, 0, 0, 0]], estimator="grpo", profile="verl"),
    body([[1, 0, 0, 0], [0.5, 0.25, 1, None]], estimator="rloo", output="dense"),
    body([[1, 0], [1, 0]], estimator="grpo", profile="trl", output="scalar"),
    body([[1, 0, 1, 1], [0.2, 0.9, 0.4, 0.4]], estimator="passk", params={"k": 2},
         output="dense") | {"groups": body([[1, 0, 1, 1], [1, 0, 0, 0]])["groups"]},
    body([[3, 1, 2, 2]], estimator="dr_grpo", transforms=[{"name": "rank"}],
         filters=[{"name": "dynamic_sampling"}], components=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["advantage"]["estimator"])
def test_in_process_body_equals_the_routes_byte_for_byte(case: dict[str, Any],
                                                        client: TestClient) -> None:
    over_http = client.post("/v1/advantages", json=case)
    assert over_http.status_code == 200, over_http.text
    in_process = compute_advantages(case)
    assert orjson.dumps(in_process, option=orjson.OPT_SERIALIZE_NUMPY) == over_http.content


def test_grpo_under_verl_profile_gives_the_golden_values() -> None:
    out = compute_advantages(body([[1, 0, 0, 0]], estimator="grpo", profile="verl",
                                  output="scalar"))
    got = [r["advantages"] for r in out["groups"][0]["rollouts"]]
    std = math.sqrt(0.75 / 3)  # unbiased std of [1, 0, 0, 0]: 0.5
    assert got == [0.75 / (std + 1e-6), -0.25 / (std + 1e-6), -0.25 / (std + 1e-6),
                   -0.25 / (std + 1e-6)]
    assert round(got[0], 6) == 1.499997 and round(got[1], 6) == -0.499999


def test_bad_request_raises_the_routes_field_errors(client: TestClient) -> None:
    bad = body([[1, 0]], estimator="no_such_estimator")
    bad["groups"][0]["rollouts"][1]["num_tokens"] = -1
    with pytest.raises(RequestInvalid) as caught:
        compute_advantages(bad)
    over_http = client.post("/v1/advantages", json=bad)
    assert over_http.status_code == 422
    assert [e["loc"] for e in caught.value.errors] == [
        e["loc"] for e in over_http.json()["detail"]]
    assert caught.value.errors[0]["loc"] == ["body", "groups", 0, "rollouts", 1, "num_tokens"]


def test_cross_field_error_names_the_field() -> None:
    bad = body([[1, 0]], estimator="no_such_estimator")
    with pytest.raises(RequestInvalid) as caught:
        compute_advantages(bad)
    assert caught.value.errors[0]["loc"] == ["body", "advantage", "estimator"]
    assert "no_such_estimator" in caught.value.errors[0]["msg"]


def test_run_state_dict_carries_ha_dw_between_calls_and_only_on_success() -> None:
    state: dict[str, Any] = {}
    spec = {"estimator": "dr_grpo", "reweight": [{"name": "ha_dw"}], "output": "scalar"}
    first = compute_advantages({**body([[1, 0, 0, 0], [1, 1, 1, 0]], **spec),
                                "run_id": "r"}, state)
    assert first["report"]["ha_dw"]["anchor_after"] == 0.5
    assert state == {"ha_dw": {"anchor": 0.5, "batches": 1}}
    failing = {**body([[1, 0]], **spec, transforms=[{"name": "nope"}]), "run_id": "r"}
    with pytest.raises(RequestInvalid):
        compute_advantages(failing, state)
    assert state == {"ha_dw": {"anchor": 0.5, "batches": 1}}
    second = compute_advantages({**body([[1, 1, 0, 0], [1, 1, 1, 1]], **spec),
                                 "run_id": "r"}, state)
    assert second["report"]["ha_dw"]["anchor_before"] == 0.5
    assert state["ha_dw"]["batches"] == 2
