"""A group whose every rollout was excluded has no baseline; it is not a singleton.

``singleton`` means exactly one rollout entered the baseline (the profile's singleton rule
applies to it); a group with none says so by ``baseline_size: 0`` and its ``excluded`` list.
Through the real app's ``/v1/advantages``: a precomputed component sent as null is a missing
cell, and with no fallback it excludes its rollout.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.models import ScoreResponse
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor

EPS = 1e-6  # the rewardd profile's epsilon


def rollouts(prefix: str, *acc: float | None) -> list[dict[str, Any]]:
    return [{"rollout_id": f"{prefix}{k}", "rewards": {"acc": a}} for k, a in enumerate(acc)]


BODY = {"groups": [
    {"group_id": "none", "rollouts": rollouts("n", None, None)},
    {"group_id": "lone", "rollouts": rollouts("l", 1.0)},
    {"group_id": "half", "rollouts": rollouts("h", 1.0, None)},
    {"group_id": "pair", "rollouts": rollouts("p", 1.0, 0.0)}],
    "advantage": {"estimator": "grpo", "output": "scalar"}}


@pytest.fixture(scope="module")
def result() -> Iterator[dict[str, Any]]:
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as client:
        resp = client.post("/v1/advantages", json=BODY)
    assert resp.status_code == 200, resp.text
    ScoreResponse.model_validate(resp.json())
    yield resp.json()


def diagnostics(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["group_id"]: g["diagnostics"] for g in result["groups"]}


def test_a_group_with_every_rollout_excluded_is_not_a_singleton(result: dict[str, Any]) -> None:
    assert diagnostics(result)["none"] == {
        "zero_spread": False, "filtered": False, "singleton": False, "baseline_size": 0,
        "excluded": ["n0", "n1"], "reward_mean": None, "reward_std": None}
    [n0, n1] = result["groups"][0]["rollouts"]
    assert (n0["excluded"], n0["advantages"], n1["excluded"], n1["advantages"]) == (
        True, 0.0, True, 0.0)


def test_one_rollout_in_the_baseline_is_a_singleton(result: dict[str, Any]) -> None:
    diag = diagnostics(result)
    assert diag["lone"] == {
        "zero_spread": False, "filtered": False, "singleton": True, "baseline_size": 1,
        "excluded": [], "reward_mean": 1.0, "reward_std": None}
    assert diag["half"] == {
        "zero_spread": False, "filtered": False, "singleton": True, "baseline_size": 1,
        "excluded": ["h1"], "reward_mean": 1.0, "reward_std": None}
    assert diag["pair"]["singleton"] is False and diag["pair"]["baseline_size"] == 2


def test_the_summary_counts_singletons_only(result: dict[str, Any]) -> None:
    s = result["summary"]
    assert (s["groups"], s["singleton_groups"], s["excluded_rollouts"], s["failed_cells"]) == (
        4, 2, 3, 3)
    pair = [r["advantages"] for r in result["groups"][3]["rollouts"]]
    assert pair == pytest.approx([0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)],
                                 rel=1e-12)
