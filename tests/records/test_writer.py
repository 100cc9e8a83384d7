"""The record's writer (service/records/writer.py): everything accepted is written in order;
a database that dies mid-run costs no scoring and loses nothing accepted: the writer keeps
what fits, drops and counts the rest, says since when it fails, and writes the backlog when
the database is back (a real PostgreSQL, stopped as a crash would)."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest
from sqlalchemy import func, select

from rewardd.service.records.models import Retention, RolloutQuery
from rewardd.service.records.schema import rollouts
from rewardd.service.records.store import RecordStore
from rewardd.service.records.writer import RecordWriter
from tests.records.records import rollout
from tests.support.postgres import PostgresServer, scratch_database

FLUSH_S = 120.0
"""A guard against a hang only: a flush takes milliseconds."""


class Drops:
    def __init__(self) -> None:
        self.counted: dict[str, int] = {}

    def __call__(self, reason: str, n: int) -> None:
        self.counted[reason] = self.counted.get(reason, 0) + n


def stored(store: RecordStore) -> int:
    with store.engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(rollouts)).scalar_one()


def test_everything_accepted_is_written_in_order(store: RecordStore) -> None:
    drops = Drops()
    writer = RecordWriter(lambda: store, capacity=10_000, count_dropped=drops, batch=64)
    records = [rollout(index=i, step=i // 100) for i in range(1000)]
    for start in range(0, 1000, 37):
        assert writer.submit(records[start:start + 37]) == len(records[start:start + 37])
    assert writer.flush(FLUSH_S)
    writer.close()
    page = store.rollouts("acme", "run-1", RolloutQuery(limit=1000))
    assert [item.record for item in page.items] == records
    health = writer.health()
    assert (health.written, health.dropped, health.queued, health.ok) == (1000, 0, 0, True)
    assert drops.counted == {}
    assert writer.submit([rollout()]) == 0 and drops.counted == {"closed": 1}


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.close()


def test_a_database_that_dies_mid_run_loses_nothing_accepted(
        private_postgres: PostgresServer) -> None:
    with scratch_database(private_postgres.url()) as url:
        store = RecordStore.open(url)
        drops = Drops()
        writer = RecordWriter(lambda: store, capacity=50, count_dropped=drops, batch=16)
        assert writer.submit([rollout(index=i) for i in range(20)]) == 20
        assert writer.flush(FLUSH_S)

        private_postgres.kill()
        assert writer.submit([rollout(index=i) for i in range(20, 60)]) == 40
        assert not writer.flush(1.0)  # nothing can be written now
        health = writer.health()
        assert health.failing_since is not None and health.last_error
        assert health.queued == 40 and not health.ok
        # the queue holds 50: of the next 20, 10 fit and 10 are dropped and counted
        assert writer.submit([rollout(index=i) for i in range(60, 80)]) == 10
        assert drops.counted == {"queue_full": 10}

        private_postgres.start()
        assert writer.flush(FLUSH_S)
        health = writer.health()
        assert (health.written, health.dropped, health.queued) == (70, 10, 0)
        assert health.failing_since is None and health.last_error is None
        assert stored(store) == 70
        ids = [i.record.rollout_id
               for i in store.rollouts("acme", "run-1", RolloutQuery(limit=100)).items]
        assert ids == [f"r{i}" for i in range(70)]
        writer.close()
        store.close()


def test_the_writer_applies_retention_after_its_first_write(store: RecordStore) -> None:
    store.write([rollout(index=i, at=100.0) for i in range(3)])  # written long ago
    calls: list[int] = []

    def prune(opened: RecordStore) -> int:
        deleted = opened.prune("acme", Retention(max_age_s=3600.0))
        calls.append(deleted)
        return deleted

    writer = RecordWriter(lambda: store, capacity=100, prune=prune)
    writer.submit([rollout(index=i, at=time.time()) for i in range(3, 5)])
    assert writer.flush(FLUSH_S)
    writer.submit([rollout(index=9, at=time.time())])  # within PRUNE_EVERY_S: no second prune
    assert writer.flush(FLUSH_S)
    writer.close()
    assert calls == [3]
    assert [i.record.rollout_id for i in store.rollouts("acme", "run-1",
                                                       RolloutQuery()).items] == ["r3", "r4", "r9"]


def test_a_lazy_batch_is_taken_whole_or_dropped_whole_and_a_failing_build_is_counted(
        store: RecordStore) -> None:
    drops = Drops()
    writer = RecordWriter(lambda: store, capacity=10, count_dropped=drops)
    assert writer.submit_batch(4, lambda: [rollout(index=i) for i in range(4)]) == 4
    assert writer.submit_batch(20, lambda: [rollout(index=i) for i in range(20)]) == 0

    def broken() -> list:
        raise ValueError("a recording bug")

    assert writer.submit_batch(3, broken) == 3
    assert writer.flush(FLUSH_S)
    writer.close()
    health = writer.health()
    assert (health.written, health.queued, health.dropped) == (4, 0, 23)
    assert drops.counted == {"queue_full": 20, "error": 3}
    assert stored(store) == 4


def test_the_queue_is_bounded_in_bytes_too(store: RecordStore) -> None:
    drops = Drops()
    writer = RecordWriter(lambda: store, capacity=1000, count_dropped=drops,
                          capacity_bytes=10_000)
    building, gate = threading.Event(), threading.Event()

    def held() -> list:  # the writer thread holds this batch while the test queues more
        building.set()
        gate.wait(FLUSH_S)
        return [rollout(index=0)]

    assert writer.submit_batch(1, held, size=9_000) == 1
    assert building.wait(FLUSH_S)  # taken from the queue: its bytes left it
    assert writer.submit_batch(1, lambda: [rollout(index=1)], size=6_000) == 1
    assert writer.submit_batch(1, lambda: [rollout(index=2)], size=6_000) == 0
    assert drops.counted == {"queue_full": 1}
    gate.set()
    assert writer.flush(FLUSH_S)
    assert writer.submit_batch(1, lambda: [rollout(index=3)], size=9_000) == 1  # room again
    assert writer.flush(FLUSH_S)
    writer.close()
    assert stored(store) == 3


def test_one_tenant_cannot_crowd_another_out_of_the_queue(store: RecordStore) -> None:
    drops = Drops()
    writer = RecordWriter(lambda: store, capacity=100, count_dropped=drops, owner_capacity=10)
    building, gate = threading.Event(), threading.Event()

    def held() -> list:  # the writer thread holds this batch: what follows waits in the queue
        building.set()
        gate.wait(FLUSH_S)
        return [rollout(index=0, tenant="other")]

    assert writer.submit_batch(1, held, owner="other") == 1
    assert building.wait(FLUSH_S)
    assert writer.submit_batch(8, lambda: [rollout(index=i) for i in range(1, 9)],
                               owner="acme") == 8
    assert writer.submit_batch(5, lambda: [rollout(index=i) for i in range(9, 14)],
                               owner="acme") == 0  # acme would hold 13 > 10
    assert drops.counted == {"tenant_full": 5}
    assert writer.submit_batch(9, lambda: [rollout(index=i, tenant="beta")
                                           for i in range(20, 29)], owner="beta") == 9
    gate.set()
    assert writer.flush(FLUSH_S)
    assert writer.submit_batch(5, lambda: [rollout(index=i) for i in range(9, 14)],
                               owner="acme") == 5  # written: room again
    assert writer.flush(FLUSH_S)
    writer.close()
    assert stored(store) == 1 + 8 + 9 + 5
