"""The Celery executor: verifier calls on ``rewardd worker`` processes, through Redis.

Same contract as :class:`rewardd.workers.embedded.EmbeddedExecutor`: results in the order of the
calls, every failure a typed outcome, and a task that fails as a whole replayed one sample
per task so that only the culprit fails. A call (a group's samples through one verifier) is
one task, several tasks when it is too big for one, or shares a task with other small
groups when the batch has far more groups than the workers have slots
(:mod:`rewardd.workers.packing`: a task's fixed cost is several milliseconds of CPU). The delivery
guarantees are the Celery app's (:mod:`rewardd.workers.celery_app`).

How results are awaited without blocking the event loop: one poller coroutine per executor
asks Redis for every pending result key with a single MGET per tick, in a thread of its own
(redis-py and kombu sockets block), then deletes the keys of the results it read with one DEL
(what ``AsyncResult.forget()`` does, batched; in the same round trip it reads the redelivery
counters, for ``rewardd_task_retries_total``) before handing them over. Publishing runs in a
small pool of threads (:data:`IO_THREADS`), :data:`PUBLISH_SLICE` calls at a time on one
producer connection, in Redis pipelines of :data:`PIPELINE_SIZE` messages.
The cost: a result is noticed up to one tick late (:data:`POLL_MIN_S` right after results
arrived, backing off to :data:`POLL_MAX_S` while nothing does), and while calls are pending
Redis answers 20 to 200 MGETs a second per API process, each for all pending keys (64 bytes
each). Idle, it costs nothing. The alternative, ``AsyncResult.get()`` in threads, would hold
a thread per pending call (thousands for one big batch) or serialize them; subscribing to
Celery's result pub/sub channels would save the polling but lose results published while
(re)subscribing.

Fairness between requests: publishing every task of a batch at once would queue a big
request's tasks in the broker's list (first in, first out) ahead of every later request's.
So each Celery queue has a *window* (REWARDD_DISPATCH_WINDOW, default two tasks per worker
slot of the queue): tasks beyond it wait in the API process's fair queue
(:mod:`rewardd.workers.fairness`, one flow per request) and are published as earlier tasks
settle. The window is per API process: with several API pods the broker holds up to one
window per pod. A task's deadline still starts when it is published.

Faults: a watchdog coroutine (:meth:`CeleryExecutor._watch_fleet`) looks at the broker and
the workers' heartbeats every REWARDD_WORKER_HEARTBEAT_S (:mod:`rewardd.workers.liveness`):
readiness is answered from what it saw, calls of a queue nobody consumes fail fast, a lost
worker's tasks are requeued, and after a Redis restart what Redis lost is published again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from celery import states
from celery.utils import uuid
from kombu.exceptions import OperationalError

from rewardd.workers import metrics
from rewardd.workers.logs import FLOW_HEADER, TENANT_HEADER
from rewardd.workers.settings import WorkerSettings
from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.workers.celery_app import (CENSUS_COMMAND, VERIFY_TASK, CallAbandoned,
                                create_celery, deliveries_key, group_timeout_s,
                                max_samples_per_task, parse_exitcode, redact_url,
                                task_time_limits)
from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ItemResult,
                              ProgressCallback, VerifyCall, keeps_group_whole, unsendable)
from rewardd.workers.fairness import (DEFAULT_FLOW, FairQueue, Flow, QueueClosed, Ticket,
                                      current_flow)
from rewardd.workers.liveness import FleetView, kombu_restorer, missing_tasks, observe
from rewardd.workers.packing import Pack, pack_target, plan
from rewardd.workers.routing import DEFAULT_QUEUE, Router

log = logging.getLogger(__name__)

IO_THREADS = 4
"""Threads for broker I/O: batch publishes (one per request at a time) and the worker census.
The poller has a thread of its own, so a big publish never delays reading results."""

POLL_MIN_S = 0.005
POLL_MAX_S = 0.05
"""Poll interval bounds: back to the minimum whenever a tick found results, else x1.5."""

BACKEND_OUTAGE_S = 30.0
"""While the result backend is unreachable the poller retries with backoff (up to 1 s
apart); after this long without one successful read every pending call is ``unavailable``."""

DEADLINE_SLACK_S = 5.0
"""A call is given up (``unavailable``) this long after the latest moment its task could
still be running: queue timeout (its message expires then) plus its hard time limit."""

CENSUS_TIMEOUT_S = 0.5
CENSUS_EVERY_S = 10.0
"""The worker census (for /readyz, the worker metrics and packing) is one broadcast that
collects replies for CENSUS_TIMEOUT_S, taken in the background at most every
CENSUS_EVERY_S."""

MGET_CHUNK = 1000

DEPTH_TIMEOUT_S = 1.0
"""Connect and read timeout of the queue-depth reads of a /metrics scrape."""

PIPELINE_SIZE = 16
"""Messages per Redis pipeline when publishing: one round trip for that many tasks instead
of one each, and workers start on the first pipeline while later ones are being built."""

PUBLISH_SLICE = 128
"""Calls published per trip to the I/O thread: results of the first slices are read while
later ones are still being sent (publishing costs about 0.4 ms of CPU per task in Celery,
kombu and redis-py on a small VM, 0.6 ms without pipelines, which is why one task carries a
whole group)."""

REDELETE_AFTER_S = 2.0

WINDOW_PER_SLOT = 2
"""Default window of a queue: tasks in the broker per worker slot that consumes it (one
running, one ready to start when it finishes, so a slot never waits for the API's poll and
publish round trip). The other tasks wait in the API's fair queue, where a new request's
first task goes ahead of a big request's remainder: it waits behind at most the window."""

DEFAULT_WINDOW = 8
"""Window of a queue before the first worker census (or when it found no worker for it)."""


class _Marker:
    """Why a call settled without a stored result."""

    def __init__(self, message: str) -> None:
        self.message = message


class _Expired(_Marker):
    """No result by the call's deadline."""


class _Unavailable(_Marker):
    """Broker or backend unreachable, or the executor closed."""


@dataclass(slots=True)
class _Waiter:
    key: Any
    """The result's Redis key (``celery-task-meta-<id>``)."""
    future: asyncio.Future
    deadline: float
    """time.monotonic() after which the waiter settles as :class:`_Expired`."""
    transform: Callable[[Any], Any]
    """Turns the decoded result meta (or a marker) into the future's value. Pure, so the
    poller runs it in its thread: mapping thousands of results must not stall the loop."""
    queue: str | None = None
    """The task's queue, for the task metrics (None: not counted, e.g. a readiness ping)."""
    verifier: str = ""
    published: float = 0.0
    """time.monotonic() just before the task was published (for its latency)."""

    def settle(self, meta: Any) -> Any:
        """The future's value for ``meta``; never raises. Counts the task in the metrics."""
        if self.queue is not None:
            _observe(self, meta)
        try:
            return self.transform(meta)
        except Exception as exc:  # never leave a request hanging on a mapping bug
            log.exception("could not map a Celery result")
            return self.transform(_Unavailable(f"{type(exc).__name__}: {exc}"))

    def resolve(self, value: Any) -> None:
        """In the loop: hand the value over (once)."""
        if not self.future.done():
            self.future.set_result(value)


@dataclass(eq=False, slots=True)
class _Queued:
    """One task on its way through its queue's fair queue, the outbox and the broker."""

    task_id: str
    pack: Pack
    future: asyncio.Future
    queue: str
    ticket: Ticket[Any] | None = None
    submitted: float = 0.0
    """time.monotonic() when the task entered its fair queue (the no-consumer grace)."""


class CeleryExecutor(Executor):
    """Publishes each call to its verifier's queue and awaits the results in Redis.

    Limits and failures, as in the embedded executor:

    * each sample's check has ``call.timeout_s`` (the soft deadline inside the worker);
    * the task has Celery's soft limit at the call's hard limit and is killed shortly after
      (:func:`rewardd.workers.celery_app.task_time_limits`): a one-sample call becomes ``timeout``;
    * a worker child that dies under a task gets it redelivered up to
      ``worker_lost_retries`` times; then a one-sample call is ``crashed``;
    * a whole worker that vanishes (its heartbeat expires) has its tasks requeued within
      ``worker_lost_after_s`` (:mod:`rewardd.workers.liveness`), not after the visibility
      timeout, which stays the last resort;
    * Redis restarted or lost its data: tasks still awaited that are nowhere in Redis are
      published again under the same id (:meth:`_republish_lost`);
    * a queue with no live consumer: its calls are ``unavailable`` after
      ``no_consumer_grace_s`` (:meth:`_fail_unserved`);
    * a call of several samples whose task failed as a whole (time limit, worker lost past
      the budget, a result that would not serialize) is replayed one sample per call;
    * broker or backend down, a call that expired in its queue
      (``queue_timeout_s``) or no result by its deadline: ``unavailable``, not replayed.

    A group larger than :func:`~rewardd.workers.celery_app.max_samples_per_task` is sent as several
    tasks, so no task outlives the broker's visibility timeout, and small groups of one
    verifier share tasks when the batch would otherwise be many tasks per worker slot
    (:mod:`rewardd.workers.packing`); each task is replayed on its own and its items go back to
    their calls in order.
    """

    kind = "celery"

    def __init__(self, settings: WorkerSettings, app: Any = None) -> None:
        self.settings = settings
        self.app = app or create_celery(settings)
        self.router = Router.from_text(settings.queue_routes)
        self._backend = self.app.backend
        self._verify = self.app.tasks[VERIFY_TASK]
        self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="rewardd-celery-io")
        self._poll_io = ThreadPoolExecutor(1, thread_name_prefix="rewardd-celery-poll")
        self._waiters: dict[str, _Waiter] = {}
        self._fair: dict[str, FairQueue[_Queued]] = {}
        """Per Celery queue, the tasks beyond its window, waiting fairly per flow."""
        self._outbox: list[_Queued] = []
        """Admitted tasks the publisher task has yet to send."""
        self._publisher: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task | None = None
        self._chunk_sizes: dict[float, int] = {}
        self._census: dict[str, Any] | None = None
        self._census_at: float | None = None
        self._census_job: Any = None
        self._census_lock = threading.Lock()
        self._depth_client: Any = None
        self._depth_keys: dict[str, list[str]] | None = None
        self._closed = False
        self._entries: dict[str, _Queued] = {}
        """Every task not yet settled (in a fair queue, the outbox or the broker), by id: what
        the watchdog fails fast or publishes again."""
        self._watch_io = ThreadPoolExecutor(1, thread_name_prefix="rewardd-celery-watch")
        self._watchdog: asyncio.Task | None = None
        self._watch_conn: Any = None
        self._fleet: FleetView | None = None
        self._epoch: str | None = None
        self._lost_at: float | None = None
        self._unserved_since: dict[str, float] = {}

    # ---- running calls ----------------------------------------------------------------

    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        """Publish every call as tasks (:meth:`_plan`: big groups split, small ones packed)
        and settle each task as its result arrives: by a callback, not a coroutine per task,
        so a batch of thousands of groups costs the loop no more than the results themselves.
        A task that failed as a whole is replayed one sample per task at once.

        The calls are one flow (:func:`~rewardd.workers.fairness.current_flow`: the request
        the service is serving). At most a window of tasks per Celery queue is in the broker
        (:meth:`_window`); the others wait in the API's fair queue of that Celery queue, and
        each task whose result is read (or that fails, expires or is abandoned) lets the
        next ones out, several at once as one batch.

        Cancelled (a cancelled job): the calls' waiters are dropped at once and their tasks
        revoked (:meth:`_abandon`), so workers skip those still queued; running ones finish
        and their results expire unread (REWARDD_RESULT_TTL_S)."""
        loop = asyncio.get_running_loop()
        flow = current_flow()
        packs = self._plan(calls)
        self._bind_loop()
        self._refresh_windows()
        items: list[list[ItemResult | None]] = [[None] * len(call.samples) for call in calls]
        samples_left = [len(call.samples) for call in calls]
        replayed = [False] * len(calls)
        remaining = len(packs)
        all_done: asyncio.Future = loop.create_future()
        replays: set[asyncio.Task] = set()

        def finish(index: int, result: list[ItemResult]) -> None:
            nonlocal remaining
            position = 0
            for part in packs[index].parts:
                n = len(part.call.samples)
                ci = part.call_index
                items[ci][part.offset:part.offset + n] = result[position:position + n]
                position += n
                samples_left[ci] -= n
                if samples_left[ci] == 0 and on_call_done is not None:
                    on_call_done(ci, CallResult(items[ci], replayed[ci]))
            if progress is not None:
                progress(len(packs[index].samples))
            remaining -= 1
            if remaining == 0 and not all_done.done():
                all_done.set_result(None)

        def replay_done(index: int, task: asyncio.Task) -> None:
            replays.discard(task)
            if task.cancelled():
                self._abandon()  # its single-sample waiters were cancelled with it
                return
            error = task.exception()
            finish(index, task.result() if error is None else _all_failed(
                packs[index], _unavailable(f"{type(error).__name__}: {error}"), 0.0))

        def settled(index: int, future: asyncio.Future) -> None:
            if future.cancelled():
                return
            result = future.result()
            if result is not None:
                finish(index, result)
                return
            for part in packs[index].parts:  # failed as a whole: every sample on its own
                replayed[part.call_index] = True
            metrics.TASK_RETRIES.labels(self.router.queue_for(packs[index].verifier),
                                        "replay").inc()
            task = loop.create_task(self._replay(packs[index], flow))
            replays.add(task)
            task.add_done_callback(functools.partial(replay_done, index))

        futures = self._submit(packs, flow)
        for index, future in enumerate(futures):
            future.add_done_callback(functools.partial(settled, index))
        try:
            if packs:
                await all_done
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            for task in list(replays):
                task.cancel()
            self._abandon()
            raise
        return [CallResult(call_items, was_replayed)  # type: ignore[arg-type]
                for call_items, was_replayed in zip(items, replayed)]

    def _plan(self, calls: Sequence[VerifyCall]) -> list[Pack]:
        """The tasks of a batch (:func:`rewardd.workers.packing.plan`): each verifier's samples
        packed to about :data:`~rewardd.workers.packing.TASKS_PER_SLOT` tasks per worker slot of its
        queue, from the last worker census (no packing before the first one)."""
        self._census_soon()
        slots = self.slots_by_queue()
        targets: dict[str, int] = {}
        if slots:
            totals: dict[str, int] = {}
            for call in calls:
                totals[call.verifier] = totals.get(call.verifier, 0) + len(call.samples)
            for verifier, total in totals.items():
                targets[verifier] = pack_target(total, slots.get(self.router.queue_for(verifier)),
                                                self.settings.task_max_samples)
        return plan(calls, self._max_samples, targets,
                    lambda samples, timeout_s: group_timeout_s(samples, timeout_s, self.settings))

    async def _replay(self, pack: Pack, flow: Flow) -> list[ItemResult]:
        """Every sample of ``pack`` as its own task (never replayed again), in the flow."""
        singles = self._submit([pack.one(i) for i in range(len(pack.samples))], flow)
        return [single[0] for single in await asyncio.gather(*singles)]

    def _max_samples(self, timeout_s: float) -> int:
        """:func:`max_samples_per_task`, remembered per timeout."""
        size = self._chunk_sizes.get(timeout_s)
        if size is None:
            size = self._chunk_sizes[timeout_s] = max_samples_per_task(timeout_s,
                                                                       self.settings)
        return size

    def _submit(self, calls: Sequence[Pack], flow: Flow = DEFAULT_FLOW) -> list[asyncio.Future]:
        """Queue the tasks in their Celery queue's fair queue as one flow; those within the
        queue's window are published at once (one batch, off the event loop), the others as
        earlier tasks settle. Each future gives one ItemResult per sample, or None when a
        task of several samples must be replayed. Cancelling a future drops its task from the
        fair queue, or frees its place in the window (the task is revoked by :meth:`run`)."""
        loop = self._bind_loop()
        futures: list[asyncio.Future] = []
        admitted: list[Ticket[_Queued]] = []
        for call in calls:
            fut = loop.create_future()
            futures.append(fut)
            if not call.samples:
                fut.set_result([])
                continue
            if self._closed:
                fut.set_result(_all_failed(call, _unavailable("executor closed"), 0.0))
                continue
            queue = self.router.queue_for(call.verifier)
            entry = _Queued(uuid(), call, fut, queue, submitted=time.monotonic())
            try:
                entry.ticket, now = self._fair_queue(queue).submit(flow, len(call.samples),
                                                                   entry)
            except QueueClosed:
                fut.set_result(_all_failed(call, _unavailable("executor closed"), 0.0))
                continue
            admitted.extend(now)
            self._entries[entry.task_id] = entry
            fut.add_done_callback(functools.partial(self._leave, entry))
        self._publish_soon(admitted)
        return futures

    # ---- the window: tasks in the broker per queue, the rest in the fair queue -----------

    def _window(self, queue: str) -> int:
        """Tasks of ``queue`` in the broker at most: REWARDD_DISPATCH_WINDOW when set (0:
        no bound), else :data:`WINDOW_PER_SLOT` per worker slot of the queue at the last
        census, else :data:`DEFAULT_WINDOW`."""
        if self.settings.dispatch_window is not None:
            return self.settings.dispatch_window
        slots = self.slots_by_queue().get(queue)
        return WINDOW_PER_SLOT * slots if slots else DEFAULT_WINDOW

    def _fair_queue(self, queue: str) -> FairQueue[_Queued]:
        fair = self._fair.get(queue)
        if fair is None:
            fair = self._fair[queue] = FairQueue(self._window(queue))
        return fair

    def _refresh_windows(self) -> None:
        """Follow the census: a queue whose window grew publishes what it now admits."""
        for queue, fair in list(self._fair.items()):
            window = self._window(queue)
            if window != fair.capacity:
                self._publish_soon(fair.set_capacity(window))

    def _leave(self, entry: _Queued, future: asyncio.Future) -> None:
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

    def _publish_soon(self, admitted: list[Ticket[_Queued]]) -> None:
        """Publish ``admitted`` from the publisher task: releases of one poll tick add up in
        the outbox and go out together, :data:`PUBLISH_SLICE` at a time."""
        if not admitted:
            return
        self._outbox.extend(ticket.item for ticket in admitted)
        if self._publisher is None or self._publisher.done():
            loop = self._loop or asyncio.get_running_loop()
            self._publisher = loop.create_task(self._drain_outbox())

    async def _drain_outbox(self) -> None:
        broker_down: Exception | None = None
        while self._outbox:
            part = [entry for entry in self._outbox[:PUBLISH_SLICE] if not entry.future.done()]
            del self._outbox[:PUBLISH_SLICE]
            if part:
                broker_down = await self._send(part, broker_down)

    async def _send(self, part: list[_Queued],
                    broker_down: Exception | None) -> Exception | None:
        """Publish one slice and watch its results; returns the broker's connection error
        when it was unreachable (the rest of the outbox then fails without waiting out the
        publish retries again)."""
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        if self._closed:
            errors: dict[str, Exception] = {e.task_id: RuntimeError("executor closed")
                                            for e in part}
        elif broker_down is not None:
            errors = {entry.task_id: broker_down for entry in part}
        else:
            try:
                flows = {entry.task_id: entry.ticket.flow for entry in part
                         if entry.ticket is not None}
                errors = await loop.run_in_executor(
                    self._io, self._publish, [(entry.task_id, entry.pack) for entry in part],
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
            if isinstance(error, _Unsendable):  # the payload's fault, never retried
                fut.set_result(_refused(call, error.cause))
                continue
            if error is not None:
                metrics.TASKS.labels(entry.queue, "unavailable").inc()
                fut.set_result(_all_failed(call, _unavailable(
                    f"could not send the call to the broker: {type(error).__name__}: "
                    f"{error}"), 0.0))
                continue
            limit = self.settings.queue_timeout_s + task_time_limits(call)[1]
            self._watch(task_id, fut, started + limit + DEADLINE_SLACK_S,
                        _mapper(call, started, limit), entry.queue, call.verifier, sent)
        if abandoned:
            self._abandon(abandoned)
        return broker_down

    def _publish(self, jobs: list[tuple[str, Pack]],
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
                    buffered: list[tuple[str, Pack]] = []
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

    def _send_each(self, producer: Any, jobs: list[tuple[str, Pack]],
                   errors: dict[str, Exception], sent: list[tuple[str, Pack]],
                   flows: dict[str, Flow]) -> Exception | None:
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
                errors[task_id] = _Unsendable(exc)
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

    # ---- awaiting results ------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop. An executor serves one loop at a time; when called from a new
        one (a test's fresh loop), waiters of the old loop are dropped with it."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._waiters = {}
            self._poller = None
            self._fair = {}
            self._outbox = []
            self._publisher = None
            self._entries = {}
            self._watchdog = None
            self._fleet = None
        if (self._watchdog is None or self._watchdog.done()) and not self._closed:
            self._watchdog = loop.create_task(self._watch_fleet())
        return loop

    def _watch(self, task_id: str, future: asyncio.Future, deadline: float,
               transform: Callable[[Any], Any], queue: str | None = None, verifier: str = "",
               published: float = 0.0) -> None:
        key = self._backend.get_key_for_task(task_id)
        self._waiters[task_id] = _Waiter(key, future, deadline, transform, queue, verifier,
                                         published)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        """Settle waiters until none is left: one fetch per tick (MGET, DEL of what is ready,
        mapping to items, all in the poll thread), then hand the values over in the loop."""
        loop = asyncio.get_running_loop()
        interval = POLL_MIN_S
        failing_since: float | None = None
        while self._waiters:
            batch = list(self._waiters.items())
            try:
                ready: list[tuple[str, Any]] = await loop.run_in_executor(
                    self._poll_io, self._fetch, batch)
                failing_since = None
            except Exception as exc:  # backend unreachable: back off, then give up
                ready = []
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > BACKEND_OUTAGE_S:
                    self._settle_all(_Unavailable(
                        f"result backend unreachable for {BACKEND_OUTAGE_S:g} s: "
                        f"{type(exc).__name__}: {exc}"))
                    break
                interval = min(max(interval * 2, 0.1), 1.0)
            for task_id, value in ready:
                waiter = self._waiters.pop(task_id, None)
                if waiter is not None:
                    waiter.resolve(value)
            now = time.monotonic()
            expired = [(task_id, w) for task_id, w in self._waiters.items() if now >= w.deadline]
            for task_id, waiter in expired:
                del self._waiters[task_id]
                waiter.resolve(waiter.settle(_Expired("deadline")))
            if failing_since is None:
                interval = POLL_MIN_S if ready else min(interval * 1.5, POLL_MAX_S)
            await asyncio.sleep(interval)

    def _fetch(self, batch: list[tuple[str, _Waiter]]) -> list[tuple[str, Any]]:
        """In the poll thread: read every pending result, delete those that are ready, and
        map them to their futures' values. Deleting before handing over means that once a
        call's result is back, Redis holds nothing of it (what ``AsyncResult.forget()``
        does, batched into one DEL)."""
        client = self._backend.client
        keys = [waiter.key for _, waiter in batch]
        raws: list[Any] = []
        for start in range(0, len(keys), MGET_CHUNK):
            raws.extend(client.mget(keys[start:start + MGET_CHUNK]))
        found: list[tuple[str, _Waiter, Any]] = []
        for (task_id, waiter), raw in zip(batch, raws):
            meta = self._decode(raw)
            if isinstance(meta, dict) and meta.get("status") in states.READY_STATES:
                found.append((task_id, waiter, meta))
        if not found:
            return []
        try:
            # one round trip: the redelivery counts (for the metrics), then delete it all
            with client.pipeline(transaction=False) as pipe:
                for task_id, _, _ in found:
                    pipe.hget(deliveries_key(task_id), "redeliveries")
                pipe.delete(*(key for task_id, waiter, _ in found
                              for key in (waiter.key, deliveries_key(task_id))))
                redeliveries = pipe.execute()[:-1]
        except Exception:  # they expire anyway (result_expires)
            log.warning("could not delete %d read results; they expire in %d s", len(found),
                        self.settings.result_ttl_s)
        else:
            _count_redeliveries(found, redeliveries)
        # Celery stores a hard time limit twice (Request.on_timeout, then on_failure), so the
        # second copy may land after the delete: delete those once more, a little later.
        again = [waiter.key for _, waiter, meta in found if _hard_time_limit(meta)]
        if again and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.call_later, REDELETE_AFTER_S,
                                            self._delete_soon, again)
        return [(task_id, waiter.settle(meta)) for task_id, waiter, meta in found]

    def _decode(self, raw: Any) -> Any:
        if raw is None:
            return None
        try:
            return self._backend.decode(raw)  # plain data: exceptions stay dicts
        except Exception as exc:
            return {"status": states.FAILURE,
                    "result": {"exc_type": "UndecodableResult", "exc_message": [str(exc)]}}

    def _delete(self, keys: list[Any]) -> None:
        self._backend.client.delete(*keys)

    def _delete_soon(self, keys: list[Any]) -> None:
        if self._closed:
            return  # the second copy expires with the TTL
        try:
            self._poll_io.submit(self._delete, keys)
        except RuntimeError:  # I/O pool shut down meanwhile
            pass

    def _abandon(self, task_ids: Sequence[str] = ()) -> None:
        """Forget the waiters whose futures were cancelled (their ``run()`` was cancelled)
        and revoke their tasks and ``task_ids`` (one broadcast, in an I/O thread): workers
        skip revoked tasks still queued. The poller stops once no waiter is left."""
        gone = [task_id for task_id, waiter in self._waiters.items()
                if waiter.future.cancelled()]
        for task_id in gone:
            del self._waiters[task_id]
        ids = [*gone, *task_ids]
        if ids and not self._closed:
            try:
                self._io.submit(self._revoke, ids)
            except RuntimeError:  # I/O pool shut down meanwhile (closing)
                pass

    def _revoke(self, task_ids: list[str]) -> None:
        try:
            self.app.control.revoke(task_ids)
        except Exception:  # queued tasks then run and their results expire unread
            log.warning("could not revoke %d tasks of a cancelled run", len(task_ids),
                        exc_info=True)

    def _close_queues(self) -> None:
        """Closing: the tasks still waiting in the fair queues or the outbox settle
        ``unavailable`` (never published)."""
        waiting = [ticket.item for fair in self._fair.values() for ticket in fair.close()]
        waiting.extend(self._outbox)
        self._outbox = []
        for entry in waiting:
            if not entry.future.done():
                entry.future.set_result(_all_failed(entry.pack, _unavailable(
                    "executor closed (the server is shutting down)"), 0.0))

    def _settle_all(self, marker: _Marker) -> None:
        waiters, self._waiters = list(self._waiters.values()), {}
        for waiter in waiters:
            waiter.resolve(waiter.settle(marker))

    # ---- readiness and description ---------------------------------------------------

    async def ready(self, wait_s: float = 5.0) -> bool:
        """From what the watchdog keeps (:meth:`_watch_fleet`), never a task queued behind
        user work: the broker answers, and every queue of REWARDD_READY_QUEUES has a worker
        whose heartbeat is live. A view older than a few heartbeats is refreshed first (at
        most ``wait_s``). Also refreshes the worker census now and then."""
        if self._closed:
            return False
        self._bind_loop()
        self._census_soon()
        view = self._fleet
        if view is None or time.monotonic() - view.at > self._stale_after():
            try:
                view = await asyncio.wait_for(self._look(), wait_s)
            except Exception as exc:  # broker down or too slow: not ready
                self._fleet = view = FleetView(time.monotonic(), f"{type(exc).__name__}: "
                                               f"{exc or f'no answer within {wait_s:g} s'}")
        return view.error is None and not self._unready_queues(view)

    def not_ready_reason(self, wait_s: float = 5.0) -> str:
        view = self._fleet
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

    def _unready_queues(self, view: FleetView) -> list[str]:
        wanted = [q.strip() for q in self.settings.ready_queues.split(",") if q.strip()]
        return [queue for queue in wanted if not view.consumers.get(queue)]

    def _stale_after(self) -> float:
        return max(3 * self.settings.worker_heartbeat_s, 2.0)

    # ---- the watchdog: lost workers, lost tasks, queues nobody serves ----------------------

    async def _watch_fleet(self) -> None:
        """Every REWARDD_WORKER_HEARTBEAT_S for the executor's life: look at the fleet
        (:func:`rewardd.workers.liveness.observe`, in a thread of its own), then fail fast the
        calls of queues without a live consumer and publish again what Redis lost. Idle, it
        costs a few small Redis commands per beat."""
        while not self._closed:
            try:
                await self._look()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._fleet = FleetView(time.monotonic(), f"{type(exc).__name__}: {exc}")
                self._drop_watch_conn()
            try:
                self._act(self._fleet)
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
        self._fleet = view
        return view

    def _observe(self) -> tuple[FleetView, str]:
        """In the watch thread: one :func:`~rewardd.workers.liveness.observe` on a broker
        connection of its own (dropped after an error, remade on the next look)."""
        if self._watch_conn is None:
            self._watch_conn = self.app.connection_for_write()
            self._watch_conn.ensure_connection(max_retries=1, timeout=DEPTH_TIMEOUT_S * 2)
        conn = self._watch_conn
        try:
            return observe(conn.default_channel.client, kombu_restorer(conn), self._declare,
                           self.router.queues, self._epoch, f"api-{id(self)}",
                           self.settings.worker_heartbeat_s, self.settings.worker_lost_after_s)
        except Exception:
            self._drop_watch_conn()
            raise

    def _declare(self, queues: list[str]) -> None:
        """Declare ``queues`` (their bindings) again: Redis lost them, and a message sent
        before a worker re-declares them would go to no queue."""
        with self.app.connection_for_write() as conn:
            for name in queues:
                self.app.amqp.queues[name](conn.default_channel).declare()

    def _drop_watch_conn(self) -> None:
        conn, self._watch_conn = self._watch_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.release()

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
        if self._lost_at is not None and now - self._lost_at >= self.settings.worker_lost_after_s:
            self._republish_lost(view)

    def _fail_unserved(self, now: float) -> None:
        """Calls of a queue no live worker has consumed for REWARDD_NO_CONSUMER_GRACE_S
        (counted from when they were submitted, too): ``unavailable`` now, their published
        tasks revoked, instead of waiting REWARDD_QUEUE_TIMEOUT_S for a worker."""
        grace = self.settings.no_consumer_grace_s
        doomed = [entry for entry in self._entries.values()
                  if entry.queue in self._unserved_since and not entry.future.done()
                  and now - max(self._unserved_since[entry.queue], entry.submitted) >= grace]
        if not doomed:
            return
        revoke = []
        for entry in doomed:
            waiter = self._waiters.pop(entry.task_id, None)
            message = (f"no live worker consumes queue {entry.queue!r} (none for "
                       f"{grace:g} s, REWARDD_NO_CONSUMER_GRACE_S): start `rewardd worker "
                       f"--queues {entry.queue}` or route verifier {entry.pack.verifier!r} "
                       "elsewhere (REWARDD_QUEUE_ROUTES)")
            if waiter is not None:
                revoke.append(entry.task_id)
                waiter.resolve(waiter.settle(_Unavailable(message)))
            else:
                metrics.TASKS.labels(entry.queue, "unavailable").inc()
                entry.future.set_result(_all_failed(entry.pack, _unavailable(message), 0.0))
        log.warning("failed %d task(s) of queue(s) without a live consumer: %s", len(doomed),
                    sorted({entry.queue for entry in doomed}))
        if revoke:
            self._abandon(revoke)

    def _republish_lost(self, view: FleetView) -> None:
        """Redis restarted (or lost its data) at ``_lost_at``: every task published before
        then that is still awaited, that no live worker holds, that is in no queue, not
        unacknowledged and without a result (:func:`~rewardd.workers.liveness.missing_tasks`)
        is published again under the same id (a task that ran twice is read once)."""
        lost_at, self._lost_at = self._lost_at, None
        suspects = [entry for task_id, entry in self._entries.items()
                    if task_id in self._waiters and self._waiters[task_id].published <= lost_at
                    and task_id not in view.held and not entry.future.done()]
        if not suspects:
            return
        keys = [self._waiters[entry.task_id].key for entry in suspects]

        def audit_and_send() -> dict[str, Exception]:
            queue_keys = [k for names in (self._queue_keys() or {}).values() for k in names]
            with self.app.connection_for_write() as conn:
                lost = set(missing_tasks(conn.default_channel.client, self._backend.client,
                                         [e.task_id for e in suspects], keys, queue_keys))
            again = [(e.task_id, e.pack) for e in suspects if e.task_id in lost]
            if again:
                log.warning("publishing %d task(s) again that Redis lost", len(again))
                metrics.TASK_RETRIES.labels(suspects[0].queue, "republished").inc(len(again))
            return self._publish(again) if again else {}

        job = asyncio.get_running_loop().run_in_executor(self._io, audit_and_send)

        def published(done: asyncio.Future) -> None:
            if done.cancelled() or done.exception() is not None or done.result():
                self._lost_at = lost_at  # the broker went away again: audit once more
        job.add_done_callback(published)

    def _census_soon(self) -> None:
        """Start a census in an I/O thread unless one is running or the last is recent.
        Callable from any thread (the loop's /readyz, the /metrics scrape's thread)."""
        with self._census_lock:
            if self._closed or (self._census_job is not None and not self._census_job.done()):
                return
            if (self._census_at is not None
                    and time.monotonic() - self._census_at < CENSUS_EVERY_S):
                return
            try:
                self._census_job = self._io.submit(self._take_census)
            except RuntimeError:  # the I/O pool shut down (closing)
                pass

    async def census(self) -> dict[str, Any]:
        """Take the worker census now (what :meth:`describe` reports) and return it."""
        loop = self._bind_loop()
        await loop.run_in_executor(self._io, self._take_census)
        return dict(self._census or {})

    def _take_census(self) -> None:
        """In an I/O thread: which workers answer a broadcast, the queues each consumes and
        its pool size (:func:`rewardd.workers.celery_app.rewardd_census`), summed per queue."""
        try:
            replies = []
            for _ in range(2):  # a broadcast right after another sometimes hears nothing
                replies = self.app.control.broadcast(CENSUS_COMMAND, reply=True,
                                                     timeout=CENSUS_TIMEOUT_S) or []
                if replies:
                    break
        except Exception as exc:
            self._census = {"workers": None, "error": f"{type(exc).__name__}: {exc}"}
        else:
            workers = {name: answer for reply in replies for name, answer in reply.items()
                       if isinstance(answer, dict)}
            by_queue: dict[str, int] = {}
            slots: dict[str, int] = {}
            for answer in workers.values():
                size = answer.get("slots")
                for queue in answer.get("queues") or []:
                    by_queue[queue] = by_queue.get(queue, 0) + 1
                    if isinstance(size, int) and size > 0:
                        slots[queue] = slots.get(queue, 0) + size
            self._census = {"workers": len(workers), "workers_by_queue": by_queue,
                            "slots_by_queue": slots}
        self._census_at = time.monotonic()

    # ---- scrape-time metrics (rewardd.service.metrics.ScrapeCollector, in the scrape's thread) ----

    def workers_by_queue(self) -> dict[str, int] | None:
        """Workers consuming each queue (every routed queue, 0 when none), from the last
        census; None before the first successful one. Starts a background census when the
        last is older than CENSUS_EVERY_S, so scrapes add no broadcast of their own."""
        self._census_soon()
        census = self._census
        if not census or census.get("workers") is None:
            return None
        counts = dict.fromkeys(self.router.queues, 0)
        counts.update(census.get("workers_by_queue") or {})
        return counts

    def slots_by_queue(self) -> dict[str, int]:
        """Worker slots (pool processes) consuming each queue at the last census; empty
        before the first successful one (then nothing is packed)."""
        census = self._census
        return dict(census.get("slots_by_queue") or {}) if census else {}

    def queue_depths(self) -> dict[str, int] | None:
        """Messages waiting in each routed queue: with the Redis transport a queue is a
        list named like it plus one list per priority step (``cpu\\x06\\x163``...), all
        summed; one pipeline of LLENs on a client of its own with short timeouts. Blocking:
        call it off the event loop. None for a broker that is not Redis."""
        if self._closed:
            return None
        keys = self._queue_keys()
        if keys is None:
            return None
        if self._depth_client is None:
            import redis

            self._depth_client = redis.Redis.from_url(
                self.settings.broker_url, socket_connect_timeout=DEPTH_TIMEOUT_S,
                socket_timeout=DEPTH_TIMEOUT_S)
        with self._depth_client.pipeline(transaction=False) as pipe:
            for names in keys.values():
                for name in names:
                    pipe.llen(name)
            sizes = iter(pipe.execute())
        return {queue: sum(next(sizes) for _ in names) for queue, names in keys.items()}

    def _queue_keys(self) -> dict[str, list[str]] | None:
        """Redis lists of each queue, as kombu's Redis transport names them."""
        if self._depth_keys is None:
            scheme = urlsplit(self.settings.broker_url or "").scheme
            if scheme not in ("redis", "rediss"):
                return None
            from kombu.transport.redis import PRIORITY_STEPS, Channel

            options = self.app.conf.broker_transport_options or {}
            prefix = options.get("global_keyprefix", "")
            steps = sorted(set(options.get("priority_steps", PRIORITY_STEPS)) | {0})
            sep = options.get("sep", Channel.sep)
            self._depth_keys = {
                queue: [f"{prefix}{queue}" if step == 0 else f"{prefix}{queue}{sep}{step}"
                        for step in steps]
                for queue in self.router.queues}
        return self._depth_keys

    def describe(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": self.kind,
            "broker": redact_url(self.settings.broker_url),
            "result_backend": redact_url(self.settings.result_backend_url),
            "queues": self.router.queues,
            "pending_calls": len(self._waiters),
            "fair_queue": {queue: fair.stats() for queue, fair in self._fair.items()},
            "workers": None,
        }
        if self._census is not None and self._census_at is not None:
            body.update(self._census)
            body["census_age_s"] = round(time.monotonic() - self._census_at, 1)
        view = self._fleet
        if view is not None and view.error is None:
            body["consumers_by_queue"] = {q: view.consumers.get(q, 0) for q in self.router.queues}
            body["queues_without_consumer"] = [q for q in self.router.queues
                                               if not view.consumers.get(q)]
            body["heartbeat_age_s"] = round(time.monotonic() - view.at, 1)
        elif view is not None:
            body["broker_error"] = view.error
        return body

    def close(self) -> None:
        """Pending calls settle as ``unavailable``; the I/O threads and connections stop.
        Queued tasks stay in the broker and expire there (``queue_timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            marker = _Unavailable("executor closed")
            if _in_thread_of(loop):
                self._close_queues()
                self._settle_all(marker)
                if self._poller is not None:
                    self._poller.cancel()
            elif loop.is_running():
                loop.call_soon_threadsafe(self._close_queues)
                loop.call_soon_threadsafe(self._settle_all, marker)
        if self._watchdog is not None and loop is not None and not loop.is_closed():
            if _in_thread_of(loop):
                self._watchdog.cancel()
            elif loop.is_running():
                loop.call_soon_threadsafe(self._watchdog.cancel)
        self._io.shutdown(wait=False, cancel_futures=True)
        self._poll_io.shutdown(wait=False, cancel_futures=True)
        self._watch_io.shutdown(wait=False, cancel_futures=True)
        self._drop_watch_conn()
        if self._depth_client is not None:
            try:
                self._depth_client.close()
            except Exception:
                pass
        self.app.close()


# ---- mapping stored results to typed outcomes -------------------------------------------------

class _Unsendable(Exception):
    """A call whose arguments would not pickle for a worker (the cause)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _refused(call: Pack, exc: BaseException) -> list[ItemResult] | None:
    """The items of a pack that could not be sent: one group's samples all get
    :func:`unsendable`'s failure (they share the reference); a pack of several groups is
    replayed one sample per task (None), as when it fails as a whole, so only the culprit
    group's samples fail."""
    if len(call.parts) > 1:
        return None
    return _all_failed(call, unsendable(call.parts[0].call, exc), 0.0)


def _unavailable(message: str) -> Outcome:
    return Outcome.failure(FailureKind.unavailable, message)


def _all_failed(call: Pack, outcome: Outcome, elapsed_s: float) -> list[ItemResult]:
    return [ItemResult(outcome, elapsed_s) for _ in call.samples]


def _mapper(call: Pack, started: float, limit_s: float) -> Callable[[Any], Any]:
    def transform(meta: Any) -> list[ItemResult] | None:
        return to_items(meta, call, time.monotonic() - started, limit_s)
    return transform


def to_items(meta: Any, call: Pack, waited_s: float,
             limit_s: float) -> list[ItemResult] | None:
    """Map a stored Celery result (or a marker) to one typed outcome per sample; never
    raises. None when a call of several samples must be replayed sample by sample (its task
    failed as a whole), exactly where the embedded executor replays."""
    if isinstance(meta, _Expired):
        return _all_failed(call, _unavailable(
            f"no worker finished the call within {limit_s + DEADLINE_SLACK_S:g} s: are "
            "workers consuming its queue?"), waited_s)
    if isinstance(meta, _Marker):
        return _all_failed(call, _unavailable(meta.message), waited_s)
    status = meta.get("status")
    if status == states.REVOKED:
        return _all_failed(call, _unavailable(
            "the call expired in its queue before a worker started it "
            "(REWARDD_QUEUE_TIMEOUT_S)"), waited_s)
    name, message = "UnexpectedResult", f"task state {status}"
    if status == states.SUCCESS:
        data = meta.get("result")
        if isinstance(data, list) and len(data) == len(call.samples):
            try:
                return [ItemResult.from_task(item) for item in data]
            except Exception as exc:
                name, message = type(exc).__name__, str(exc)
        else:
            message = f"the task returned {type(data).__name__}, not {len(call.samples)} items"
    elif status == states.FAILURE:
        exc = meta.get("result") or {}
        name = str(exc.get("exc_type") or "TaskFailed")
        args = exc.get("exc_message") or []
        message = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
    if len(call.samples) > 1 and not keeps_group_whole(call.verifier):
        return None
    if name in ("TimeLimitExceeded", "SoftTimeLimitExceeded"):
        how = ("its worker process was killed and replaced" if name == "TimeLimitExceeded"
               else "the task's time limit stopped it")
        return _all_failed(call, Outcome.failure(
            FailureKind.timeout, f"verifier ran past its {call.timeout_s:g}s limit and could "
            f"not be interrupted; {how}", limit_s=call.timeout_s), call.timeout_s)
    if name in ("WorkerLostError", CallAbandoned.__name__):
        code = parse_exitcode(message)
        return _all_failed(call, Outcome.failure(
            FailureKind.crashed, f"worker process died (exit code {code}): {message}",
            exitcode=code), waited_s)
    return _all_failed(call, _unavailable(f"{name}: {message}"), waited_s)


# ---- task metrics ----------------------------------------------------------------------------

def _observe(waiter: _Waiter, meta: Any) -> None:
    """Count one settled task (``rewardd_tasks_total``) and, for a stored result, its
    publish-to-result latency (``rewardd_task_duration_seconds``). Never raises."""
    try:
        if isinstance(meta, _Expired):
            state = "expired"
        elif isinstance(meta, _Marker):
            state = "unavailable"
        else:
            status = meta.get("status") if isinstance(meta, dict) else None
            state = ("success" if status == states.SUCCESS else
                     "expired" if status == states.REVOKED else "failure")
            if state != "expired":
                metrics.TASK_DURATION.labels(waiter.queue, waiter.verifier).observe(
                    time.monotonic() - waiter.published)
        metrics.TASKS.labels(waiter.queue, state).inc()
    except Exception:  # metrics never break a call
        log.debug("could not record task metrics", exc_info=True)


def _count_redeliveries(found: Sequence[tuple[str, _Waiter, Any]],
                        redeliveries: Sequence[Any]) -> None:
    """``rewardd_task_retries_total{reason="worker_lost"}``: the redeliveries each task's
    guard counted in its ``deliveries_key`` hash (absent: delivered once)."""
    for (_, waiter, _), count in zip(found, redeliveries):
        if count is None or waiter.queue is None:
            continue
        try:
            metrics.TASK_RETRIES.labels(waiter.queue, "worker_lost").inc(int(count))
        except (TypeError, ValueError):
            pass


def _hard_time_limit(meta: Any) -> bool:
    return (isinstance(meta, dict) and meta.get("status") == states.FAILURE
            and isinstance(meta.get("result"), dict)
            and meta["result"].get("exc_type") == "TimeLimitExceeded")


def _in_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return not loop.is_running() and threading.current_thread() is threading.main_thread()
