"""Who is alive, who holds which task, and putting back what a dead worker held.

Why this exists: with late acknowledgement a message a worker took stays in the Redis
transport's ``unacked`` hash (with its delivery time in the ``unacked_index`` zset) until the
task ends; when the whole worker (main process and children) vanishes, kombu hands it to
another worker only after the visibility timeout (REWARDD_VISIBILITY_TIMEOUT_S, 900 s by
default, and it must exceed the longest task). A lost pod then stalled its batch for 15 min.

How: every ``rewardd worker`` main process writes a *heartbeat* every
REWARDD_WORKER_HEARTBEAT_S: one Redis hash per worker (:func:`worker_key`) holding its queues,
its pool size and the delivery tags of the messages it holds (Celery's reserved and active
requests, ``{delivery_tag: task_id}``), which expires after REWARDD_WORKER_LOST_AFTER_S, plus
its name in the :data:`WORKERS_KEY` zset. :func:`reap` (run by whichever worker takes the
short :data:`REAPER_LOCK_KEY` each beat, and by the API while it awaits results) requeues every
unacknowledged message delivered more than REWARDD_WORKER_LOST_AFTER_S ago that no live
worker's heartbeat claims: its worker died (heartbeat expired) or died before its first beat.
It uses kombu's own ``restore_by_tag`` (a WATCH/MULTI transaction on the ``unacked`` hash), so
two reapers racing requeue a message once, and a message acknowledged meanwhile is left alone.

Alternatives rejected: Celery events (``task-received``) need every API process to consume an
event stream and keep state across its restarts; the broadcast census answers in 0.5 s
windows and says nothing about tasks; a short visibility timeout would redeliver long tasks
that are still running. The cost: one small HSET+PEXPIRE+ZADD per worker per beat, and one
ZRANGEBYSCORE (plus one HGET per live worker, only when old unacked messages exist) per
beat for the whole fleet. A worker of a release without heartbeats would look dead to the
reaper: its long tasks would be run twice (harmless: tasks are idempotent, a result is read
once), so upgrade workers before APIs.

The same heartbeats tell the API which queues have a live consumer (/readyz, and failing
calls fast for a queue nobody serves): :func:`consumers`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

WORKERS_KEY = "rewardd-workers"
"""Zset: worker hostname -> time of its last heartbeat (names of dead workers linger until a
reaper drops them)."""
REAPER_LOCK_KEY = "rewardd-reaper-lock"
UNACKED_INDEX_KEY = "unacked_index"
"""kombu's Redis transport: delivery tag -> time the message was delivered to a worker."""
EPOCH_KEY = "rewardd-epoch"
"""A marker with no TTL: when it vanishes, Redis lost its data (restarted without persistence,
flushed, a failover to an empty replica) and what was queued there is gone."""
REAP_BATCH = 1000


def worker_key(hostname: str) -> str:
    return f"rewardd-worker-{hostname}"


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """One live worker, as its last heartbeat described it."""

    hostname: str
    queues: tuple[str, ...]
    slots: int
    held: dict[str, str] = field(default_factory=dict)
    """delivery tag -> task id of the messages it holds (reserved or running)."""


def beat(client: Any, hostname: str, queues: Iterable[str], slots: int, held: dict[str, str],
         ttl_s: float) -> None:
    """Write one heartbeat: replaces the worker's record, which expires after ``ttl_s``."""
    key = worker_key(hostname)
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.hset(key, mapping={"queues": json.dumps(list(queues)), "slots": slots,
                                "held": json.dumps(held)})
        pipe.pexpire(key, int(ttl_s * 1000))
        pipe.zadd(WORKERS_KEY, {hostname: time.time()})
        pipe.execute()


def live_workers(client: Any) -> list[WorkerBeat]:
    """Every worker whose heartbeat has not expired; names of expired ones are dropped from
    :data:`WORKERS_KEY`."""
    names = [n.decode() if isinstance(n, bytes) else n for n in client.zrange(WORKERS_KEY, 0, -1)]
    if not names:
        return []
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hmget(worker_key(name), "queues", "slots", "held")
        records = pipe.execute()
    alive, dead = [], []
    for name, (queues, slots, held) in zip(names, records):
        if queues is None:
            dead.append(name)
            continue
        try:
            alive.append(WorkerBeat(name, tuple(json.loads(queues)), int(slots or 0),
                                    dict(json.loads(held or "{}"))))
        except (ValueError, TypeError):
            log.warning("unreadable heartbeat of worker %s", name)
    if dead:
        client.zrem(WORKERS_KEY, *dead)
    return alive


def consumers(workers: Iterable[WorkerBeat]) -> dict[str, int]:
    """Live workers consuming each queue."""
    counts: dict[str, int] = {}
    for worker in workers:
        for queue in worker.queues:
            counts[queue] = counts.get(queue, 0) + 1
    return counts


def held_task_ids(workers: Iterable[WorkerBeat]) -> set[str]:
    return {task_id for worker in workers for task_id in worker.held.values()}


def reap(client: Any, restore: Callable[[str], None], lost_after_s: float,
         workers: list[WorkerBeat] | None = None) -> int:
    """Requeue the unacknowledged messages delivered over ``lost_after_s`` ago that no live
    worker holds (``restore(tag)``: kombu's ``restore_by_tag``). Returns how many."""
    old = client.zrangebyscore(UNACKED_INDEX_KEY, "-inf", time.time() - lost_after_s,
                               start=0, num=REAP_BATCH)
    if not old:
        return 0
    if workers is None:
        workers = live_workers(client)
    held = {tag for worker in workers for tag in worker.held}
    orphans = [t.decode() if isinstance(t, bytes) else t for t in old]
    orphans = [tag for tag in orphans if tag not in held]
    for tag in orphans:
        restore(tag)
    if orphans:
        log.warning("requeued %d task(s) whose worker stopped sending heartbeats",
                    len(orphans))
    return len(orphans)


def take_reaper_lock(client: Any, owner: str, period_s: float) -> bool:
    """One reaper per period for the whole fleet (the lock expires by itself)."""
    return bool(client.set(REAPER_LOCK_KEY, owner, nx=True, px=max(1, int(period_s * 1000))))


def kombu_restorer(connection: Any) -> Callable[[str], None]:
    """``restore(tag)`` over a kombu Redis connection's channel: the transport's own
    ``restore_by_tag``, which pushes the message back on its queue (at its priority, marked
    redelivered) and removes it from the unacked indices in one transaction."""
    channel = connection.default_channel

    def restore(tag: str) -> None:
        channel.qos.restore_by_tag(tag, client=channel.client)

    return restore


class Heartbeat(threading.Thread):
    """The worker main process's heartbeat thread (started on Celery's ``worker_ready``).

    Each beat: write this worker's record (:func:`beat`) from Celery's request registries,
    then, when it wins the fleet's reaper lock, :func:`reap`. Errors (Redis down) are logged
    once per outage and retried next beat."""

    def __init__(self, app: Any, hostname: str, queues: list[str], slots: int,
                 every_s: float, lost_after_s: float) -> None:
        super().__init__(name="rewardd-heartbeat", daemon=True)
        self.app, self.hostname, self.queues, self.slots = app, hostname, queues, slots
        self.every_s, self.lost_after_s = every_s, lost_after_s
        self.stopping = threading.Event()
        self._failing = False

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with self.app.connection_for_write() as connection:
                    client = connection.default_channel.client
                    restore = kombu_restorer(connection)
                    while not self.stopping.is_set():
                        self.once(client, restore)
                        self.stopping.wait(self.every_s)
            except Exception as exc:
                if not self._failing:
                    log.warning("heartbeat failed (%s: %s); retrying", type(exc).__name__, exc)
                self._failing = True
                self.stopping.wait(self.every_s)

    def once(self, client: Any, restore: Callable[[str], None]) -> None:
        beat(client, self.hostname, self.queues, self.slots, held_requests(),
             self.lost_after_s)
        self._failing = False
        if take_reaper_lock(client, self.hostname, self.every_s):
            reap(client, restore, self.lost_after_s)


def held_requests() -> dict[str, str]:
    """``{delivery_tag: task_id}`` of the requests this worker process holds (reserved or
    running: with late acks, every message it has taken and not acknowledged)."""
    from celery.worker import state

    requests: list[Any] = []
    for _ in range(5):  # the worker's event loop may change the sets while we copy them
        try:
            requests = [*state.reserved_requests, *state.active_requests]
            break
        except RuntimeError:
            continue
    held: dict[str, str] = {}
    for request in requests:
        try:
            held[str(request.message.delivery_tag)] = request.id
        except AttributeError:
            continue
    return held


@dataclass(frozen=True, slots=True)
class FleetView:
    """What the API knows of the broker and the workers at one moment (:func:`observe`)."""

    at: float
    """time.monotonic() of the observation."""
    error: str | None = None
    """The broker could not be read (then nothing else is known)."""
    consumers: dict[str, int] = field(default_factory=dict)
    held: frozenset[str] = frozenset()
    """Task ids some live worker holds."""
    data_lost: bool = False
    """Redis restarted (its run id changed) or lost its data (:data:`EPOCH_KEY`) since the
    previous observation: messages may have vanished, even with persistence (one a worker
    popped from its queue while the connection broke, before kombu recorded it unacked)."""
    requeued: int = 0
    workers: frozenset[str] = frozenset()
    """Hostnames of the live workers (one that vanished since the previous look may have
    taken a message with it: :meth:`rewardd.workers.watchdog.FleetWatchdog._look`)."""


def binding_key(queue: str) -> str:
    """kombu's Redis transport routes a message by this set; without it (Redis lost it) a
    message published to the queue's exchange goes to no queue."""
    return f"_kombu.binding.{queue}"


def observe(client: Any, restore: Callable[[str], None], declare: Callable[[list[str]], None],
            queues: list[str], epoch: str | None, owner: str, every_s: float,
            lost_after_s: float) -> tuple[FleetView, str]:
    """One look at the fleet from the API (blocking): the epoch marker (set when missing),
    the queues' bindings (declared again when Redis lost them), the live workers, and a reap
    when this process wins the reaper lock. Returns the view and the epoch now."""
    import uuid

    with client.pipeline(transaction=False) as pipe:
        pipe.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
        pipe.get(EPOCH_KEY)
        for queue in queues:
            pipe.exists(binding_key(queue))
        _, marker, *bound = pipe.execute()
    marker = marker.decode() if isinstance(marker, bytes) else marker
    try:
        run_id = client.info("server").get("run_id", "")
    except Exception:  # INFO refused (some managed Redis): the marker alone
        run_id = ""
    current = f"{marker}/{run_id}"
    lost = epoch is not None and current != epoch
    missing = [queue for queue, exists in zip(queues, bound) if not exists]
    if missing:
        declare(missing)
    workers = live_workers(client)
    requeued = 0
    if take_reaper_lock(client, owner, every_s):
        requeued = reap(client, restore, lost_after_s, workers)
    return FleetView(time.monotonic(), None, consumers(workers), frozenset(held_task_ids(workers)),
                     lost, requeued, workers=frozenset(w.hostname for w in workers)), current


def missing_tasks(broker: Any, backend: Any, task_ids: list[str],
                  result_keys: list[bytes | str],
                  queue_keys: list[str]) -> list[str]:
    """Of ``task_ids`` (with their result keys in ``backend``), those in no queue list of
    ``broker``, not unacknowledged there and without a stored result: what Redis lost, or
    what a worker popped and died with. Reads every message in ``queue_keys`` and the
    ``unacked`` hash, so it is run only after Redis restarted or a worker vanished (bounded by
    the dispatch window per queue and API process). The queues and the hash are read in one
    transaction: a reaper moving a message from one to the other in between would make it
    look missing (then it is run twice: harmless, tasks are idempotent and read once)."""
    with broker.pipeline(transaction=True) as pipe:
        for key in queue_keys:
            pipe.lrange(key, 0, -1)
        pipe.hvals("unacked")
        replies = pipe.execute()
    with backend.pipeline(transaction=False) as pipe:
        for key in result_keys:
            pipe.exists(key)
        stored = pipe.execute()
    present = {_message_id(json.loads(raw)) for messages in replies[:-1] for raw in messages}
    for raw in replies[-1]:
        try:
            present.add(_message_id(json.loads(raw)[0]))
        except (ValueError, TypeError, IndexError):
            continue
    return [task_id for task_id, found in zip(task_ids, stored)
            if not found and task_id not in present]


def _message_id(payload: Any) -> str:
    try:
        return str(payload["headers"]["id"])
    except (TypeError, KeyError):
        return ""
