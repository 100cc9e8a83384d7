"""The publisher of the Celery executor: tasks through a fair queue per Celery queue, an
outbox and the broker.

Fairness between requests: publishing every task of a batch at once would queue a big
request's tasks in the broker's list (first in, first out) ahead of every later request's.
So each Celery queue has a *window* (REWARDD_DISPATCH_WINDOW, default two tasks per worker
slot of the queue): tasks beyond it wait in the API process's fair queue
(:mod:`rewardd.workers.fairness`, one flow per request) and are published as earlier tasks
settle. The window is per API process: with several API pods the broker holds up to one
window per pod. A task's deadline still starts when it is published.

Publishing runs in a small pool of threads (the executor's broker I/O pool),
:data:`PUBLISH_SLICE` calls at a time on one producer connection, in Redis pipelines of
:data:`PIPELINE_SIZE` messages. A published task's future is handed to the result collector
(:mod:`rewardd.workers.collector`), which settles it; settling frees its place in the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Sequence

from celery import Celery, Task
from celery.utils import uuid
from kombu import Producer
from kombu.exceptions import OperationalError

from rewardd.workers import metrics
from rewardd.workers.celery_app import VERIFY_TASK, task_time_limits
from rewardd.workers.census import FleetCensus
from rewardd.workers.collector import (DEADLINE_SLACK_S, ResultCollector, TaskValue, all_failed,
                                       item_mapper, unavailable_outcome)
from rewardd.workers.executor import ItemResult, unsendable
from rewardd.workers.fairness import DEFAULT_FLOW, FairQueue, Flow, QueueClosed, Ticket
from rewardd.workers.logs import FLOW_HEADER, TENANT_HEADER
from rewardd.workers.packing import Pack
from rewardd.workers.routing import Router
from rewardd.workers.settings import WorkerSettings

log = logging.getLogger(__name__)

PIPELINE_SIZE = 16
"""Messages per Redis pipeline when publishing: one round trip for that many tasks instead
of one each, and workers start on the first pipeline while later ones are being built."""

PUBLISH_SLICE = 128
"""Calls published per trip to the I/O thread: results of the first slices are read while
later ones are still being sent (publishing costs about 0.4 ms of CPU per task in Celery,
kombu and redis-py on a small VM, 0.6 ms without pipelines, which is why one task carries a
whole group)."""

WINDOW_PER_SLOT = 2
"""Default window of a queue: tasks in the broker per worker slot that consumes it (one
running, one ready to start when it finishes, so a slot never waits for the API's poll and
publish round trip). The other tasks wait in the API's fair queue, where a new request's
first task goes ahead of a big request's remainder: it waits behind at most the window."""

DEFAULT_WINDOW = 8
"""Window of a queue before the first worker census (or when it found no worker for it)."""

Job = tuple[str, Pack]
"""A task to publish: its id and its pack of calls."""


@dataclass(eq=False, slots=True)
class Queued:
    """One task on its way through its queue's fair queue, the outbox and the broker."""

    task_id: str
    pack: Pack
    future: asyncio.Future[TaskValue]
    queue: str
    ticket: Ticket[Queued] | None = None
    submitted: float = 0.0
    """time.monotonic() when the task entered its fair queue (the no-consumer grace)."""


class Unsendable(Exception):
    """A call whose arguments would not pickle for a worker (the cause)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Publisher:
    """Admits tasks through each Celery queue's window and publishes them (see the module
    doc). Everything but :meth:`publish` (an I/O thread's) and :meth:`close` runs in the
    executor's event loop (:meth:`bind`)."""

    def __init__(self, app: Celery, router: Router, settings: WorkerSettings,
                 io: ThreadPoolExecutor, collector: ResultCollector,
                 census: FleetCensus) -> None:
        self.app = app
        self.router = router
        self.settings = settings
        self.closed = False
        self._verify: Task = app.tasks[VERIFY_TASK]
        self._io = io
        self._collector = collector
        self._census = census
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fair: dict[str, FairQueue[Queued]] = {}
        """Per Celery queue, the tasks beyond its window, waiting fairly per flow."""
        self._outbox: list[Queued] = []
        """Admitted tasks the outbox task has yet to send."""
        self._drainer: asyncio.Task[None] | None = None
        self._entries: dict[str, Queued] = {}

    @property
    def unsettled(self) -> Mapping[str, Queued]:
        """Every task not yet settled (in a fair queue, the outbox or the broker), by id: what
        the watchdog fails fast or publishes again."""
        return self._entries

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve ``loop`` from now on: the queues of the previous loop are dropped with it."""
        self._loop = loop
        self._fair = {}
        self._outbox = []
        self._drainer = None
        self._entries = {}

    def submit(self, calls: Sequence[Pack],
               flow: Flow = DEFAULT_FLOW) -> list[asyncio.Future[TaskValue]]:
        """Queue the tasks in their Celery queue's fair queue as one flow; those within the
        queue's window are published at once (one batch, off the event loop), the others as
        earlier tasks settle. Each future gives one ItemResult per sample, or None when a
        task of several samples must be replayed. Cancelling a future drops its task from the
        fair queue, or frees its place in the window (the caller revokes it: :meth:`abandon`)."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[TaskValue]] = []
        admitted: list[Ticket[Queued]] = []
        for call in calls:
            fut: asyncio.Future[TaskValue] = loop.create_future()
            futures.append(fut)
            if not call.samples:
                fut.set_result([])
                continue
            if self.closed:
                fut.set_result(all_failed(call, unavailable_outcome("executor closed"), 0.0))
                continue
            queue = self.router.queue_for(call.verifier)
            entry = Queued(uuid(), call, fut, queue, submitted=time.monotonic())
            try:
                entry.ticket, now = self._fair_queue(queue).submit(flow, len(call.samples),
                                                                   entry)
            except QueueClosed:
                fut.set_result(all_failed(call, unavailable_outcome("executor closed"), 0.0))
                continue
            admitted.extend(now)
            self._entries[entry.task_id] = entry
            fut.add_done_callback(functools.partial(self._leave, entry))
        self._publish_soon(admitted)
        return futures

    def abandon(self, task_ids: Sequence[str] = ()) -> None:
        """Forget the waiters whose futures were cancelled (their ``run()`` was cancelled)
        and revoke their tasks and ``task_ids`` (one broadcast, in an I/O thread): workers
        skip revoked tasks still queued. The poller stops once no waiter is left."""
        ids = [*self._collector.forget_cancelled(), *task_ids]
        if ids and not self.closed:
            try:
                self._io.submit(self._revoke, ids)
            except RuntimeError:  # I/O pool shut down meanwhile (closing)
                pass

    def fair_stats(self) -> dict[str, dict[str, object]]:
        """Each Celery queue's fair queue, for /readyz and the metrics."""
        return {queue: fair.stats() for queue, fair in self._fair.items()}

    def close(self) -> None:
        """Nothing is published any more (the tasks still waiting settle by
        :meth:`close_queues`)."""
        self.closed = True

    def close_queues(self) -> None:
        """In the loop, closing: the tasks still waiting in the fair queues or the outbox
        settle ``unavailable`` (never published)."""
        waiting = [ticket.item for fair in self._fair.values() for ticket in fair.close()]
        waiting.extend(self._outbox)
        self._outbox = []
        for entry in waiting:
            if not entry.future.done():
                entry.future.set_result(all_failed(entry.pack, unavailable_outcome(
                    "executor closed (the server is shutting down)"), 0.0))

    # ---- the window: tasks in the broker per queue, the rest in the fair queue -----------

    def window(self, queue: str) -> int:
        """Tasks of ``queue`` in the broker at most: REWARDD_DISPATCH_WINDOW when set (0:
        no bound), else :data:`WINDOW_PER_SLOT` per worker slot of the queue at the last
        census, else :data:`DEFAULT_WINDOW`."""
        if self.settings.dispatch_window is not None:
            return self.settings.dispatch_window
        slots = self._census.slots_by_queue().get(queue)
        return WINDOW_PER_SLOT * slots if slots else DEFAULT_WINDOW

    def refresh_windows(self) -> None:
        """Follow the census: a queue whose window grew publishes what it now admits."""
        for queue, fair in list(self._fair.items()):
            window = self.window(queue)
            if window != fair.capacity:
                self._publish_soon(fair.set_capacity(window))

    def _fair_queue(self, queue: str) -> FairQueue[Queued]:
        fair = self._fair.get(queue)
        if fair is None:
            fair = self._fair[queue] = FairQueue(self.window(queue))
        return fair

    def _leave(self, entry: Queued, future: asyncio.Future[TaskValue]) -> None:
        """In the loop, once the task's future is done (result read, typed failure, expired,
        abandoned, executor closed): free its place in the window exactly once, or drop it
        from the fair queue when it was still waiting (its caller was cancelled), and
        publish what that admits."""
        self._entries.pop(entry.task_id, None)
        fair = self._fair.get(entry.queue)
        if fair is None or entry.ticket is None:  # the queues were reset (a new loop)
            return
        if not fair.cancel(entry.ticket):
            self._publish_soon(fair.release(entry.ticket))

    # ---- sending ---------------------------------------------------------------------------

    def _publish_soon(self, admitted: list[Ticket[Queued]]) -> None:
        """Publish ``admitted`` from the outbox task: releases of one poll tick add up in
        the outbox and go out together, :data:`PUBLISH_SLICE` at a time."""
        if not admitted:
            return
        self._outbox.extend(ticket.item for ticket in admitted)
        if self._drainer is None or self._drainer.done():
            loop = self._loop or asyncio.get_running_loop()
            self._drainer = loop.create_task(self._drain_outbox())

    async def _drain_outbox(self) -> None:
        broker_down: Exception | None = None
        while self._outbox:
            part = [entry for entry in self._outbox[:PUBLISH_SLICE] if not entry.future.done()]
            del self._outbox[:PUBLISH_SLICE]
            if part:
                broker_down = await self._send(part, broker_down)

    async def _send(self, part: list[Queued],
                    broker_down: Exception | None) -> Exception | None:
        """Publish one slice and watch its results; returns the broker's connection error
        when it was unreachable (the rest of the outbox then fails without waiting out the
        publish retries again)."""
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        if self.closed:
            errors: dict[str, Exception] = {e.task_id: RuntimeError("executor closed")
                                            for e in part}
        elif broker_down is not None:
            errors = {entry.task_id: broker_down for entry in part}
        else:
            try:
                flows = {entry.task_id: entry.ticket.flow for entry in part
                         if entry.ticket is not None}
                errors = await loop.run_in_executor(
                    self._io, self.publish, [(entry.task_id, entry.pack) for entry in part],
                    flows)
            except Exception as exc:  # the I/O pool shut down under us (closing)
                errors = {entry.task_id: exc for entry in part}
            broker_down = next((e for e in errors.values()
                                if isinstance(e, OperationalError)), None)
        started = time.monotonic()  # deadlines start at publish
        abandoned: list[str] = []
        for entry in part:
            call, fut, task_id = entry.pack, entry.future, entry.task_id
            error = errors.get(task_id)
            if fut.done():  # its caller was cancelled while the slice was being sent
                if error is None:
                    abandoned.append(task_id)
                continue
            if isinstance(error, Unsendable):  # the payload's fault, never retried
                fut.set_result(_refused(call, error.cause))
                continue
            if error is not None:
                metrics.TASKS.labels(entry.queue, "unavailable").inc()
                fut.set_result(all_failed(call, unavailable_outcome(
                    f"could not send the call to the broker: {type(error).__name__}: "
                    f"{error}"), 0.0))
                continue
            limit = self.settings.queue_timeout_s + task_time_limits(call)[1]
            self._collector.watch(task_id, fut, started + limit + DEADLINE_SLACK_S,
                                  item_mapper(call, started, limit), entry.queue,
                                  call.verifier, sent)
        if abandoned:
            self.abandon(abandoned)
        return broker_down

    def publish(self, jobs: list[Job],
                flows: dict[str, Flow] | None = None) -> dict[str, Exception]:
        """In an I/O thread: one task per call on one producer connection, sent in Redis
        pipelines of :data:`PIPELINE_SIZE` messages (kombu's publish batches). Returns the
        calls that could not be sent. Once the broker is unreachable (after the publish
        retries) the rest of the batch is not tried.

        A pipeline that fails is sent again one message at a time, with Celery's publish
        retries: some of its messages may have gone through, and running such a task twice
        is harmless (tasks are idempotent; the second result overwrites the first).

        ``flows`` names each task's request (or job) and tenant: they travel as message
        headers, so the worker's log lines carry them (:mod:`rewardd.workers.logs`)."""
        errors: dict[str, Exception] = {}
        flows = flows or {}
        try:
            with self.app.producer_or_acquire() as producer:
                batch = getattr(producer, "batch", None)  # kombu >= 5.7
                for start in range(0, len(jobs), PIPELINE_SIZE):
                    part = jobs[start:start + PIPELINE_SIZE]
                    buffered: list[Job] = []
                    down: Exception | None = None
                    try:
                        with (batch(max_size=len(part) + 1) if batch is not None
                              else contextlib.nullcontext()):
                            down = self._send_each(producer, part, errors, buffered, flows)
                    except Exception as exc:  # the pipeline failed: delivery uncertain
                        log.warning("a publish pipeline failed (%s: %s); sending its %d "
                                    "calls one by one", type(exc).__name__, exc, len(buffered))
                        down = self._send_each(producer, buffered, errors, [], flows)
                    if down is not None:  # broker down: the rest would fail too
                        errors.update((tid, down) for tid, _ in jobs[start + len(part):])
                        break
        except Exception as exc:  # no producer connection at all
            errors.update((tid, exc) for tid, _ in jobs if tid not in errors)
        return errors

    def _send_each(self, producer: Producer, jobs: list[Job], errors: dict[str, Exception],
                   sent: list[Job], flows: dict[str, Flow]) -> Exception | None:
        """Publish (or, inside a publish batch, buffer) each job; failed calls go to
        ``errors``, the others to ``sent``. Stops at a broker connection error (after
        Celery's publish retries), marks the rest failed and returns that error."""
        for index, (task_id, call) in enumerate(jobs):
            soft, hard = task_time_limits(call)
            args = call.task_args()
            try:
                # the worker's prefork pool pickles the arguments again, and an error there
                # stops the worker (Celery's "Unrecoverable error") and, the message being
                # acknowledged late, every worker that gets it next: refuse it here instead
                pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # RecursionError (nested too deep), anything
                errors[task_id] = Unsendable(exc)
                continue
            flow = flows.get(task_id)
            headers = ({FLOW_HEADER: flow.id, TENANT_HEADER: flow.tenant}
                       if flow is not None else None)
            try:
                self._verify.apply_async(
                    args=args, task_id=task_id, producer=producer, headers=headers,
                    queue=self.router.queue_for(call.verifier),
                    soft_time_limit=soft, time_limit=hard,
                    expires=self.settings.queue_timeout_s,
                    # monitoring reprs of the arguments: Celery would build them
                    # with saferepr, about 40% of the cost of publishing a group
                    argsrepr=call.verifier, kwargsrepr="")
            except OperationalError as exc:  # broker down: the rest would fail too
                errors.update((tid, exc) for tid, _ in jobs[index:])
                return exc
            except Exception as exc:  # this call only (e.g. not JSON-serializable)
                errors[task_id] = exc
            else:
                sent.append((task_id, call))
        return None

    def _revoke(self, task_ids: list[str]) -> None:
        try:
            self.app.control.revoke(task_ids)
        except Exception:  # queued tasks then run and their results expire unread
            log.warning("could not revoke %d tasks of a cancelled run", len(task_ids),
                        exc_info=True)


def _refused(call: Pack, exc: BaseException) -> list[ItemResult] | None:
    """The items of a pack that could not be sent: one group's samples all get
    :func:`unsendable`'s failure (they share the reference); a pack of several groups is
    replayed one sample per task (None), as when it fails as a whole, so only the culprit
    group's samples fail."""
    if len(call.parts) > 1:
        return None
    return all_failed(call, unsendable(call.parts[0].call, exc), 0.0)
