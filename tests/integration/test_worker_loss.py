"""A worker dies mid-batch and the batch still completes, every result present and right.

Two workers of two children each run a batch of short sleeps. Once both hold calls, one
worker is SIGKILLed with its children (a machine lost: its calls stay unacknowledged and the
broker hands them to the other worker after the visibility timeout), and one child of the
other worker is SIGKILLed too (a child lost: Celery requeues its call at once). Late
acknowledgement plus reject-on-worker-lost mean nothing is lost; idempotent tasks mean a
rerun changes nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import redis

import tests.plugins.faulty  # noqa: F401 - registers test_sleep here too (request validation)
from rewardd.service import pipeline
from rewardd.service.models import RewardsRequest
from tests.integration.conftest import make_settings
from rewardd.workers.distributed import CeleryExecutor

# A short visibility timeout so a lost machine's calls come back within seconds; the longest
# task here (a group of two at 1 s each) fits inside it with room to spare.
SETTINGS = make_settings(visibility_timeout_s=6.0, max_verifier_timeout_s=1.0,
                         verifier_timeout_s=1.0)
GROUPS = 24
SLEEP_S = 0.4


def request() -> RewardsRequest:
    """Each group: a sleeper (rewarded 1.0 after SLEEP_S) and an echo of the group's number,
    so every reward says which call it came from."""
    return RewardsRequest.model_validate({
        "rewards": [{"name": "r", "verifier": "test_sleep", "timeout_s": 1.0,
                     "params": {"seconds": SLEEP_S, "when": ["sleep"]}}],
        "groups": [{"group_id": f"g{i}", "rollouts": [
            {"rollout_id": f"g{i}-a", "completion": "sleep"},
            {"rollout_id": f"g{i}-b", "completion": str(i)}]} for i in range(GROUPS)],
    })


async def wait_until_both_workers_are_busy(client: redis.Redis, run: asyncio.Task,
                                           timeout_s: float) -> int:
    """Unacknowledged messages: each worker holds at most two (prefetch one per child), so
    three or more means both hold calls."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.done():
            raise AssertionError(f"the batch ended before both workers were busy: "
                                 f"{run.exception() or run.result()}")
        held = client.hlen("unacked")
        if held >= 3:
            return held
        await asyncio.sleep(0.02)
    raise AssertionError(f"the workers never held 3 calls at once within {timeout_s:g} s")


async def test_a_worker_killed_mid_batch_loses_nothing(fleet_for: Any,
                                                       redis_db: redis.Redis) -> None:
    doomed, survivor = fleet_for(SETTINGS).start(2, concurrency=2)
    executor = CeleryExecutor(SETTINGS)
    try:
        started = time.monotonic()
        run = asyncio.create_task(pipeline.rewards(request(), executor, SETTINGS))
        held = await wait_until_both_workers_are_busy(redis_db, run, timeout_s=60)
        doomed.kill()
        children = survivor.children()
        assert children, survivor.output()
        os.kill(children[0], signal.SIGKILL)
        result = await asyncio.wait_for(run, timeout=120)
        took = time.monotonic() - started
    finally:
        executor.close()
    assert held >= 3
    assert result["summary"]["failed_cells"] == 0, result
    for i, group in enumerate(result["groups"]):
        assert [r["rollout_id"] for r in group["rollouts"]] == [f"g{i}-a", f"g{i}-b"]
        assert [r["rewards"]["r"] for r in group["rollouts"]] == [1.0, float(i)]
        assert all(r["status"]["r"]["ok"] for r in group["rollouts"])
    # the lost machine's calls came back only after the visibility timeout
    assert took >= SETTINGS.visibility_timeout_s * 0.8, took
    assert survivor.proc.poll() is None, survivor.output()
