"""The fleet watchdog of the Celery executor: readiness, queues nobody consumes, lost tasks.

A watchdog coroutine (:meth:`FleetWatchdog._watch_fleet`) looks at the broker and the workers'
heartbeats every REWARDD_WORKER_HEARTBEAT_S (:mod:`rewardd.workers.liveness`): readiness is
answered from what it saw, calls of a queue nobody consumes fail fast, a lost worker's tasks
are requeued, and after a Redis restart what Redis lost is published again.

A worker that vanished can lose a message too, not only Redis: kombu's Redis transport takes a
message off its queue (BRPOP) and records it unacknowledged in the next command, so a worker
SIGKILLed between the two takes the message with it, where no reaper sees it (measured: 1 run
in about 60 of tests/faults/test_worker_loss.py, whose kill follows a fetch). So a worker
whose heartbeat stopped is treated like a Redis restart: after REWARDD_WORKER_LOST_AFTER_S
the tasks awaited since before then that are nowhere in Redis are published again, instead
of waiting out REWARDD_QUEUE_TIMEOUT_S.

Why from heartbeats and not a ping task: a ping queued behind a long batch would make /readyz
wait for user work (or fail while the workers are busy and healthy); a heartbeat is written by
each worker's main process whatever its pool is doing. Idle, the watchdog costs a few small
Redis commands per beat, on a broker connection of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from celery import Celery
from kombu import Connection

from rewardd.workers import metrics
from rewardd.workers.census import DEPTH_TIMEOUT_S, FleetCensus
from rewardd.workers.collector import (ResultCollector, Unavailable, all_failed,
                                       unavailable_outcome)
from rewardd.workers.liveness import FleetView, kombu_restorer, missing_tasks, observe
from rewardd.workers.publisher import Publisher
from rewardd.workers.routing import Router
from rewardd.workers.settings import WorkerSettings

log = logging.getLogger(__name__)


class FleetWatchdog:
    """Keeps a view of the fleet and acts on it (see the module doc). Runs in the executor's
    event loop (:meth:`start`); the looks at Redis run in a thread of its own."""

    def __init__(self, app: Celery, router: Router, settings: WorkerSettings,
                 io: ThreadPoolExecutor, publisher: Publisher, collector: ResultCollector,
                 census: FleetCensus) -> None:
        self.app = app
        self.router = router
        self.settings = settings
        self.closed = False
        self._io = io
        """The executor's broker I/O pool (publishing again what Redis lost)."""
        self._watch_io = ThreadPoolExecutor(1, thread_name_prefix="rewardd-celery-watch")
        self._publisher = publisher
        self._collector = collector
        self._census = census
        self._task: asyncio.Task[None] | None = None
        self._conn: Connection | None = None
        self._view: FleetView | None = None
        self._epoch: str | None = None
        self._lost_at: float | None = None
        """When Redis lost data or a worker was last seen vanishing: tasks published before
        then are audited (:meth:`_republish_lost`)."""
        self._last_workers: frozenset[str] = frozenset()
        self._unserved_since: dict[str, float] = {}

    def reset(self) -> None:
        """The executor serves a new loop: the watchdog task and the view of the previous
        loop are dropped with it (:meth:`start` starts a new one)."""
        self._task = None
        self._view = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the watchdog in ``loop`` unless it runs already (or the executor closed)."""
        if (self._task is None or self._task.done()) and not self.closed:
            self._task = loop.create_task(self._watch_fleet())

    def stop(self) -> None:
        """In the loop, closing: the watchdog task stops."""
        if self._task is not None:
            self._task.cancel()

    def close(self) -> None:
        """No more looks: the watch thread and its broker connection stop."""
        self.closed = True
        self._watch_io.shutdown(wait=False, cancel_futures=True)
        self._drop_conn()

    # ---- readiness --------------------------------------------------------------------------

    async def ready(self, wait_s: float = 5.0) -> bool:
        """From what the watchdog keeps (:meth:`_watch_fleet`), never a task queued behind
        user work: the broker answers, and every queue of REWARDD_READY_QUEUES has a worker
        whose heartbeat is live. A view older than a few heartbeats is refreshed first (at
        most ``wait_s``)."""
        view = self._view
        if view is None or time.monotonic() - view.at > self._stale_after():
            try:
                view = await asyncio.wait_for(self._look(), wait_s)
            except Exception as exc:  # broker down or too slow: not ready
                view = FleetView(time.monotonic(), f"{type(exc).__name__}: "
                                 f"{exc or f'no answer within {wait_s:g} s'}")
                self._view = view
        return view.error is None and not self._unready_queues(view)

    def not_ready_reason(self, wait_s: float = 5.0) -> str:
        view = self._view
        if view is None:
            return f"the broker did not answer within {wait_s:g} s"
        if view.error is not None:
            return f"the broker is unreachable: {view.error}"
        missing = self._unready_queues(view)
        if missing:
            return ("no live worker consumes queue " + ", ".join(repr(q) for q in missing)
                    + f" (no heartbeat within REWARDD_WORKER_LOST_AFTER_S="
                    f"{self.settings.worker_lost_after_s:g} s)")
        return "ready"

    def describe(self) -> dict[str, object]:
        """The live consumers of each queue (or the broker's error), for /readyz; empty
        before the first look."""
        view = self._view
        if view is not None and view.error is None:
            return {"consumers_by_queue": {q: view.consumers.get(q, 0)
                                           for q in self.router.queues},
                    "queues_without_consumer": [q for q in self.router.queues
                                                if not view.consumers.get(q)],
                    "heartbeat_age_s": round(time.monotonic() - view.at, 1)}
        if view is not None:
            return {"broker_error": view.error}
        return {}

    def live_workers(self) -> frozenset[str]:
        """Hostnames of the live workers at the last look (empty before it or while the
        broker is unreachable)."""
        view = self._view
        return view.workers if view is not None and view.error is None else frozenset()

    def _unready_queues(self, view: FleetView) -> list[str]:
        wanted = [q.strip() for q in self.settings.ready_queues.split(",") if q.strip()]
        return [queue for queue in wanted if not view.consumers.get(queue)]

    def _stale_after(self) -> float:
        return max(3 * self.settings.worker_heartbeat_s, 2.0)

    # ---- looking at the fleet ---------------------------------------------------------------

    async def _watch_fleet(self) -> None:
        """Every REWARDD_WORKER_HEARTBEAT_S for the executor's life: look at the fleet
        (:func:`rewardd.workers.liveness.observe`, in a thread of its own), then fail fast the
        calls of queues without a live consumer and publish again what Redis lost. Idle, it
        costs a few small Redis commands per beat."""
        while not self.closed:
            try:
                await self._look()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._view = FleetView(time.monotonic(), f"{type(exc).__name__}: {exc}")
                self._drop_conn()
            try:
                self._act(self._view)
            except Exception:  # never let a bug stop the watchdog
                log.exception("the fleet watchdog failed")
            await asyncio.sleep(self.settings.worker_heartbeat_s)

    async def _look(self) -> FleetView:
        loop = asyncio.get_running_loop()
        view, self._epoch = await loop.run_in_executor(self._watch_io, self._observe)
        if view.data_lost:
            log.warning("Redis restarted or lost its data: tasks this process published "
                        "before now that are nowhere in Redis are sent again")
            self._lost_at = view.at
        vanished = self._last_workers - view.workers
        if vanished:
            log.warning("worker(s) %s stopped sending heartbeats: tasks this process published "
                        "before now that are nowhere in Redis are sent again",
                        ", ".join(sorted(vanished)))
            self._lost_at = view.at
        self._last_workers = view.workers
        self._view = view
        return view

    def _observe(self) -> tuple[FleetView, str]:
        """In the watch thread: one :func:`~rewardd.workers.liveness.observe` on a broker
        connection of its own (dropped after an error, remade on the next look)."""
        if self._conn is None:
            self._conn = self.app.connection_for_write()
            self._conn.ensure_connection(max_retries=1, timeout=DEPTH_TIMEOUT_S * 2)
        conn = self._conn
        try:
            return observe(conn.default_channel.client, kombu_restorer(conn), self._declare,
                           self.router.queues, self._epoch, f"api-{id(self)}",
                           self.settings.worker_heartbeat_s, self.settings.worker_lost_after_s)
        except Exception:
            self._drop_conn()
            raise

    def _declare(self, queues: list[str]) -> None:
        """Declare ``queues`` (their bindings) again: Redis lost them, and a message sent
        before a worker re-declares them would go to no queue."""
        with self.app.connection_for_write() as conn:
            for name in queues:
                self.app.amqp.queues[name](conn.default_channel).declare()

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.release()

    # ---- acting on what it saw --------------------------------------------------------------

    def _act(self, view: FleetView | None) -> None:
        """In the loop, after a look: fail the calls of unserved queues, republish lost
        tasks."""
        if view is None or view.error is not None:
            return
        now = time.monotonic()
        for queue in self.router.queues:
            if view.consumers.get(queue):
                self._unserved_since.pop(queue, None)
            else:
                self._unserved_since.setdefault(queue, now)
        self._fail_unserved(now)
        lost_at = self._lost_at
        if lost_at is not None and now - lost_at >= self.settings.worker_lost_after_s:
            self._republish_lost(view, lost_at)

    def _fail_unserved(self, now: float) -> None:
        """Calls of a queue no live worker has consumed for REWARDD_NO_CONSUMER_GRACE_S
        (counted from when they were submitted, too): ``unavailable`` now, their published
        tasks revoked, instead of waiting REWARDD_QUEUE_TIMEOUT_S for a worker."""
        grace = self.settings.no_consumer_grace_s
        doomed = [entry for entry in self._publisher.unsettled.values()
                  if entry.queue in self._unserved_since and not entry.future.done()
                  and now - max(self._unserved_since[entry.queue], entry.submitted) >= grace]
        if not doomed:
            return
        revoke = []
        for entry in doomed:
            waiter = self._collector.pop(entry.task_id)
            message = (f"no live worker consumes queue {entry.queue!r} (none for "
                       f"{grace:g} s, REWARDD_NO_CONSUMER_GRACE_S): start `rewardd worker "
                       f"--queues {entry.queue}` or route verifier {entry.pack.verifier!r} "
                       "elsewhere (REWARDD_QUEUE_ROUTES)")
            if waiter is not None:
                revoke.append(entry.task_id)
                waiter.resolve(waiter.settle(Unavailable(message)))
            else:
                metrics.TASKS.labels(entry.queue, "unavailable").inc()
                entry.future.set_result(all_failed(entry.pack, unavailable_outcome(message),
                                                   0.0))
        log.warning("failed %d task(s) of queue(s) without a live consumer: %s", len(doomed),
                    sorted({entry.queue for entry in doomed}))
        if revoke:
            self._publisher.abandon(revoke)

    def _republish_lost(self, view: FleetView, lost_at: float) -> None:
        """Redis restarted (or lost its data), or a worker vanished, at ``lost_at``: every
        task published before then that is still awaited, that no live worker holds, that is
        in no queue, not unacknowledged and without a result
        (:func:`~rewardd.workers.liveness.missing_tasks`) is published again under the same
        id (a task that ran twice is read once)."""
        self._lost_at = None
        waiters = self._collector.waiters
        suspects = [entry for task_id, entry in self._publisher.unsettled.items()
                    if task_id in waiters and waiters[task_id].published <= lost_at
                    and task_id not in view.held and not entry.future.done()]
        if not suspects:
            return
        keys = [waiters[entry.task_id].key for entry in suspects]

        def audit_and_send() -> dict[str, Exception]:
            queue_keys = [k for names in (self._census.queue_keys() or {}).values()
                          for k in names]
            with self.app.connection_for_write() as conn:
                lost = set(missing_tasks(conn.default_channel.client,
                                         self._collector.backend.client,
                                         [e.task_id for e in suspects], keys, queue_keys))
            again = [(e.task_id, e.pack) for e in suspects if e.task_id in lost]
            if again:
                log.warning("publishing %d task(s) again that Redis or a lost worker dropped",
                            len(again))
                metrics.TASK_RETRIES.labels(suspects[0].queue, "republished").inc(len(again))
            return self._publisher.publish(again) if again else {}

        job = asyncio.get_running_loop().run_in_executor(self._io, audit_and_send)

        def published(done: asyncio.Future[dict[str, Exception]]) -> None:
            if done.cancelled() or done.exception() is not None or done.result():
                self._lost_at = lost_at  # the broker went away again: audit once more
        job.add_done_callback(published)
