"""The Celery executor's fleet watchdog (:mod:`rewardd.workers.watchdog`) without Redis:
readiness and its reason from the last view, what /readyz shows of it, and the calls of a
queue nobody consumes failing fast (published ones revoked). The watchdog against a real
Redis (heartbeats, republishing what Redis lost): tests/integration/test_celery_watchdog.py."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import pytest

from rewardd.verifiers.base import Sample
from rewardd.workers.executor import VerifyCall
from rewardd.workers.fairness import Flow
from rewardd.workers.liveness import FleetView
from rewardd.workers.packing import Pack, Part
from tests.support.celery_parts import CeleryParts
from tests.support.jobs import wait_until


@pytest.fixture
def parts() -> Iterator[CeleryParts]:
    wired = CeleryParts(ready_queues="cpu,sandbox", queue_routes="test_sleep=sandbox",
                        no_consumer_grace_s=0, dispatch_window=1)
    yield wired
    wired.close()


def seen(**consumers: int) -> FleetView:
    return FleetView(time.monotonic(), None, dict(consumers))


def pack(verifier: str, name: str) -> Pack:
    return Pack((Part(0, 0, VerifyCall(verifier, (Sample(name),), {}, {}, 1.0)),))


async def test_readiness_and_its_reason_come_from_the_last_view(parts: CeleryParts) -> None:
    watchdog = parts.watchdog
    assert watchdog.not_ready_reason(3) == "the broker did not answer within 3 s"
    assert watchdog.describe() == {}

    watchdog._view = seen(cpu=2, sandbox=1)
    assert await watchdog.ready() is True and watchdog.not_ready_reason() == "ready"
    assert watchdog.describe()["consumers_by_queue"] == {"cpu": 2, "sandbox": 1, "gpu": 0}
    assert watchdog.describe()["queues_without_consumer"] == ["gpu"]

    watchdog._view = seen(cpu=2)
    assert await watchdog.ready() is False
    assert watchdog.not_ready_reason().startswith("no live worker consumes queue 'sandbox' "
                                                  "(no heartbeat within REWARDD_WORKER_LOST")

    watchdog._view = FleetView(time.monotonic(), "ConnectionError: refused")
    assert await watchdog.ready() is False
    assert watchdog.not_ready_reason() == "the broker is unreachable: ConnectionError: refused"
    assert watchdog.describe() == {"broker_error": "ConnectionError: refused"}


async def test_a_stale_view_is_looked_at_again_and_a_dead_broker_is_not_ready(
        parts: CeleryParts) -> None:
    parts.watchdog._view = FleetView(time.monotonic() - 3600, None, {"cpu": 1, "sandbox": 1})
    assert await parts.watchdog.ready(wait_s=30) is False
    assert parts.watchdog.not_ready_reason().startswith("the broker is unreachable: ")


async def test_calls_of_a_queue_without_consumer_fail_and_published_ones_are_revoked(
        parts: CeleryParts) -> None:
    parts.bind(asyncio.get_running_loop())
    served = parts.publisher.submit([pack("math", "m0")], Flow("a"))
    unserved = parts.publisher.submit([pack("test_sleep", f"s{i}") for i in range(2)],
                                      Flow("a"))
    await wait_until(lambda: len(parts.collector.waiters) == 2, "one task of each queue")
    [published] = [tid for tid, entry in parts.publisher.unsettled.items()
                   if entry.queue == "sandbox" and tid in parts.collector.waiters]
    parts.watchdog._act(seen(cpu=1))
    results = await asyncio.wait_for(asyncio.gather(*unserved), 30)
    for [item] in results:
        assert item.outcome.error.value == "unavailable"
        assert item.outcome.detail["message"].startswith(
            "no live worker consumes queue 'sandbox' (none for 0 s, "
            "REWARDD_NO_CONSUMER_GRACE_S): start `rewardd worker --queues sandbox` or route "
            "verifier 'test_sleep' elsewhere")
    await wait_until(lambda: parts.revoked, "the revoke")
    assert parts.revoked == [[published]]  # the one in the fair queue was never published
    assert not served[0].done() and parts.published == ["m0", "s0"]


async def test_a_queue_within_its_grace_or_with_a_consumer_keeps_its_calls() -> None:
    parts = CeleryParts(queue_routes="test_sleep=sandbox", no_consumer_grace_s=3600)
    try:
        parts.bind(asyncio.get_running_loop())
        waiting = parts.publisher.submit([pack("test_sleep", "s0")], Flow("a"))
        parts.watchdog._act(seen(cpu=1))  # no consumer, but within the grace
        parts.watchdog._act(FleetView(time.monotonic(), "down"))  # nothing known: no action
        await asyncio.sleep(0)
        assert not waiting[0].done() and parts.watchdog._unserved_since.keys() == {
            "sandbox", "gpu"}
        parts.watchdog._act(seen(cpu=1, sandbox=1, gpu=1))
        assert parts.watchdog._unserved_since == {}
    finally:
        parts.close()



async def test_a_worker_whose_heartbeat_stopped_starts_the_audit_of_lost_tasks(
        parts: CeleryParts) -> None:
    """A worker can die holding a message it popped but never recorded unacknowledged: its
    vanishing from the heartbeats marks the moment, as a Redis restart does, for
    :meth:`_republish_lost` (against Redis: tests/faults/test_worker_loss.py)."""
    watchdog = parts.watchdog

    def alive(*hostnames: str) -> FleetView:
        return FleetView(time.monotonic(), None, {"cpu": len(hostnames)},
                         workers=frozenset(hostnames))

    views = iter([alive("a"), alive("a", "b"), alive("a", "b"), alive("b"), alive("b", "c")])
    watchdog._observe = lambda: (next(views), "epoch")  # type: ignore[method-assign]
    for _ in range(3):  # one worker, then a second joins: nothing lost
        await watchdog._look()
        assert watchdog._lost_at is None
    vanished = await watchdog._look()
    assert watchdog._lost_at == vanished.at and watchdog.live_workers() == {"b"}
    watchdog._lost_at = None
    await watchdog._look()  # "c" joins: nothing new is lost
    assert watchdog._lost_at is None and watchdog.live_workers() == {"b", "c"}
