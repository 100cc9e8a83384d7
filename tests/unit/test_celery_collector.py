"""The Celery executor's result collector (:mod:`rewardd.workers.collector`) without Redis:
every stored result and every marker maps to typed outcomes (or to a replay), a waiter settles
once and never raises, and an unreachable backend settles what waits. The collector against a
real Redis: tests/integration/test_celery_collector.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from rewardd.service.settings import Settings
from rewardd.verifiers.base import Sample
from rewardd.workers.celery_app import create_celery
from rewardd.workers.collector import (DEADLINE_SLACK_S, Expired, ResultCollector,
                                       Unavailable, Waiter, item_mapper, to_items)
from rewardd.workers.executor import VerifyCall
from rewardd.workers.packing import Pack, Part


def pack(samples: int = 1, verifier: str = "math") -> Pack:
    call = VerifyCall(verifier, tuple(Sample(str(i)) for i in range(samples)), {}, {}, 2.0)
    return Pack((Part(0, 0, call),))


def failure(exc_type: str, *message: str) -> dict[str, Any]:
    return {"status": "FAILURE", "result": {"exc_type": exc_type, "exc_message": list(message)}}


def item(reward: float) -> dict[str, Any]:
    return {"outcome": {"ok": True, "reward": reward}, "elapsed_s": 0.25}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_stored_success_becomes_one_item_per_sample() -> None:
    items = to_items({"status": "SUCCESS", "result": [item(1.0), item(0.0)]}, pack(2), 0.5, 9)
    assert items is not None
    assert [(i.outcome.reward, i.elapsed_s) for i in items] == [(1.0, 0.25), (0.0, 0.25)]


@pytest.mark.parametrize("meta, kind, words", [
    ({"status": "SUCCESS", "result": {"not": "a list"}}, "unavailable",
     "UnexpectedResult: the task returned dict, not 1 items"),
    ({"status": "REVOKED"}, "unavailable", "expired in its queue before a worker started it"),
    ({"status": "STARTED"}, "unavailable", "UnexpectedResult: task state STARTED"),
    (failure("TimeLimitExceeded", "60"), "timeout", "its worker process was killed"),
    (failure("SoftTimeLimitExceeded"), "timeout", "the task's time limit stopped it"),
    (failure("WorkerLostError", "Worker exited prematurely: signal 9 (SIGKILL)."), "crashed",
     "worker process died"),
    (failure("CallAbandoned", "redelivered 3 times"), "crashed", "worker process died"),
    (failure("ValueError", "bad", "input"), "unavailable", "ValueError: bad input"),
    (Expired("deadline"), "unavailable", f"within {9 + DEADLINE_SLACK_S:g} s"),
    (Unavailable("executor closed"), "unavailable", "executor closed"),
])
def test_every_other_result_is_a_typed_failure(meta: Any, kind: str, words: str) -> None:
    items = to_items(meta, pack(1), 0.5, 9.0)
    assert items is not None and len(items) == 1
    assert items[0].outcome.error.value == kind
    assert words in items[0].outcome.detail["message"]


def test_a_time_limit_reports_the_checks_limit_and_a_crash_its_exit_code() -> None:
    [timed_out] = to_items(failure("TimeLimitExceeded"), pack(1), 0.5, 9.0) or []
    assert timed_out.elapsed_s == 2.0 and timed_out.outcome.detail["limit_s"] == 2.0
    [crashed] = to_items(failure("WorkerLostError", "exitcode 137"), pack(1), 0.5, 9.0) or []
    assert crashed.elapsed_s == 0.5 and "exit code" in crashed.outcome.detail["message"]


def test_a_group_that_failed_as_a_whole_is_replayed_unless_it_stays_whole() -> None:
    assert to_items(failure("TimeLimitExceeded"), pack(3), 0.5, 9.0) is None
    assert to_items({"status": "SUCCESS", "result": [item(1.0)]}, pack(3), 0.5, 9.0) is None
    whole = to_items(failure("TimeLimitExceeded"), pack(3, "rubric"), 0.5, 9.0)
    assert whole is not None and [i.outcome.error.value for i in whole] == ["timeout"] * 3
    # markers and expiry never replay: the call would only wait again
    assert to_items(Expired("deadline"), pack(3), 0.5, 9.0) is not None
    assert to_items({"status": "REVOKED"}, pack(3), 0.5, 9.0) is not None


def test_a_waiter_never_raises_and_counts_only_tasks_of_a_queue() -> None:
    def broken(meta: Any) -> Any:
        if isinstance(meta, dict):
            raise KeyError("boom")
        return meta

    waiter = Waiter("k", None, 0.0, broken)  # type: ignore[arg-type]
    settled = waiter.settle({"status": "SUCCESS"})
    assert isinstance(settled, Unavailable) and settled.message == "KeyError: 'boom'"

    before = value("rewardd_tasks_total", queue="cpu", state="success")
    mapped = Waiter("k", None, 0.0, item_mapper(pack(1), time.monotonic(), 9.0),  # type: ignore
                    "cpu", "math", time.monotonic())
    [one] = mapped.settle({"status": "SUCCESS", "result": [item(1.0)]}) or []
    assert one.outcome.reward == 1.0
    assert value("rewardd_tasks_total", queue="cpu", state="success") - before == 1


# ---- the collector, against a backend that is not there ---------------------------------------

@pytest.fixture
def dead_backend_collector() -> Any:
    settings = Settings(broker_url="redis://127.0.0.1:1/0")
    app = create_celery(settings)
    collector = ResultCollector(app.backend, settings)
    yield collector
    collector.close()
    app.close()


async def test_an_unreachable_backend_settles_every_waiter_unavailable(
        dead_backend_collector: ResultCollector, monkeypatch: Any) -> None:
    monkeypatch.setattr("rewardd.workers.collector.BACKEND_OUTAGE_S", 0.2)
    collector = dead_backend_collector
    loop = asyncio.get_running_loop()
    collector.bind(loop)
    futures = [loop.create_future() for _ in range(3)]
    for index, future in enumerate(futures):
        collector.watch(f"t{index}", future, time.monotonic() + 3600,
                        item_mapper(pack(1), time.monotonic(), 9.0), "cpu", "math")
    results = await asyncio.wait_for(asyncio.gather(*futures), 60)
    messages = [r[0].outcome.detail["message"] for r in results]
    assert all(m.startswith("result backend unreachable for 0.2 s") for m in messages)
    assert collector.waiters == {}


async def test_cancelled_waiters_are_forgotten_and_the_rest_settle_together(
        dead_backend_collector: ResultCollector) -> None:
    collector = dead_backend_collector
    loop = asyncio.get_running_loop()
    collector.bind(loop)
    futures = [loop.create_future() for _ in range(3)]
    for index, future in enumerate(futures):
        collector.watch(f"t{index}", future, time.monotonic() + 3600, lambda meta: meta)
    futures[1].cancel()
    assert collector.forget_cancelled() == ["t1"]
    assert sorted(collector.waiters) == ["t0", "t2"]
    popped = collector.pop("t2")
    assert popped is not None and popped.future is futures[2]
    collector.settle_all(Unavailable("closing"))
    assert collector.waiters == {}
    assert isinstance(futures[0].result(), Unavailable) and not futures[2].done()
    collector.stop_polling()
