"""Fair scheduling in the Celery executor: real Redis (database 5), a real ``rewardd worker``.

One worker with one slot and a window of 2 tasks: a big request's tasks wait in the API's
fair queue, so a small request that arrives later is published (and started: the broker's
list is first in, first out and one slot takes one task at a time) after at most the window.
Orders and counts only; waits are bounds against hangs.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest
import redis

import tests.plugins.faulty  # noqa: F401 - registers test_sleep here too
from rewardd.verifiers.base import Sample
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.executor import VerifyCall
from rewardd.workers.fairness import flow
from tests.support.jobs import wait_until
from tests.integration.conftest import (PLUGINS, REDIS_HOST, REDIS_PORT, WorkerFleet,
                                        worker_env)
from rewardd.service.settings import Settings

DB = 5
BROKER = f"redis://{REDIS_HOST}:{REDIS_PORT}/{DB}"
WINDOW = 2
HANG_S = 120.0


def settings(**overrides: Any) -> Settings:
    return Settings(**{"broker_url": BROKER, "plugins": PLUGINS, "result_ttl_s": 300,
                       "task_max_samples": 1, "dispatch_window": WINDOW, **overrides})


@pytest.fixture(scope="module")
def db() -> Iterator[redis.Redis]:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=DB)
    client.flushdb()
    fleet = WorkerFleet(worker_env(settings()))
    fleet.start(1, concurrency=1)
    yield client
    fleet.stop()
    client.flushdb()


@pytest.fixture
def executor(db: redis.Redis) -> Iterator[CeleryExecutor]:
    ex = CeleryExecutor(settings())
    yield ex
    ex.close()


def sleeper(name: str, seconds: float = 0.2) -> VerifyCall:
    return VerifyCall("test_sleep", (Sample(name),), {}, {"seconds": seconds}, 10.0)


def spy(executor: CeleryExecutor) -> list[str]:
    """The first completion of every task published, in order."""
    published: list[str] = []
    real = executor.publisher.publish

    def publish(jobs: list[tuple[str, Any]], flows: Any = None) -> dict[str, Exception]:
        published.extend(pack.samples[0].completion for _, pack in jobs)
        return real(jobs, flows)

    executor.publisher.publish = publish  # type: ignore[method-assign]
    return published


def waiting(executor: CeleryExecutor) -> int:
    fair = executor.publisher._fair.get("cpu")
    return fair.waiting if fair is not None else 0


def test_a_small_request_is_published_before_most_of_a_big_ones_tasks(
        executor: CeleryExecutor, db: redis.Redis) -> None:
    published = spy(executor)
    peak = {"waiters": 0, "broker": 0}

    async def watch() -> None:
        while True:
            peak["waiters"] = max(peak["waiters"], len(executor.collector.waiters))
            peak["broker"] = max(peak["broker"], int(db.llen("cpu")))
            await asyncio.sleep(0.005)

    async def main() -> tuple[int, list[Any], list[Any]]:
        watcher = asyncio.create_task(watch())
        with flow("t1"):
            big = asyncio.create_task(executor.run([sleeper(f"a{i}") for i in range(20)]))
        await wait_until(lambda: waiting(executor) == 18, "the queue to fill")
        before = len(published) + len(executor.publisher._outbox)
        with flow("t2"):
            small = await asyncio.wait_for(executor.run([sleeper("b0"), sleeper("b1")]),
                                           HANG_S)
        done = await asyncio.wait_for(big, HANG_S)
        watcher.cancel()
        return before, small, done

    before, small, big = asyncio.run(main())
    assert [item.outcome.reward for result in small for item in result.items] == [1.0, 1.0]
    assert [result.items[0].outcome.reward for result in big] == [1.0] * 20
    assert sorted(published) == sorted([f"a{i}" for i in range(20)] + ["b0", "b1"])
    # b0 goes next; b1 ties with A's next task, which arrived first
    b0, b1 = published.index("b0"), published.index("b1")
    assert b0 <= before + 1 and b1 == b0 + 2, published
    assert sum(1 for name in published[b1:] if name.startswith("a")) >= 14
    assert peak["waiters"] == WINDOW  # the window was used, never exceeded
    assert peak["broker"] <= WINDOW
    stats = executor.describe()["fair_queue"]["cpu"]
    assert stats == {"waiting_calls": 0, "waiting_flows": 0, "running_calls": 0, "in_use": 0,
                     "capacity": WINDOW}


def test_cancelled_requests_leave_the_window_whole(executor: CeleryExecutor) -> None:
    async def main() -> list[Any]:
        for round_ in range(12):
            with flow("t1"):
                task = asyncio.create_task(executor.run(
                    [sleeper(f"r{round_}-{i}", 0.05) for i in range(6)]))
            for _ in range(round_ % 3):  # cancelled at different points
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            fair = executor.publisher._fair.get("cpu")  # None: cancelled before it started
            assert fair is None or (fair.waiting, fair.running) == (0, 0)  # at once
        return await asyncio.wait_for(executor.run([sleeper(f"after{i}", 0.0)
                                                    for i in range(4)]), HANG_S)

    after = asyncio.run(main())
    assert [result.items[0].outcome.reward for result in after] == [1.0] * 4
    assert executor.publisher._fair["cpu"].stats() == {"waiting_calls": 0, "waiting_flows": 0,
                                                       "running_calls": 0, "in_use": 0,
                                                       "capacity": WINDOW}
    assert executor.publisher._outbox == [] and executor.publisher._fair["cpu"]._active == {}


def test_close_settles_the_waiting_tasks_unavailable(executor: CeleryExecutor) -> None:
    async def main() -> list[Any]:
        task = asyncio.create_task(executor.run([sleeper(f"c{i}", 5.0) for i in range(6)]))
        await wait_until(lambda: waiting(executor) == 4, "the queue to fill")
        executor.close()
        return await asyncio.wait_for(task, HANG_S)

    results = asyncio.run(main())
    assert [r.items[0].outcome.error.value for r in results] == ["unavailable"] * 6


def test_the_default_window_follows_the_census(db: redis.Redis) -> None:
    ex = CeleryExecutor(settings(dispatch_window=None))
    try:
        assert ex.publisher.window("cpu") == 8  # no census yet
        asyncio.run(ex.census())
        assert ex.slots_by_queue() == {"cpu": 1}
        assert ex.publisher.window("cpu") == 2  # 2 per worker slot
        assert CeleryExecutor(settings(dispatch_window=0)).publisher.window("cpu") == 0
    finally:
        ex.close()
