"""The reaper on its own, against a real Redis and kombu's real Redis transport: a message
taken by a consumer that never acknowledges it is requeued once its delivery is older than
REWARDD_WORKER_LOST_AFTER_S and no live heartbeat claims it, once (kombu's restore_by_tag is
a transaction on the unacked hash); a claimed one is left alone; and the audit after a Redis restart finds exactly the
tasks that are nowhere."""

from __future__ import annotations

import json
import time
from typing import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Queue

from rewardd.workers import liveness
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.faults

QUEUE = Queue("cpu", Exchange("cpu", type="direct"), routing_key="cpu")


CONSUMERS: list[Connection] = []


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[tuple[Connection, redis.Redis]]:
    with Connection(redis_server.url(), transport_options={"visibility_timeout": 900}) as conn:
        yield conn, redis.Redis.from_url(redis_server.url())
    while CONSUMERS:  # closed while Redis is still up (closing restores their messages)
        CONSUMERS.pop().release()


def take_one(conn: Connection, task_id: str) -> str:
    """Publish a Celery-shaped message and take it without acknowledging (a worker that then
    vanished): returns its delivery tag."""
    with conn.Producer() as producer:
        producer.publish({"n": task_id}, exchange=QUEUE.exchange, routing_key="cpu",
                         declare=[QUEUE], headers={"id": task_id})
    consumer_conn = conn.clone()
    CONSUMERS.append(consumer_conn)
    message = consumer_conn.SimpleQueue(QUEUE).get(timeout=5)
    assert message.headers["id"] == task_id
    return message.delivery_tag  # never acknowledged


def age_deliveries(client: redis.Redis, seconds: float) -> None:
    for tag, score in client.zrange("unacked_index", 0, -1, withscores=True):
        client.zadd("unacked_index", {tag: score - seconds})


def test_an_unclaimed_old_delivery_is_requeued_once_and_a_claimed_one_stays(
        broker: tuple[Connection, redis.Redis]) -> None:
    conn, client = broker
    lost = take_one(conn, "lost-task")
    held = take_one(conn, "held-task")
    assert client.llen("cpu") == 0 and client.hlen("unacked") == 2
    liveness.beat(client, "w1", ["cpu"], 2, {held: "held-task"}, ttl_s=30)
    restore = liveness.kombu_restorer(conn)
    # too recent: nothing yet
    assert liveness.reap(client, restore, lost_after_s=6.0) == 0
    age_deliveries(client, 10.0)
    assert liveness.reap(client, restore, lost_after_s=6.0) == 1
    assert liveness.reap(client, restore, lost_after_s=6.0) == 0  # a later reaper: no-op
    [raw] = client.lrange("cpu", 0, -1)
    message = json.loads(raw)
    assert message["headers"]["id"] == "lost-task"
    assert message["properties"]["delivery_info"]["redelivered"] is True
    assert client.hkeys("unacked") == [held.encode()]
    # the holder dies: its heartbeat expires, and its task goes back too
    client.delete(liveness.worker_key("w1"))
    assert liveness.reap(client, restore, lost_after_s=6.0) == 1
    assert client.llen("cpu") == 2 and client.hlen("unacked") == 0
    assert liveness.live_workers(client) == []
    assert client.zcard(liveness.WORKERS_KEY) == 0


def test_consumers_come_from_live_heartbeats_only(
        broker: tuple[Connection, redis.Redis]) -> None:
    _, client = broker
    liveness.beat(client, "a", ["cpu"], 2, {}, ttl_s=30)
    liveness.beat(client, "b", ["cpu", "sandbox"], 1, {"t": "x"}, ttl_s=0.2)
    assert liveness.consumers(liveness.live_workers(client)) == {"cpu": 2, "sandbox": 1}
    time.sleep(0.4)
    workers = liveness.live_workers(client)
    assert liveness.consumers(workers) == {"cpu": 1}
    assert liveness.held_task_ids(workers) == set()


def test_the_audit_finds_the_tasks_that_are_nowhere(
        broker: tuple[Connection, redis.Redis]) -> None:
    conn, client = broker
    take_one(conn, "unacked-task")
    with conn.Producer() as producer:
        producer.publish({}, exchange=QUEUE.exchange, routing_key="cpu", declare=[QUEUE],
                         headers={"id": "queued-task"})
    client.set("celery-task-meta-done-task", "{}")
    ids = ["unacked-task", "queued-task", "done-task", "lost-task"]
    missing = liveness.missing_tasks(client, client, ids,
                                     [f"celery-task-meta-{i}" for i in ids], ["cpu"])
    assert missing == ["lost-task"]
