"""The batch the fault tests run: groups of a sleeper and an echo of the group's number, so
every reward says which call it came from and a lost or doubled call shows."""

from __future__ import annotations

from typing import Any

import tests.plugins.faulty  # noqa: F401 - registers test_sleep here too (request validation)
from rewardd.service.models import RewardsRequest


def sleepy_batch(groups: int, sleep_s: float, verifier: str = "test_sleep") -> RewardsRequest:
    return RewardsRequest.model_validate({
        "rewards": [{"name": "r", "verifier": verifier, "timeout_s": max(1.0, 4 * sleep_s),
                     "params": {"seconds": sleep_s, "when": ["sleep"]}}],
        "groups": [{"group_id": f"g{i}", "rollouts": [
            {"rollout_id": f"g{i}-a", "completion": "sleep"},
            {"rollout_id": f"g{i}-b", "completion": str(i)}]} for i in range(groups)],
    })


def assert_every_reward_right(result: dict[str, Any], groups: int) -> None:
    assert result["summary"]["failed_cells"] == 0, result["summary"]
    assert len(result["groups"]) == groups
    for i, group in enumerate(result["groups"]):
        assert [r["rollout_id"] for r in group["rollouts"]] == [f"g{i}-a", f"g{i}-b"]
        assert [r["rewards"]["r"] for r in group["rollouts"]] == [1.0, float(i)], group
