"""Fair scheduling in the embedded executor: real pebble workers, orders and counts only.

What pebble is handed is recorded by wrapping the pool's ``schedule`` (pebble runs its tasks
first come, first served and the executor hands it at most the fair queue's capacity at once, so the
order of ``schedule`` calls is the order the calls start). Waits are bounds against hangs,
never measurements.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

import tests.plugins.faulty  # noqa: F401 - registers the test verifiers in this process
from rewardd.verifiers.base import Sample
from rewardd.workers.embedded import (CHUNK_SAMPLES, IN_PEBBLE_PER_WORKER, IN_PEBBLE_S_PER_WORKER,
                                      EmbeddedExecutor)
from rewardd.workers.executor import VerifyCall
from rewardd.workers.fairness import flow
from tests.support.jobs import wait_until

PLUGINS = ("tests.plugins.faulty",)
HANG_S = 120.0


@pytest.fixture
def executor() -> Iterator[EmbeddedExecutor]:
    pool = EmbeddedExecutor(2, PLUGINS)
    assert asyncio.run(pool.ready(wait_s=120.0))
    yield pool
    pool.close()


def record(executor: EmbeddedExecutor) -> list[str]:
    """The first completion of every call handed to pebble, in order."""
    started: list[str] = []
    pool = executor._pool
    schedule = pool.schedule

    def spy(function: Any, args: Any = (), **kwargs: Any) -> Any:
        started.append(args[0].call.samples[0].completion)
        return schedule(function, args=args, **kwargs)

    pool.schedule = spy  # type: ignore[method-assign]
    return started


def sleeper(name: str, seconds: float = 0.1) -> VerifyCall:
    """One sample that sleeps ``seconds``."""
    return VerifyCall("test_sleep", (Sample(name),), {}, {"seconds": seconds}, 10.0)


def chunk(name: str, seconds: float = 0.1) -> VerifyCall:
    """A full chunk (64 samples): the first sleeps ``seconds``, the others are echoed."""
    return VerifyCall("test_sleep", (Sample(name),) + (Sample("1"),) * (CHUNK_SAMPLES - 1),
                      {}, {"when": [name], "seconds": seconds}, 10.0)


def test_a_small_request_starts_before_most_of_a_big_ones_calls(
        executor: EmbeddedExecutor) -> None:
    started = record(executor)
    capacity = executor._fair.capacity
    # 2 chunks in pebble: before any estimate a check counts its share of 64 per worker
    assert capacity == 2 * IN_PEBBLE_S_PER_WORKER == 2 * executor._units(chunk("x"))
    assert IN_PEBBLE_PER_WORKER == CHUNK_SAMPLES

    async def main() -> tuple[list[Any], list[Any]]:
        with flow("t1"):
            big = asyncio.create_task(executor.run([chunk(f"a{i}") for i in range(40)]))
        await wait_until(lambda: executor._fair.waiting == 38, "the queue to fill")
        with flow("t2"):
            small = await asyncio.wait_for(
                executor.run([sleeper("b0"), sleeper("b1")]), HANG_S)
        return small, await asyncio.wait_for(big, HANG_S)

    small, big = asyncio.run(main())
    assert [item.outcome.reward for result in small for item in result.items] == [1.0, 1.0]
    assert [result.items[0].outcome.reward for result in big] == [1.0] * 40
    assert sorted(started) == sorted([f"a{i}" for i in range(40)] + ["b0", "b1"])
    # A's tags: 0 and 64 admitted (V = 64), a2 at 128; b0, b1 at 64, 65: both go before a2,
    # as soon as one chunk of A frees room. Generous: a few more of A may have been
    # admitted between the check above and B's arrival on a stalled machine.
    b0 = started.index("b0")
    assert started.index("b1") == b0 + 1
    assert b0 <= 6 and sum(1 for name in started[b0:] if name.startswith("a")) >= 34
    assert executor.describe()["fair_queue"] == {"waiting_calls": 0, "waiting_flows": 0,
                                                 "running_calls": 0, "in_use": 0,
                                                 "capacity": capacity}


def test_without_a_flow_calls_are_one_default_flow_in_arrival_order(
        executor: EmbeddedExecutor) -> None:
    started = record(executor)

    async def main() -> None:
        first = asyncio.create_task(executor.run([chunk(f"a{i}") for i in range(12)]))
        await wait_until(lambda: executor._fair.waiting == 10, "the queue to fill")
        await asyncio.wait_for(executor.run([sleeper("b0")]), HANG_S)
        await asyncio.wait_for(first, HANG_S)

    asyncio.run(main())
    assert started == [f"a{i}" for i in range(12)] + ["b0"]


def test_a_big_call_runs_as_chunks_and_its_results_come_back_in_order(
        executor: EmbeddedExecutor) -> None:
    started = record(executor)
    completions = tuple(Sample(str(i)) for i in range(1000))
    call = VerifyCall("test_echo", completions, {}, {}, 10.0)
    [result] = asyncio.run(asyncio.wait_for(executor.run([call]), HANG_S))
    assert [item.outcome.reward for item in result.items] == [float(i) for i in range(1000)]
    assert not result.replayed
    assert CHUNK_SAMPLES == 64
    assert started == [str(i) for i in range(0, 1000, 64)]  # 16 tasks: 15 of 64, one of 40


def test_a_killed_chunk_is_replayed_alone_and_only_its_culprit_fails(
        executor: EmbeddedExecutor) -> None:
    completions = tuple(Sample(str(i)) for i in range(100))
    call = VerifyCall("test_block", completions, {}, {"when": ["70"], "seconds": 60.0}, 0.2)
    [result] = asyncio.run(asyncio.wait_for(executor.run([call]), HANG_S))
    errors = [i for i, item in enumerate(result.items) if item.outcome.error is not None]
    assert errors == [70] and result.items[70].outcome.error.value == "timeout"
    assert [item.outcome.reward for i, item in enumerate(result.items) if i != 70] == \
        [float(i) for i in range(100) if i != 70]
    assert result.replayed


def test_cancelled_requests_leave_the_queue_empty_and_the_capacity_whole(
        executor: EmbeddedExecutor) -> None:
    async def main() -> list[Any]:
        for round_ in range(30):
            with flow("t1"):
                task = asyncio.create_task(executor.run(  # 2 chunks in pebble, 6 wait
                    [chunk(f"r{round_}-{i}", 0.05) for i in range(8)]))
            for _ in range(round_ % 4):  # cancelled at different points
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await wait_until(lambda: executor._fair.running == 0, "pebble to settle")
        return await asyncio.wait_for(executor.run([sleeper(f"after{i}", 0.0)
                                                    for i in range(4)]), HANG_S)

    after = asyncio.run(main())
    assert [item.outcome.reward for result in after for item in result.items] == [1.0] * 4
    assert executor.describe()["fair_queue"] == {"waiting_calls": 0, "waiting_flows": 0,
                                                 "running_calls": 0, "in_use": 0,
                                                 "capacity": executor._fair.capacity}
    assert executor._pending == {} and executor._fair._active == {}


def test_close_settles_the_waiting_calls_unavailable(executor: EmbeddedExecutor) -> None:
    async def main() -> list[Any]:
        task = asyncio.create_task(executor.run([chunk(f"a{i}", 30.0) for i in range(12)]))
        await wait_until(lambda: executor._fair.waiting == 10, "the queue to fill")
        executor.close()
        return await asyncio.wait_for(task, HANG_S)

    results = asyncio.run(main())
    assert [r.items[0].outcome.error.value for r in results] == ["unavailable"] * 12
    assert all(item.outcome.error.value == "unavailable" for r in results for item in r.items)
    assert executor._fair.waiting == 0


def test_slow_checks_wait_in_the_fair_queue_where_an_urgent_call_overtakes_them(
        executor: EmbeddedExecutor) -> None:
    """Once the executor has seen a verifier's checks take 0.1 s, pebble gets one such call
    per worker (the floor; 2 x 0.1 s is over the 2 x 25 ms capacity) and the rest wait in the
    fair queue, so the session's urgent call starts next, not behind its bulk."""
    async def main() -> tuple[list[Any], list[Any]]:
        await asyncio.wait_for(executor.run([sleeper("learn0"), sleeper("learn1")]), HANG_S)
        assert executor._units(sleeper("x")) >= 0.09
        started.clear()
        with flow("t1", "session-1"):
            bulk = asyncio.create_task(executor.run([sleeper(f"a{i}", 0.5)
                                                     for i in range(10)]))
        await wait_until(lambda: executor._fair.waiting == 8, "the queue to fill")
        with flow("t1", "session-1", urgent=True, group="q0"):
            urgent = await asyncio.wait_for(executor.run([sleeper("u")]), HANG_S)
        return urgent, await asyncio.wait_for(bulk, HANG_S)

    started = record(executor)
    urgent, bulk = asyncio.run(main())
    assert [r.items[0].outcome.reward for r in urgent + bulk] == [1.0] * 11
    assert started[:2] == ["a0", "a1"] and started[2] == "u", started
    assert executor.describe()["fair_queue"]["in_use"] == 0
