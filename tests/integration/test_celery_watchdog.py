"""The Celery executor's fleet watchdog (:mod:`rewardd.workers.watchdog`) against a real Redis
broker, database 15 (no other test uses it; flushed before and after each test): readiness
follows the workers' heartbeats, and once Redis lost its data the tasks still awaited that
are nowhere in Redis are published again. Heartbeats are written by the test (no worker
runs); waits are bounds against hangs."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest
import redis
from prometheus_client import REGISTRY

from rewardd.verifiers.base import Sample
from rewardd.workers.executor import VerifyCall
from rewardd.workers.fairness import Flow
from rewardd.workers.liveness import EPOCH_KEY, beat, worker_key
from rewardd.workers.packing import Pack, Part
from tests.integration.conftest import REDIS_HOST, REDIS_PORT
from tests.support.celery_parts import PARTS_DB, CeleryParts, empty_parts_db
from tests.support.jobs import wait_until

URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{PARTS_DB}"


@pytest.fixture
def db() -> Iterator[redis.Redis]:
    with empty_parts_db(REDIS_HOST, REDIS_PORT) as client:
        yield client


@pytest.fixture
def parts(db: redis.Redis) -> Iterator[CeleryParts]:
    wired = CeleryParts(URL, ready_queues="cpu", worker_heartbeat_s=0.2,
                        worker_lost_after_s=0.5, result_ttl_s=300)
    yield wired
    wired.close()


async def test_readiness_follows_the_heartbeats(parts: CeleryParts, db: redis.Redis) -> None:
    watchdog = parts.watchdog
    assert await watchdog.ready(wait_s=30) is False
    assert watchdog.not_ready_reason().startswith("no live worker consumes queue 'cpu'")
    assert watchdog.describe()["queues_without_consumer"] == ["cpu", "sandbox", "gpu"]

    beat(db, "w1@test", ["cpu", "sandbox"], 2, {}, ttl_s=60)
    await watchdog._look()
    assert await watchdog.ready(wait_s=30) is True
    assert watchdog.describe()["consumers_by_queue"] == {"cpu": 1, "sandbox": 1, "gpu": 0}

    db.delete(worker_key("w1@test"))  # its heartbeat expired
    await watchdog._look()
    assert await watchdog.ready(wait_s=30) is False


async def test_what_redis_lost_is_published_again(parts: CeleryParts, db: redis.Redis) -> None:
    def republished() -> float:
        return REGISTRY.get_sample_value("rewardd_task_retries_total",
                                         {"queue": "cpu", "reason": "republished"}) or 0.0

    parts.bind(asyncio.get_running_loop())
    beat(db, "w1@test", ["cpu", "sandbox", "gpu"], 2, {}, ttl_s=60)
    calls = [VerifyCall("math", (Sample(f"m{i}"),), {}, {}, 1.0) for i in range(2)]
    futures = parts.publisher.submit([Pack((Part(i, 0, c),)) for i, c in enumerate(calls)],
                                     Flow("a"))
    await wait_until(lambda: len(parts.collector.waiters) == 2, "both tasks published")
    assert parts.published == ["m0", "m1"]  # recorded, never sent: nowhere in Redis
    await parts.watchdog._look()  # the epoch this process knows
    before = republished()

    db.delete(EPOCH_KEY)  # as after a restart without persistence
    view = await parts.watchdog._look()
    assert view.data_lost
    await asyncio.sleep(parts.settings.worker_lost_after_s)  # lost workers' tasks first
    parts.watchdog._act(view)
    await wait_until(lambda: len(parts.published) == 4, "the lost tasks published again")
    assert sorted(parts.published[2:]) == ["m0", "m1"]
    assert republished() - before == 2
    assert not any(future.done() for future in futures)  # still awaited, under the same ids
