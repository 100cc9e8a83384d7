"""The worker census and queue keys of the Celery executor (:mod:`rewardd.workers.census`)
without a broker: a census sums the broadcast's replies per queue, a failed one says why,
and the Redis lists of a queue are named as kombu's transport names them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest

from rewardd.service.settings import Settings
from rewardd.workers.broker_probe import queue_lists
from rewardd.workers.celery_app import CENSUS_COMMAND, create_celery
from rewardd.workers.census import (CENSUS_EMPTY_EVERY_S, CENSUS_EVERY_S, CENSUS_TIMEOUT_S,
                                    FleetCensus)
from rewardd.workers.routing import Router


class StubControl:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def broadcast(self, command: str, **options: Any) -> Any:
        self.calls.append((command, options))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def census() -> Iterator[FleetCensus]:
    settings = Settings(broker_url="redis://127.0.0.1:1/0", queue_routes="judge=judges")
    app = create_celery(settings)
    io = ThreadPoolExecutor(1)
    made = FleetCensus(app, Router.from_text(settings.queue_routes), settings, io)
    yield made
    made.close()
    io.shutdown(wait=False)
    app.close()


def use(census: FleetCensus, *answers: Any) -> StubControl:
    control = StubControl(list(answers))
    census.app.control = control  # type: ignore[misc]
    return control


def test_a_census_sums_workers_and_slots_per_queue(census: FleetCensus) -> None:
    assert census.workers_by_queue() is None and census.slots_by_queue() == {}
    assert census.describe() == {}
    control = use(census, [], [
        {"w1@h": {"queues": ["cpu", "sandbox"], "slots": 4}},
        {"w2@h": {"queues": ["cpu"], "slots": 2}, "w3@h": {"queues": ["judges"], "slots": 0}},
        {"odd@h": "not a census answer"}])
    census.take()
    # the first broadcast heard nothing: asked once more
    assert [c for c, _ in control.calls] == [CENSUS_COMMAND, CENSUS_COMMAND]
    assert control.calls[0][1] == {"reply": True, "timeout": CENSUS_TIMEOUT_S}
    assert census.report() == {"workers": 3, "workers_by_queue": {"cpu": 2, "sandbox": 1,
                                                                  "judges": 1},
                               "slots_by_queue": {"cpu": 6, "sandbox": 4}}
    assert census.slots_by_queue() == {"cpu": 6, "sandbox": 4}
    assert census.workers_by_queue() == {"cpu": 2, "sandbox": 1, "gpu": 0, "judges": 1}
    described = census.describe()
    assert described["workers"] == 3 and described["census_age_s"] >= 0


def test_a_failed_census_says_why_and_counts_nothing(census: FleetCensus) -> None:
    use(census, ConnectionError("broker down"))
    census.take()
    assert census.report() == {"workers": None, "error": "ConnectionError: broker down"}
    assert census.workers_by_queue() is None
    assert census.slots_by_queue() == {}


def test_a_census_that_heard_nobody_is_retaken_sooner(census: FleetCensus) -> None:
    """An API that started before its workers counts them within a second or two, not after
    CENSUS_EVERY_S (the CI run that saw ``rewardd_workers{queue="cpu"} 0`` with a worker
    up); a census that heard workers stays fresh for CENSUS_EVERY_S."""
    assert CENSUS_EMPTY_EVERY_S < CENSUS_EVERY_S
    control = use(census, [], [], [{"w1@h": {"queues": ["cpu"], "slots": 1}}])
    census.take()
    assert census.report()["workers"] == 0
    census._taken_at -= CENSUS_EMPTY_EVERY_S  # type: ignore[operator]  # aged, by the clock
    census.soon()
    assert census._job is not None
    census._job.result(timeout=30)
    assert census.report()["workers"] == 1 and len(control.calls) == 3
    census._taken_at -= CENSUS_EMPTY_EVERY_S  # type: ignore[operator]
    census.soon()  # heard a worker: fresh for CENSUS_EVERY_S, nothing broadcast
    assert census._job.done() and len(control.calls) == 3


def test_a_closed_census_starts_nothing(census: FleetCensus) -> None:
    control = use(census)
    census.close()
    census.soon()
    assert census._job is None and control.calls == []
    assert census.queue_depths() is None


def test_queue_lists_follow_kombus_names() -> None:
    assert queue_lists({}, ["cpu"]) == {"cpu": ["cpu", "cpu\x06\x163", "cpu\x06\x166",
                                                "cpu\x06\x169"]}
    options = {"global_keyprefix": "rd:", "priority_steps": [0, 5], "sep": ":"}
    assert queue_lists(options, ["cpu", "gpu"]) == {"cpu": ["rd:cpu", "rd:cpu:5"],
                                                    "gpu": ["rd:gpu", "rd:gpu:5"]}


def test_queue_keys_need_a_redis_broker(census: FleetCensus) -> None:
    assert census.queue_keys() == queue_lists({}, census.router.queues)
    other = Settings(broker_url="amqp://guest@127.0.0.1:1//",
                     result_backend="redis://127.0.0.1:1/0")
    app = create_celery(other)
    try:
        amqp = FleetCensus(app, Router(), other, ThreadPoolExecutor(1))
        assert amqp.queue_keys() is None and amqp.queue_depths() is None
    finally:
        app.close()
