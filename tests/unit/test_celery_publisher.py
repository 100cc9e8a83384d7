"""The Celery executor's publisher (:mod:`rewardd.workers.publisher`) without a broker: the
window per queue and the fair queue behind it, what a failed publish settles to, message
headers, closing and revoking. The broker's side is a stub; the collector is a recorder."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterator

import pytest
from kombu.exceptions import OperationalError

from rewardd.verifiers.base import Sample
from rewardd.workers.executor import ItemResult, VerifyCall
from rewardd.workers.fairness import Flow
from rewardd.workers.logs import FLOW_HEADER, TENANT_HEADER
from rewardd.workers.packing import Pack, Part
from rewardd.workers.publisher import DEFAULT_WINDOW
from tests.support.celery_parts import CeleryParts
from tests.support.jobs import wait_until


class RecordingCollector:
    """What the publisher hands over: the published tasks' futures, by task id."""

    def __init__(self) -> None:
        self.watched: dict[str, asyncio.Future] = {}

    def watch(self, task_id: str, future: asyncio.Future, deadline: float, transform: Any,
              queue: str | None = None, verifier: str = "", published: float = 0.0) -> None:
        self.watched[task_id] = future

    def forget_cancelled(self) -> list[str]:
        gone = [tid for tid, fut in self.watched.items() if fut.cancelled()]
        for tid in gone:
            del self.watched[tid]
        return gone


def pack(name: str, verifier: str = "math", reference: Any = None) -> Pack:
    call = VerifyCall(verifier, (Sample(name),), reference or {"answer": "1"}, {}, 1.0)
    return Pack((Part(0, 0, call),))


def done(value: float = 1.0) -> list[ItemResult]:
    return [ItemResult.from_task({"outcome": {"ok": True, "reward": value}, "elapsed_s": 0.0})]


def made(**overrides: Any) -> CeleryParts:
    return CeleryParts(collector=RecordingCollector(), **overrides)


@pytest.fixture
def parts() -> Iterator[CeleryParts]:
    wired = made(dispatch_window=2)
    yield wired
    wired.close()


async def test_the_window_holds_back_a_batch_and_each_settled_task_lets_one_out(
        parts: CeleryParts) -> None:
    parts.publisher.bind(asyncio.get_running_loop())
    futures = parts.publisher.submit([pack(f"a{i}") for i in range(5)], Flow("a"))
    await wait_until(lambda: len(parts.collector.watched) == 2, "the window to be published")
    assert parts.published == ["a0", "a1"]
    assert parts.publisher.fair_stats()["cpu"]["waiting_calls"] == 3
    futures[0].set_result(done())
    await wait_until(lambda: len(parts.published) == 3, "the next task")
    assert parts.published == ["a0", "a1", "a2"]

    def settle_what_is_published() -> bool:
        for future in parts.collector.watched.values():
            if not future.done():
                future.set_result(done())
        return all(future.done() for future in futures) and len(parts.published) == 5

    await wait_until(settle_what_is_published, "every task published and settled")
    assert parts.published == [f"a{i}" for i in range(5)]
    await asyncio.sleep(0)  # the last settled futures leave the window
    assert parts.publisher.unsettled == {}
    assert parts.publisher.fair_stats()["cpu"]["in_use"] == 0


async def test_a_later_request_goes_ahead_of_a_big_ones_remainder(parts: CeleryParts) -> None:
    parts.publisher.bind(asyncio.get_running_loop())
    big = parts.publisher.submit([pack(f"a{i}") for i in range(6)], Flow("big"))
    parts.publisher.submit([pack("b0")], Flow("small"))
    await wait_until(lambda: len(parts.published) == 2, "the window")
    big[0].set_result(done())
    await wait_until(lambda: len(parts.published) == 3, "the next task")
    assert parts.published == ["a0", "a1", "b0"]


async def test_the_default_window_follows_the_census_and_grows_at_once() -> None:
    parts = made(dispatch_window=None)
    try:
        parts.publisher.bind(asyncio.get_running_loop())
        assert parts.publisher.window("cpu") == DEFAULT_WINDOW
        parts.publisher.submit([pack(f"a{i}") for i in range(12)], Flow("a"))
        await wait_until(lambda: len(parts.published) == DEFAULT_WINDOW, "the default window")
        parts.census._report = {"workers": 1, "workers_by_queue": {"cpu": 1},
                                "slots_by_queue": {"cpu": 5}}
        assert parts.publisher.window("cpu") == 10
        parts.publisher.refresh_windows()
        await wait_until(lambda: len(parts.published) == 10, "the grown window")
    finally:
        parts.close()


async def test_a_failed_publish_settles_its_tasks_and_closing_the_rest(parts: CeleryParts) -> None:
    parts.publisher.bind(asyncio.get_running_loop())
    parts.publisher.publish = (  # type: ignore[method-assign]
        lambda jobs, flows=None: {tid: OSError("no route") for tid, _ in jobs})
    refused = parts.publisher.submit([pack("x0"), pack("x1"), pack("x2")], Flow("a"))
    first = await asyncio.wait_for(refused[0], 30)
    assert first[0].outcome.error.value == "unavailable"
    assert "could not send the call to the broker: OSError: no route" in \
        first[0].outcome.detail["message"]
    parts.publisher.close()
    parts.publisher.close_queues()
    rest = await asyncio.wait_for(asyncio.gather(*refused[1:]), 30)
    assert [r[0].outcome.error.value for r in rest] == ["unavailable"] * 2
    late = parts.publisher.submit([pack("y")], Flow("a"))[0]
    assert late.result()[0].outcome.detail["message"] == "executor closed"
    assert parts.publisher.submit([Pack((Part(0, 0, VerifyCall("math", (), {}, {}, 1.0)),))],
                                  Flow("a"))[0].result() == []


async def test_cancelled_tasks_are_revoked_with_those_named(parts: CeleryParts) -> None:
    parts.publisher.bind(asyncio.get_running_loop())
    futures = parts.publisher.submit([pack("a0"), pack("a1")], Flow("a"))
    await wait_until(lambda: len(parts.collector.watched) == 2, "both published")
    ids = list(parts.collector.watched)
    futures[0].cancel()
    parts.publisher.abandon(["other"])
    await wait_until(lambda: parts.revoked, "the revoke")
    assert parts.revoked == [[ids[0], "other"]]


# ---- publishing: the I/O thread's part -------------------------------------------------------

class StubTask:
    def __init__(self, down_at: str | None = None) -> None:
        self.down_at = down_at
        self.sent: list[dict[str, Any]] = []

    def apply_async(self, args: Any, task_id: str, **options: Any) -> None:
        if task_id == self.down_at:
            raise OperationalError("broker down")
        self.sent.append({"task_id": task_id, **options})


class StubApp:
    def producer_or_acquire(self) -> Any:
        return contextlib.nullcontext(object())  # no ``batch``: messages go one by one


def test_publish_refuses_what_would_not_pickle_and_stops_when_the_broker_is_down(
        parts: CeleryParts) -> None:
    publisher = parts.publisher
    del publisher.publish  # the real one again
    publisher.app = StubApp()  # type: ignore[assignment]
    task = publisher._verify = StubTask(down_at="t3")  # type: ignore[assignment]
    jobs = [("t0", pack("a")), ("t1", pack("b", reference={"answer": lambda: 1})),
            ("t2", pack("c", verifier="judge")), ("t3", pack("d")), ("t4", pack("e"))]
    flows = {"t0": Flow("req-1", tenant="alpha")}
    errors = publisher.publish(jobs, flows)
    assert [m["task_id"] for m in task.sent] == ["t0", "t2"]
    assert task.sent[0]["headers"] == {FLOW_HEADER: "req-1", TENANT_HEADER: "alpha"}
    assert task.sent[1]["headers"] is None and task.sent[1]["queue"] == "cpu"
    assert task.sent[0]["expires"] == parts.settings.queue_timeout_s
    assert type(errors.pop("t1")).__name__ == "Unsendable"
    assert {tid: str(exc) for tid, exc in errors.items()} == {"t3": "broker down",
                                                              "t4": "broker down"}


async def test_an_unsendable_group_fails_typed_and_a_shared_task_is_replayed(
        parts: CeleryParts) -> None:
    del parts.publisher.publish
    parts.publisher.app = StubApp()  # type: ignore[assignment]
    parts.publisher._verify = StubTask()  # type: ignore[assignment]
    parts.publisher.bind(asyncio.get_running_loop())
    bad = VerifyCall("math", (Sample("a"), Sample("b")), {"answer": lambda: 1}, {}, 1.0)
    good = VerifyCall("math", (Sample("c"),), {"answer": "1"}, {}, 1.0)
    alone, shared = parts.publisher.submit(
        [Pack((Part(0, 0, bad),)), Pack((Part(0, 0, bad), Part(1, 0, good)))], Flow("a"))
    items = await asyncio.wait_for(alone, 30)
    assert [i.outcome.error.value for i in items] == ["invalid_reference"] * 2
    assert items[0].outcome.detail["unsendable"] == "reference"
    assert await asyncio.wait_for(shared, 30) is None  # replayed sample by sample
