"""The Celery executor as the composition of its parts (:mod:`rewardd.workers.distributed`),
without a broker: settings replaced on the executor reach every part, /readyz's description
gathers what each part knows, and closing settles every call (waiting or published)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

import pytest

from rewardd.service.settings import Settings
from rewardd.verifiers.base import Sample
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.executor import VerifyCall
from rewardd.workers.liveness import FleetView
from tests.support.celery_parts import DEAD_BROKER
from tests.support.jobs import wait_until


@pytest.fixture
def executor() -> Iterator[CeleryExecutor]:
    made = CeleryExecutor(Settings(broker_url=DEAD_BROKER, dispatch_window=1))
    made.publisher.publish = lambda jobs, flows=None: {}  # type: ignore[method-assign]
    made.app.control.revoke = lambda task_ids: None  # type: ignore[method-assign]
    yield made
    made.close()


def call(name: str) -> VerifyCall:
    return VerifyCall("math", (Sample(name),), {"answer": "1"}, {}, 1.0)


def test_settings_replaced_on_the_executor_reach_every_part(executor: CeleryExecutor) -> None:
    narrowed = executor.settings.model_copy(update={"ready_queues": "gpu"})
    executor.settings = narrowed
    assert all(part.settings is narrowed for part in (
        executor.collector, executor.fleet_census, executor.publisher, executor.watchdog))
    executor.watchdog._view = FleetView(time.monotonic(), None, {"cpu": 1})
    assert executor.not_ready_reason().startswith("no live worker consumes queue 'gpu'")


async def test_the_description_gathers_every_part(executor: CeleryExecutor) -> None:
    body = executor.describe()
    assert body == {"kind": "celery", "broker": DEAD_BROKER, "result_backend": DEAD_BROKER,
                    "queues": ["cpu", "sandbox", "gpu"], "pending_calls": 0,
                    "fair_queue": {}, "workers": None}
    run = asyncio.create_task(executor.run([call("a"), call("b")]))
    await wait_until(lambda: len(executor.collector.waiters) == 1, "the window's task")
    executor.fleet_census._report = {"workers": 1, "workers_by_queue": {"cpu": 1},
                                     "slots_by_queue": {"cpu": 2}}
    executor.fleet_census._taken_at = time.monotonic()
    executor.watchdog._view = FleetView(time.monotonic(), None, {"cpu": 1})
    body = executor.describe()
    assert list(body) == ["kind", "broker", "result_backend", "queues", "pending_calls",
                          "fair_queue", "workers", "workers_by_queue", "slots_by_queue",
                          "census_age_s", "consumers_by_queue", "queues_without_consumer",
                          "heartbeat_age_s"]
    assert body["pending_calls"] == 1 and body["workers"] == 1
    assert body["fair_queue"]["cpu"]["waiting_calls"] == 1
    assert body["queues_without_consumer"] == ["sandbox", "gpu"]
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_closing_in_the_loop_settles_waiting_and_published_calls(
        executor: CeleryExecutor) -> None:
    run = asyncio.create_task(executor.run([call(f"c{i}") for i in range(3)]))
    await wait_until(lambda: len(executor.collector.waiters) == 1, "the window's task")
    executor.close()
    results = await asyncio.wait_for(run, 30)
    messages = [r.items[0].outcome.detail["message"] for r in results]
    assert messages == ["executor closed"] + ["executor closed (the server is shutting "
                                              "down)"] * 2
    assert await executor.ready() is False
    [late] = await executor.run([call("late")])
    assert late.items[0].outcome.detail["message"] == "executor closed"


def test_closing_from_another_thread_settles_through_the_loop(executor: CeleryExecutor) -> None:
    async def main() -> list[Any]:
        run = asyncio.create_task(executor.run([call(f"c{i}") for i in range(2)]))
        await wait_until(lambda: len(executor.collector.waiters) == 1, "the window's task")
        await asyncio.get_running_loop().run_in_executor(None, executor.close)
        return await asyncio.wait_for(run, 30)

    results = asyncio.run(main())
    assert [r.items[0].outcome.error.value for r in results] == ["unavailable"] * 2
