"""The Celery executor's result collector (:mod:`rewardd.workers.collector`) against a real
Redis result backend, database 15 (no other test uses it; flushed before and after each
test): results stored the way Celery stores them are read, mapped and deleted together with
their redelivery counters; a second copy of a hard time limit is deleted later; an undecodable
result and a deadline settle as typed failures. Waits are bounds against hangs."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

import pytest
import redis
from celery import states
from prometheus_client import REGISTRY

from rewardd.service.settings import Settings
from rewardd.verifiers.base import Sample
from rewardd.workers.celery_app import create_celery, deliveries_key
from rewardd.workers.collector import ResultCollector, item_mapper
from rewardd.workers.executor import VerifyCall
from rewardd.workers.packing import Pack, Part
from tests.integration.conftest import REDIS_HOST, REDIS_PORT
from tests.support.celery_parts import PARTS_DB, empty_parts_db
from tests.support.jobs import wait_until

URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{PARTS_DB}"
HANG_S = 60.0


@pytest.fixture
def db() -> Iterator[redis.Redis]:
    with empty_parts_db(REDIS_HOST, REDIS_PORT) as client:
        yield client


@pytest.fixture
def collector(db: redis.Redis) -> Iterator[ResultCollector]:
    settings = Settings(broker_url=URL, result_ttl_s=300)
    app = create_celery(settings)
    made = ResultCollector(app.backend, settings)
    yield made
    made.close()
    app.close()


class TimeLimitExceeded(Exception):
    """Stored under the name of billiard's, as a killed task's result is."""


def pack(samples: int = 1) -> Pack:
    call = VerifyCall("math", tuple(Sample(str(i)) for i in range(samples)), {}, {}, 1.0)
    return Pack((Part(0, 0, call),))


def item(reward: float) -> dict[str, Any]:
    return {"outcome": {"ok": True, "reward": reward}, "elapsed_s": 0.01}


def watch(collector: ResultCollector, task_id: str, call: Pack,
          deadline_s: float = 3600.0) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    now = time.monotonic()
    collector.watch(task_id, future, now + deadline_s, item_mapper(call, now, 9.0), "cpu",
                    "math", now)
    return future


def retries(queue: str) -> float:
    return REGISTRY.get_sample_value("rewardd_task_retries_total",
                                     {"queue": queue, "reason": "worker_lost"}) or 0.0


async def test_stored_results_are_read_mapped_and_deleted(collector: ResultCollector,
                                                          db: redis.Redis) -> None:
    collector.bind(asyncio.get_running_loop())
    two, one = watch(collector, "task-a", pack(2)), watch(collector, "task-b", pack(1))
    await asyncio.sleep(0.05)  # the poller finds nothing yet, and keeps polling
    assert not two.done() and len(collector.waiters) == 2
    before = retries("cpu")
    db.hset(deliveries_key("task-b"), "redeliveries", 2)
    collector.backend.store_result("task-a", [item(1.0), item(0.5)], states.SUCCESS)
    collector.backend.store_result("task-b", [item(0.0)], states.SUCCESS)
    a, b = await asyncio.wait_for(asyncio.gather(two, one), HANG_S)
    assert [i.outcome.reward for i in a] == [1.0, 0.5] and b[0].outcome.reward == 0.0
    assert retries("cpu") - before == 2
    assert collector.waiters == {}
    assert db.keys("*") == []  # the results and the redelivery counter are gone


async def test_a_second_copy_of_a_hard_time_limit_is_deleted_later(
        collector: ResultCollector, db: redis.Redis, monkeypatch: Any) -> None:
    monkeypatch.setattr("rewardd.workers.collector.REDELETE_AFTER_S", 0.2)
    collector.bind(asyncio.get_running_loop())
    future = watch(collector, "task-k", pack(1))
    killed = TimeLimitExceeded(1.1)
    collector.backend.store_result("task-k", killed, states.FAILURE)
    [result] = await asyncio.wait_for(future, HANG_S)
    assert result.outcome.error.value == "timeout"
    key = collector.backend.get_key_for_task("task-k")
    collector.backend.store_result("task-k", killed, states.FAILURE)  # on_failure's copy
    assert db.exists(key)
    await wait_until(lambda: not db.exists(key), "the second copy to be deleted")


async def test_an_undecodable_result_and_a_deadline_are_typed_failures(
        collector: ResultCollector, db: redis.Redis) -> None:
    collector.bind(asyncio.get_running_loop())
    garbled = watch(collector, "task-g", pack(1))
    late = watch(collector, "task-l", pack(1), deadline_s=0.1)
    db.set(collector.backend.get_key_for_task("task-g"), b"\xff not json")
    [bad], [expired] = await asyncio.wait_for(asyncio.gather(garbled, late), HANG_S)
    assert bad.outcome.error.value == "unavailable"
    assert bad.outcome.detail["message"].startswith("UndecodableResult: ")
    assert expired.outcome.error.value == "unavailable"
    assert "no worker finished the call within" in expired.outcome.detail["message"]
    assert db.keys("*") == []
