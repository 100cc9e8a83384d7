"""A whole worker pod (main process and children) SIGKILLed mid-batch, restarted 1 s later,
and one child of the other worker SIGKILLed too: the batch completes with every reward right.
The lost pod's tasks come back within seconds (its heartbeat expires, a reaper requeues
them), not after the 900 s visibility timeout; the lost child's task is requeued by Celery at
once (reject on worker lost); a message the pod had popped but not yet recorded unacked
is published again by the API once the pod's heartbeat stops (the second test plays that
moment exactly). Idempotent tasks mean a rerun changes nothing.
(Moved here from tests/integration/test_worker_loss.py, which waited out a visibility
timeout.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import pytest
import redis

from rewardd.service import pipeline
from rewardd.workers import liveness, metrics
from rewardd.workers.distributed import CeleryExecutor
from tests.faults.batches import assert_every_reward_right, sleepy_batch
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.faults

GROUPS, SLEEP_S = 24, 0.5
HANG_GUARD_S = 240.0
"""Only a guard against a hang (every wait in these tests is seconds): far below the 900 s
visibility timeout and the 3600 s queue timeout that would end one otherwise."""


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
        # finishing inside the guard (240 s) is finishing before the 900 s visibility timeout
        # could bring the lost calls back: the reaper and the API's audit did
        done, _ = await asyncio.wait({run}, timeout=HANG_GUARD_S)
        assert done, (f"the batch hung; awaited tasks: {list(executor.collector.waiters)}, "
                      f"unacked: {client.hlen('unacked')}, queued: {client.llen('cpu')}")
        result = run.result()
        after_kill = time.monotonic() - killed
        await restart
    finally:
        executor.close()
    assert_every_reward_right(result, GROUPS)
    assert survivor.proc.poll() is None, survivor.output()
    assert client.hlen("unacked") == 0
    print(f"batch {time.monotonic() - started:.1f} s, {after_kill:.1f} s after the kill")


def republished() -> float:
    return metrics.TASK_RETRIES.labels("cpu", "republished")._value.get()


async def test_a_message_taken_by_a_worker_that_died_before_recording_it_is_published_again(
        fleet: Any, redis_server: RedisServer) -> None:
    """A worker's BRPOP removes a message from its queue before kombu records it unacked (the
    next Redis command); a worker SIGKILLed between the two took the message with it, and no
    reaper can see it. The API notices the worker's heartbeat stop and publishes again every
    awaited task that is nowhere in Redis (no queue, not unacked, no result), instead of
    waiting REWARDD_QUEUE_TIMEOUT_S for it. The dying worker is played by a Redis client:
    one heartbeat, one pop, silence."""
    settings, workers = fleet(queue_timeout_s=3600.0, worker_heartbeat_s=0.5,
                              worker_lost_after_s=2.0, dispatch_window=0)
    client = redis.Redis.from_url(redis_server.url())
    liveness.beat(client, "dying@pod", ["cpu"], 2, {}, ttl_s=HANG_GUARD_S)
    executor = CeleryExecutor(settings)
    before = republished()
    try:
        run = asyncio.create_task(pipeline.rewards(sleepy_batch(4, 0.0), executor, settings))
        deadline = time.monotonic() + HANG_GUARD_S
        while client.llen("cpu") < 4 or "dying@pod" not in executor.watchdog.live_workers():
            assert not run.done(), run
            assert time.monotonic() < deadline, (client.llen("cpu"),
                                                 executor.watchdog.live_workers())
            await asyncio.sleep(0.02)
        taken = json.loads(client.rpop("cpu"))["headers"]["id"]
        # and the worker dies: its last heartbeat expires REWARDD_WORKER_LOST_AFTER_S later
        client.pexpire(liveness.worker_key("dying@pod"), int(settings.worker_lost_after_s * 1000))
        workers.start(1, concurrency=2)
        done, _ = await asyncio.wait({run}, timeout=HANG_GUARD_S)
        assert done, (f"task {taken} taken by the dead worker was never published again; "
                      f"awaited: {list(executor.collector.waiters)}")
        result = run.result()
    finally:
        executor.close()
    assert_every_reward_right(result, 4)
    assert republished() - before == 1
    assert client.hlen("unacked") == 0
