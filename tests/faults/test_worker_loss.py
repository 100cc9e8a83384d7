"""A whole worker pod (main process and children) SIGKILLed mid-batch, restarted 1 s later,
and one child of the other worker SIGKILLed too: the batch completes with every reward right.
The lost pod's tasks come back within seconds (its heartbeat expires, a reaper requeues
them), not after the 900 s visibility timeout; the lost child's task is requeued by Celery at
once (reject on worker lost). Idempotent tasks mean a rerun changes nothing.
(Moved here from tests/integration/test_worker_loss.py, which waited out a visibility
timeout.)"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
import redis

from rewardd.service import pipeline
from rewardd.workers.distributed import CeleryExecutor
from tests.faults.batches import assert_every_reward_right, sleepy_batch
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.faults

GROUPS, SLEEP_S = 24, 0.5


async def wait_until_both_hold_tasks(client: redis.Redis, run: asyncio.Task,
                                     timeout_s: float) -> None:
    """Three or more unacknowledged messages: with prefetch one per child, both workers
    (two children each) hold calls."""
    deadline = time.monotonic() + timeout_s
    while client.hlen("unacked") < 3:
        assert not run.done(), f"the batch ended before both workers were busy: {run}"
        assert time.monotonic() < deadline, "the workers never held 3 calls at once"
        await asyncio.sleep(0.02)


async def test_a_worker_pod_killed_mid_batch_costs_seconds_not_the_visibility_timeout(
        fleet: Any, redis_server: RedisServer) -> None:
    settings, workers = fleet(visibility_timeout_s=900.0, max_verifier_timeout_s=5.0, verifier_timeout_s=5.0,
                              dispatch_window=0)
    doomed, survivor = workers.start(2, concurrency=2)
    client = redis.Redis.from_url(redis_server.url())
    executor = CeleryExecutor(settings)
    try:
        started = time.monotonic()
        run = asyncio.create_task(pipeline.rewards(sleepy_batch(GROUPS, SLEEP_S), executor,
                                                   settings))
        await wait_until_both_hold_tasks(client, run, timeout_s=60)
        doomed.kill()
        killed = time.monotonic()
        children = survivor.children()
        assert children, survivor.output()
        os.kill(children[0], signal.SIGKILL)
        await asyncio.sleep(1.0)
        restart = asyncio.get_running_loop().run_in_executor(None, workers.start, 1, "cpu", 2)
        result = await asyncio.wait_for(run, timeout=120)
        after_kill = time.monotonic() - killed
        await restart
    finally:
        executor.close()
    assert_every_reward_right(result, GROUPS)
    # all the work (24 sleeps of 0.5 s) on the survivor's 2 slots is 6 s; the bound is the
    # tasks' own run time + 60 s (generous for a busy machine), far from the 900 s visibility
    # timeout that would bring the lost calls back without the reaper
    assert after_kill < GROUPS * SLEEP_S / 2 + 60.0, after_kill
    assert survivor.proc.poll() is None, survivor.output()
    assert client.hlen("unacked") == 0
    print(f"batch {time.monotonic() - started:.1f} s, {after_kill:.1f} s after the kill")
