"""Which group and rollout ids a request may carry: any 1..256 characters but control ones.

Through the real app (``create_app``); ``/v1/advantages`` needs no verifier, and the refusing
executor proves a rejected id never reaches one.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor

G0 = ["body", "groups", 0]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    executor = RefusingExecutor()
    with TestClient(create_app(Settings(pool_size=1), executor=executor)) as c:
        yield c
    assert executor.run_calls == 0


def body(group_id: str = "g", rollout_ids: tuple[str, str] = ("r0", "r1"),
         **extra: Any) -> dict[str, Any]:
    return {"groups": [{"group_id": group_id, "rollouts": [
        {"rollout_id": rid, "reward": reward} for rid, reward in zip(rollout_ids, (1.0, 0.0))]}],
        "advantage": {"output": "scalar"}, **extra}


def only_error(resp: Any) -> dict[str, Any]:
    assert resp.status_code == 422, resp.text
    [err] = resp.json()["detail"]
    return err


@pytest.mark.parametrize("group_id, rollout_ids", [
    ("HumanEval/0", ("HumanEval/0#0", "HumanEval/0#1")),
    ("gsm8k/train/17", ("gsm8k/train/17:a", "gsm8k/train/17:b")),
    ("with spaces ", (" r 0", "r\u00a01")),  # a no-break space is not a control character
    ("題目/一", ("答案 α", "😀")),
    ("x" * 256, ("y" * 256, "z")),
])
def test_dataset_ids_are_accepted_and_echoed(client: TestClient, group_id: str,
                                             rollout_ids: tuple[str, str]) -> None:
    resp = client.post("/v1/advantages", json=body(group_id, rollout_ids))
    assert resp.status_code == 200, resp.text
    [group] = resp.json()["groups"]
    assert group["group_id"] == group_id
    assert [r["rollout_id"] for r in group["rollouts"]] == list(rollout_ids)


@pytest.mark.parametrize("bad, code", [("a\nb", "000A"), ("\tlead", "0009"), ("del\x7f", "007F"),
                                       ("c1\x85", "0085"), ("nul\x00", "0000")])
def test_a_control_character_in_a_group_id_is_422_naming_it(client: TestClient, bad: str,
                                                           code: str) -> None:
    err = only_error(client.post("/v1/advantages", json=body(group_id=bad)))
    assert err["loc"] == G0 + ["group_id"]
    assert err["msg"] == (f"Value error, control character U+{code} at index "
                          f"{bad.index(chr(int(code, 16)))} is not allowed in an id")
    assert err["type"] == "value_error"


def test_a_control_character_in_a_rollout_id_is_422_naming_it(client: TestClient) -> None:
    err = only_error(client.post("/v1/advantages", json=body(rollout_ids=("r0", "r\r1"))))
    assert err["loc"] == G0 + ["rollouts", 1, "rollout_id"]
    assert "U+000D at index 1" in err["msg"]


@pytest.mark.parametrize("field", ["group_id", "rollout_id"])
def test_an_id_over_256_characters_is_422_naming_it(client: TestClient, field: str) -> None:
    long = "é" * 257  # characters, not bytes: 256 of these (512 bytes) pass
    payload = body(group_id=long) if field == "group_id" else body(rollout_ids=(long, "r1"))
    err = only_error(client.post("/v1/advantages", json=payload))
    assert err["loc"] == (G0 + ["group_id"] if field == "group_id"
                          else G0 + ["rollouts", 0, "rollout_id"])
    assert err["type"] == "string_too_long" and "at most 256 characters" in err["msg"]


def test_an_empty_id_is_422(client: TestClient) -> None:
    err = only_error(client.post("/v1/advantages", json=body(group_id="")))
    assert err["loc"] == G0 + ["group_id"] and err["type"] == "string_too_short"


def test_ids_differing_only_in_separators_are_distinct(client: TestClient) -> None:
    resp = client.post("/v1/advantages", json=body(rollout_ids=("a/b", "a:b")))
    assert resp.status_code == 200, resp.text
    rollouts = resp.json()["groups"][0]["rollouts"]
    assert [(r["rollout_id"], r["reward"]) for r in rollouts] == [("a/b", 1.0), ("a:b", 0.0)]


def test_run_ids_stay_strict_names(client: TestClient) -> None:
    """Run ids become part of run-state keys: the dataset-id rule does not extend to them."""
    err = only_error(client.post("/v1/advantages", json=body(run_id="team/run 1")))
    assert err["loc"] == ["body", "run_id"] and err["type"] == "string_pattern_mismatch"
