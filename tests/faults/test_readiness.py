"""Readiness from heartbeats: /readyz answers at once while a long batch fills the queue
(no ping task waits behind user work), names the queue that lacks a consumer, and a call for
a queue nobody consumes fails fast as ``unavailable`` instead of waiting for the queue
timeout."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rewardd.service import pipeline
from rewardd.verifiers.base import Sample
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.executor import VerifyCall
from tests.faults.batches import assert_every_reward_right, sleepy_batch

pytestmark = pytest.mark.faults


async def test_ready_during_a_long_batch_and_says_which_queue_has_no_consumer(
        fleet: Any) -> None:
    settings, workers = fleet(max_verifier_timeout_s=5.0, verifier_timeout_s=5.0,
                              dispatch_window=0, queue_routes="test_block=sandbox",
                              no_consumer_grace_s=2.0, ready_queues="cpu,sandbox")
    workers.start(1, concurrency=1)
    executor = CeleryExecutor(settings)
    try:
        # sandbox is required here and nobody consumes it: not ready, and the reason says so
        assert await executor.ready(wait_s=10) is False
        assert "'sandbox'" in executor.not_ready_reason()
        body = executor.describe()
        assert body["consumers_by_queue"]["cpu"] == 1
        assert body["queues_without_consumer"] == ["sandbox", "gpu"]

        # a batch of 20 s of work on one slot: readiness does not wait behind it
        executor.settings = settings.model_copy(update={"ready_queues": "cpu"})
        run = asyncio.create_task(pipeline.rewards(sleepy_batch(20, 1.0), executor, settings))
        await asyncio.sleep(2.0)
        for _ in range(3):
            started = time.monotonic()
            assert await executor.ready(wait_s=5) is True
            assert time.monotonic() - started < 5  # from heartbeats, not its whole wait
            await asyncio.sleep(0.5)
        assert not run.done()

        # a call for the unserved queue fails within the grace plus a heartbeat or two
        started = time.monotonic()
        call = VerifyCall("test_block", (Sample("x"), Sample("y")), {}, {"seconds": 0.1}, 1.0)
        [result] = await asyncio.wait_for(executor.run([call]), timeout=90)
        took = time.monotonic() - started
        assert [i.outcome.error.value for i in result.items] == ["unavailable"] * 2
        message = result.items[0].outcome.detail["message"]
        assert "no live worker consumes queue 'sandbox'" in message, message
        # the grace and a few heartbeats (about 3 s), far inside the queue timeout (3600 s);
        # generous for a busy machine
        assert took < settings.no_consumer_grace_s + 30.0, took
        run.cancel()
    finally:
        executor.close()


async def test_a_batch_still_completes_under_the_watchdog(fleet: Any) -> None:
    """The watchdog's reaper never requeues a live worker's long task (its heartbeat holds
    it): tasks longer than REWARDD_WORKER_LOST_AFTER_S run once and settle right."""
    settings, workers = fleet(max_verifier_timeout_s=10.0, verifier_timeout_s=10.0,
                              worker_heartbeat_s=0.5, worker_lost_after_s=1.5)
    [worker] = workers.start(1, concurrency=2)
    executor = CeleryExecutor(settings)
    try:
        result = await asyncio.wait_for(
            pipeline.rewards(sleepy_batch(4, 2.5), executor, settings), timeout=60)
    finally:
        executor.close()
    assert_every_reward_right(result, 4)
    assert worker.output().count("succeeded in") == 4, worker.output()[-3000:]
