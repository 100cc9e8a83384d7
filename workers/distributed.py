"""The Celery executor: verifier calls on ``rewardd worker`` processes, through Redis.

Same contract as :class:`rewardd.workers.embedded.EmbeddedExecutor`: results in the order of the
calls, every failure a typed outcome, and a task that fails as a whole replayed one sample
per task so that only the culprit fails. A call (a group's samples through one verifier) is
one task, several tasks when it is too big for one, or shares a task with other small
groups when the batch has far more groups than the workers have slots
(:mod:`rewardd.workers.packing`: a task's fixed cost is several milliseconds of CPU). The delivery
guarantees are the Celery app's (:mod:`rewardd.workers.celery_app`).

How the parts fit. :class:`CeleryExecutor` plans a batch into tasks, settles each call as its
tasks settle and replays what failed as a whole; the work is done by four parts, each with
one job and its own module:

* the publisher (:mod:`rewardd.workers.publisher`) admits each task through its Celery
  queue's window (the rest wait fairly per request in the API's fair queue) and publishes it
  from the broker I/O threads, in Redis pipelines; it revokes what a cancelled run abandons;
* the result collector (:mod:`rewardd.workers.collector`) polls the result backend for
  every published task, deletes what it read and maps each stored result (or the reason
  there is none: deadline passed, backend down, executor closed) to typed item results;
  a settled task frees its place in the window, which lets the next ones out;
* the census (:mod:`rewardd.workers.census`) counts the workers and worker slots of each
  queue (packing and the windows follow it) and reads the queues' depths for /metrics;
* the fleet watchdog (:mod:`rewardd.workers.watchdog`) looks at the workers' heartbeats
  every REWARDD_WORKER_HEARTBEAT_S: /readyz is answered from it, calls of a queue nobody
  consumes fail fast, and after a Redis restart what Redis lost is published again.

A task's future is the thread through them: created by the publisher, settled by the
collector (or failed fast by the watchdog), and read here. They share one event loop (the
one :meth:`CeleryExecutor.run` is awaited in) and one pool of :data:`IO_THREADS` broker I/O
threads; the collector and the watchdog each have a thread of their own, so a big publish
never delays reading results or answering /readyz.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from celery import Celery

from rewardd.workers import metrics
from rewardd.workers.celery_app import (create_celery, group_timeout_s, max_samples_per_task,
                                        redact_url)
from rewardd.workers.census import CensusReport, FleetCensus
from rewardd.workers.collector import (ResultCollector, TaskValue, Unavailable, all_failed,
                                       unavailable_outcome)
from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ItemResult,
                                      ProgressCallback, VerifyCall)
from rewardd.workers.fairness import Flow, current_flow
from rewardd.workers.packing import Pack, pack_target, plan
from rewardd.workers.publisher import Publisher
from rewardd.workers.routing import Router
from rewardd.workers.settings import WorkerSettings
from rewardd.workers.watchdog import FleetWatchdog

IO_THREADS = 4
"""Threads for broker I/O: batch publishes (one per request at a time) and the worker census.
The poller has a thread of its own, so a big publish never delays reading results."""


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
      published again under the same id (:meth:`FleetWatchdog._republish_lost
      <rewardd.workers.watchdog.FleetWatchdog._republish_lost>`);
    * a queue with no live consumer: its calls are ``unavailable`` after
      ``no_consumer_grace_s`` (:meth:`FleetWatchdog._fail_unserved
      <rewardd.workers.watchdog.FleetWatchdog._fail_unserved>`);
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

    def __init__(self, settings: WorkerSettings, app: Celery | None = None) -> None:
        self.app = app or create_celery(settings)
        self.router = Router.from_text(settings.queue_routes)
        self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="rewardd-celery-io")
        self.collector = ResultCollector(self.app.backend, settings)
        self.fleet_census = FleetCensus(self.app, self.router, settings, self._io)
        self.publisher = Publisher(self.app, self.router, settings, self._io, self.collector,
                                   self.fleet_census)
        self.watchdog = FleetWatchdog(self.app, self.router, settings, self._io,
                                      self.publisher, self.collector, self.fleet_census)
        self.settings = settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._chunk_sizes: dict[float, int] = {}
        self._closed = False

    @property
    def settings(self) -> WorkerSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: WorkerSettings) -> None:
        """Settings replaced after construction (a test narrows REWARDD_READY_QUEUES) reach
        every part."""
        self._settings = settings
        for part in (self.collector, self.fleet_census, self.publisher, self.watchdog):
            part.settings = settings

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
        (:meth:`Publisher.window <rewardd.workers.publisher.Publisher.window>`); the others
        wait in the API's fair queue of that Celery queue, and each task whose result is read
        (or that fails, expires or is abandoned) lets the next ones out, several at once as
        one batch.

        Cancelled (a cancelled job): the calls' waiters are dropped at once and their tasks
        revoked (:meth:`Publisher.abandon <rewardd.workers.publisher.Publisher.abandon>`), so
        workers skip those still queued; running ones finish and their results expire unread
        (REWARDD_RESULT_TTL_S)."""
        loop = asyncio.get_running_loop()
        flow = current_flow()
        packs = self._plan(calls)
        self._bind_loop()
        self.publisher.refresh_windows()
        items: list[list[ItemResult | None]] = [[None] * len(call.samples) for call in calls]
        samples_left = [len(call.samples) for call in calls]
        replayed = [False] * len(calls)
        remaining = len(packs)
        all_done: asyncio.Future[None] = loop.create_future()
        replays: set[asyncio.Task[list[ItemResult]]] = set()

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
                    on_call_done(ci, CallResult(items[ci], replayed[ci]))  # type: ignore[arg-type]
            if progress is not None:
                progress(len(packs[index].samples))
            remaining -= 1
            if remaining == 0 and not all_done.done():
                all_done.set_result(None)

        def replay_done(index: int, task: asyncio.Task[list[ItemResult]]) -> None:
            replays.discard(task)
            if task.cancelled():
                self.publisher.abandon()  # its single-sample waiters were cancelled with it
                return
            error = task.exception()
            finish(index, task.result() if error is None else all_failed(
                packs[index], unavailable_outcome(f"{type(error).__name__}: {error}"), 0.0))

        def settled(index: int, future: asyncio.Future[TaskValue]) -> None:
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
            self.publisher.abandon()
            raise
        return [CallResult(call_items, was_replayed)  # type: ignore[arg-type]
                for call_items, was_replayed in zip(items, replayed)]

    def _plan(self, calls: Sequence[VerifyCall]) -> list[Pack]:
        """The tasks of a batch (:func:`rewardd.workers.packing.plan`): each verifier's samples
        packed to about :data:`~rewardd.workers.packing.TASKS_PER_SLOT` tasks per worker slot of its
        queue, from the last worker census (no packing before the first one)."""
        self.fleet_census.soon()
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
        return [single[0] for single in await asyncio.gather(*singles)]  # type: ignore[index]

    def _submit(self, packs: Sequence[Pack], flow: Flow) -> list[asyncio.Future[TaskValue]]:
        self._bind_loop()
        return self.publisher.submit(packs, flow)

    def _max_samples(self, timeout_s: float) -> int:
        """:func:`max_samples_per_task`, remembered per timeout."""
        size = self._chunk_sizes.get(timeout_s)
        if size is None:
            size = self._chunk_sizes[timeout_s] = max_samples_per_task(timeout_s,
                                                                       self.settings)
        return size

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop. An executor serves one loop at a time; when called from a new
        one (a test's fresh loop), waiters of the old loop are dropped with it."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self.collector.bind(loop)
            self.publisher.bind(loop)
            self.watchdog.reset()
        if not self._closed:
            self.watchdog.start(loop)
        return loop

    # ---- readiness, census and description ---------------------------------------------

    async def ready(self, wait_s: float = 5.0) -> bool:
        """From what the watchdog keeps (:meth:`FleetWatchdog.ready
        <rewardd.workers.watchdog.FleetWatchdog.ready>`), never a task queued behind user
        work. Also refreshes the worker census now and then."""
        if self._closed:
            return False
        self._bind_loop()
        self.fleet_census.soon()
        return await self.watchdog.ready(wait_s)

    def not_ready_reason(self, wait_s: float = 5.0) -> str:
        return self.watchdog.not_ready_reason(wait_s)

    async def census(self) -> CensusReport:
        """Take the worker census now (what :meth:`describe` reports) and return it."""
        loop = self._bind_loop()
        await loop.run_in_executor(self._io, self.fleet_census.take)
        return self.fleet_census.report()

    # scrape-time metrics (rewardd.service.metrics.ScrapeCollector, in the scrape's thread)

    def workers_by_queue(self) -> dict[str, int] | None:
        """:meth:`FleetCensus.workers_by_queue
        <rewardd.workers.census.FleetCensus.workers_by_queue>`."""
        return self.fleet_census.workers_by_queue()

    def slots_by_queue(self) -> dict[str, int]:
        """:meth:`FleetCensus.slots_by_queue
        <rewardd.workers.census.FleetCensus.slots_by_queue>`."""
        return self.fleet_census.slots_by_queue()

    def queue_depths(self) -> dict[str, int] | None:
        """:meth:`FleetCensus.queue_depths <rewardd.workers.census.FleetCensus.queue_depths>`
        (blocking: call it off the event loop)."""
        return self.fleet_census.queue_depths()

    def describe(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": self.kind,
            "broker": redact_url(self.settings.broker_url),
            "result_backend": redact_url(self.settings.result_backend_url),
            "queues": self.router.queues,
            "pending_calls": len(self.collector.waiters),
            "fair_queue": self.publisher.fair_stats(),
            "workers": None,
        }
        body.update(self.fleet_census.describe())
        body.update(self.watchdog.describe())
        return body

    def close(self) -> None:
        """Pending calls settle as ``unavailable``; the I/O threads and connections stop.
        Queued tasks stay in the broker and expire there (``queue_timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        for part in (self.publisher, self.collector, self.fleet_census, self.watchdog):
            part.close()  # nothing new starts; threads and connections are released
        loop = self._loop
        if loop is not None and not loop.is_closed():
            marker = Unavailable("executor closed")
            if _in_thread_of(loop):
                self.publisher.close_queues()
                self.collector.settle_all(marker)
                self.collector.stop_polling()
                self.watchdog.stop()
            elif loop.is_running():
                loop.call_soon_threadsafe(self.publisher.close_queues)
                loop.call_soon_threadsafe(self.collector.settle_all, marker)
                loop.call_soon_threadsafe(self.watchdog.stop)
        self._io.shutdown(wait=False, cancel_futures=True)
        self.app.close()


def _in_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return not loop.is_running() and threading.current_thread() is threading.main_thread()
