"""Redis restarted mid-batch, with and without persistence: the batch completes with every
reward right. Without persistence the queued tasks vanish with Redis; the API notices that
Redis lost its data (the epoch marker is gone) and publishes again every task it still awaits
that no live worker holds. With AOF (everysec) nothing is lost and nothing is sent again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from rewardd.service import pipeline
from rewardd.workers import metrics
from rewardd.workers.distributed import CeleryExecutor
from tests.faults.batches import assert_every_reward_right, sleepy_batch
from tests.faults.test_worker_loss import wait_until_both_hold_tasks
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.faults

GROUPS, SLEEP_S = 24, 0.5


def republished() -> float:
    return metrics.TASK_RETRIES.labels("cpu", "republished")._value.get()


@pytest.mark.parametrize("redis_server", [False, True], ids=["no-persistence", "aof"],
                         indirect=True)
async def test_a_redis_restart_mid_batch_loses_no_reward(fleet: Any,
                                                        redis_server: RedisServer) -> None:
    settings, workers = fleet(max_verifier_timeout_s=5.0, verifier_timeout_s=5.0,
                              dispatch_window=0)
    workers.start(2, concurrency=2)
    client = redis.Redis.from_url(redis_server.url())
    executor = CeleryExecutor(settings)
    before = republished()
    try:
        assert await executor.ready(wait_s=10)
        run = asyncio.create_task(pipeline.rewards(sleepy_batch(GROUPS, SLEEP_S), executor,
                                                   settings))
        await wait_until_both_hold_tasks(client, run, timeout_s=60)
        queued = sum(client.llen(key) for key in client.scan_iter("cpu*"))
        restarted = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, redis_server.restart, 0.5)
        result = await asyncio.wait_for(run, timeout=150)
        after = time.monotonic() - restarted
    finally:
        executor.close()
    assert_every_reward_right(result, GROUPS)
    assert queued > 0  # there was something in the queue to lose
    sent_again = republished() - before
    if redis_server.aof:
        # nothing queued is lost; at most a message each worker was popping from its queue
        # as the connection broke (gone from the list, not yet recorded as unacked)
        assert sent_again <= 2, sent_again
    else:
        # what was queued is gone with Redis and sent again (less what a slot took from the
        # queue between the count and the kill: 4 slots)
        assert sent_again >= queued - 4, (sent_again, queued)
    # the work itself is 6 s on 4 slots; the wait before republishing is
    # REWARDD_WORKER_LOST_AFTER_S (6 s), workers reconnect within seconds
    assert after < GROUPS * SLEEP_S / 2 + 60.0, after  # generous for a busy machine
    print(f"{'aof' if redis_server.aof else 'no persistence'}: {after:.1f} s after the "
          f"restart, {sent_again:g} task(s) sent again")
