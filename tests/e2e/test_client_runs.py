"""The Python client's run-record methods against a real server: a run scored through the
client is listed, summarised and paged back through it, blocking and async alike."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from rewardd_client import AsyncRewarddClient, NotFound, RewarddClient

pytestmark = pytest.mark.e2e
GUARD_S = 120.0
"""The record is written off the request path: a guard against a hang, not a bound."""


def batch(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "step": 2, "rewards": [{"name": "m", "verifier": "math"}],
            "groups": [{"group_id": "g/1", "source": "gsm8k", "reference": {"answer": "4"},
                        "rollouts": [{"rollout_id": "right", "completion": "\\boxed{4}"},
                                     {"rollout_id": "wrong", "completion": "\\boxed{5}"}]}]}


def test_a_run_scored_through_the_client_is_read_back_through_it(server: str) -> None:
    run_id = f"client:{uuid.uuid4().hex[:8]}"
    with RewarddClient(server) as client:
        client.rewards(batch(run_id))
        deadline = time.monotonic() + GUARD_S
        while True:
            try:
                view = client.run(run_id)
                if view["record"]["rollouts"] == 2:
                    break
            except NotFound:
                pass
            assert time.monotonic() < deadline, "the run was never recorded"
            time.sleep(0.1)
        assert view["steps"][0]["sources"] == {"gsm8k": 2}
        assert run_id in [r["run_id"] for r in client.runs()["runs"]]
        wrong = client.run_rollouts(run_id, outcome="ok", q="boxed{5}")
        assert [r["rollout_id"] for r in wrong["rollouts"]] == ["wrong"]
        assert wrong["rollouts"][0]["verdicts"]["m"]["reward"] == 0.0
        first = client.run_rollouts(run_id, limit=1)
        second = client.run_rollouts(run_id, limit=1, cursor=first["next_cursor"])
        assert [r["rollout_id"] for r in first["rollouts"] + second["rollouts"]] == [
            "right", "wrong"]
        assert second["next_cursor"] is None
        with pytest.raises(NotFound):
            client.run_rollouts(f"{run_id}-never")


async def test_the_async_client_reads_the_same_record(server: str) -> None:
    run_id = f"async-{uuid.uuid4().hex[:8]}"
    async with AsyncRewarddClient(server) as client:
        await client.rewards(batch(run_id))
        deadline = time.monotonic() + GUARD_S
        while True:
            try:
                page = await client.run_rollouts(run_id, component="m", outcome="failed")
                listed = await client.run_rollouts(run_id)
                if len(listed["rollouts"]) == 2:
                    break
            except NotFound:
                pass
            assert time.monotonic() < deadline, "the run was never recorded"
            await asyncio.sleep(0.1)
        assert page["rollouts"] == []
        assert (await client.run(run_id, steps=0))["steps"] == []


def test_the_client_replays_a_run_and_reads_the_flips(server: str) -> None:
    run_id = f"replay-{uuid.uuid4().hex[:8]}"
    body = batch(run_id)
    body["groups"][0]["rollouts"].append({"rollout_id": "prose",
                                          "completion": "The answer is 4."})
    with RewarddClient(server) as client:
        client.rewards(body)
        deadline = time.monotonic() + GUARD_S
        while True:
            try:
                if client.run(run_id)["record"]["rollouts"] == 3:
                    break
            except NotFound:
                pass
            assert time.monotonic() < deadline, "the run was never recorded"
            time.sleep(0.1)
        job = client.reverify(run_id, steps=(2, 2), set={"m.extract": "boxed"})
        result = client.result(job["id"])
        assert [(f["rollout_id"], f["before"], f["after"]) for f in result["flips"]] == [
            ("prose", 1.0, 0.0)]
        assert result["summary"]["rescored"] == 3
