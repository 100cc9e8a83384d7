"""The Celery executor: verifier calls on ``rewardd worker`` processes, through Redis.

Same contract as :class:`workers.embedded.EmbeddedExecutor`: one task per call (a group's
samples through one verifier), results in the order of the calls, every failure a typed
outcome, and a group whose task fails as a whole replayed one sample per call so that only
the culprit fails. The delivery guarantees are the Celery app's (:mod:`workers.celery_app`).

How results are awaited without blocking the event loop: one poller coroutine per executor
asks Redis for every pending result key with a single MGET per tick, in a thread of its own
(redis-py and kombu sockets block), then deletes the keys of the results it read with one DEL
(what ``AsyncResult.forget()`` does, batched) before handing them over. Publishing runs in a
small pool of threads (:data:`IO_THREADS`), :data:`PUBLISH_SLICE` calls at a time on one
producer connection.
The cost: a result is noticed up to one tick late (:data:`POLL_MIN_S` right after results
arrived, backing off to :data:`POLL_MAX_S` while nothing does), and while calls are pending
Redis answers 20 to 200 MGETs a second per API process, each for all pending keys (64 bytes
each). Idle, it costs nothing. The alternative, ``AsyncResult.get()`` in threads, would hold
a thread per pending call (thousands for one big batch) or serialize them; subscribing to
Celery's result pub/sub channels would save the polling but lose results published while
(re)subscribing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from celery import states
from celery.utils import uuid
from kombu.exceptions import OperationalError

from service.settings import Settings
from verifiers.base import FailureKind, Outcome
from workers.celery_app import (PING_TASK, VERIFY_TASK, CallAbandoned, create_celery,
                                deliveries_key, max_samples_per_task, parse_exitcode,
                                redact_url, task_time_limits)
from workers.executor import CallResult, Executor, ItemResult, ProgressCallback, VerifyCall
from workers.routing import DEFAULT_QUEUE, Router

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
"""The worker census (for /readyz) is one broadcast that collects replies for
CENSUS_TIMEOUT_S, taken in the background at most every CENSUS_EVERY_S."""

MGET_CHUNK = 1000

PUBLISH_SLICE = 128
"""Calls published per trip to the I/O thread: results of the first slices are read while
later ones are still being sent (publishing costs about 1.5 ms of CPU per task in kombu and
redis-py on a small VM, which is why one task carries a whole group)."""

REDELETE_AFTER_S = 2.0


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

    def settle(self, meta: Any) -> Any:
        """The future's value for ``meta``; never raises."""
        try:
            return self.transform(meta)
        except Exception as exc:  # never leave a request hanging on a mapping bug
            log.exception("could not map a Celery result")
            return self.transform(_Unavailable(f"{type(exc).__name__}: {exc}"))

    def resolve(self, value: Any) -> None:
        """In the loop: hand the value over (once)."""
        if not self.future.done():
            self.future.set_result(value)


class CeleryExecutor(Executor):
    """Publishes each call to its verifier's queue and awaits the results in Redis.

    Limits and failures, as in the embedded executor:

    * each sample's check has ``call.timeout_s`` (the soft deadline inside the worker);
    * the task has Celery's soft limit at the call's hard limit and is killed shortly after
      (:func:`workers.celery_app.task_time_limits`): a one-sample call becomes ``timeout``;
    * a worker child that dies under a task gets it redelivered up to
      ``worker_lost_retries`` times; then a one-sample call is ``crashed``;
    * a call of several samples whose task failed as a whole (time limit, worker lost past
      the budget, a result that would not serialize) is replayed one sample per call;
    * broker or backend down, a call that expired in its queue
      (``queue_timeout_s``) or no result by its deadline: ``unavailable``, not replayed.

    A group larger than :func:`~workers.celery_app.max_samples_per_task` is sent as several
    tasks (chunks), so no task outlives the broker's visibility timeout; chunks are replayed
    independently and their items concatenated in order.
    """

    kind = "celery"

    def __init__(self, settings: Settings, app: Any = None) -> None:
        self.settings = settings
        self.app = app or create_celery(settings)
        self.router = Router.from_text(settings.queue_routes)
        self._backend = self.app.backend
        self._verify = self.app.tasks[VERIFY_TASK]
        self._ping = self.app.tasks[PING_TASK]
        self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="rewardd-celery-io")
        self._poll_io = ThreadPoolExecutor(1, thread_name_prefix="rewardd-celery-poll")
        self._waiters: dict[str, _Waiter] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task | None = None
        self._chunk_sizes: dict[float, int] = {}
        self._census: dict[str, Any] | None = None
        self._census_at: float | None = None
        self._census_job: Any = None
        self._closed = False

    # ---- running calls ----------------------------------------------------------------

    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None) -> list[CallResult]:
        """Publish every call (as tasks of at most :func:`max_samples_per_task` samples) and
        settle each task as its result arrives: by a callback, not a coroutine per call, so a
        batch of thousands of groups costs the loop no more than the results themselves. A
        task that failed as a whole is replayed one sample per task at once."""
        loop = asyncio.get_running_loop()
        chunked = [self._split(call) for call in calls]
        tasks = [chunk for chunks in chunked for chunk in chunks]
        items: list[list[ItemResult]] = [[] for _ in tasks]
        replayed = [False] * len(tasks)
        remaining = len(tasks)
        all_done: asyncio.Future = loop.create_future()
        replays: set[asyncio.Task] = set()

        def finish(index: int, result: list[ItemResult]) -> None:
            nonlocal remaining
            items[index] = result
            if progress is not None:
                progress(len(tasks[index].samples))
            remaining -= 1
            if remaining == 0 and not all_done.done():
                all_done.set_result(None)

        def replay_done(index: int, task: asyncio.Task) -> None:
            replays.discard(task)
            if task.cancelled():
                return
            error = task.exception()
            finish(index, task.result() if error is None else _all_failed(
                tasks[index], _unavailable(f"{type(error).__name__}: {error}"), 0.0))

        def settled(index: int, future: asyncio.Future) -> None:
            if future.cancelled():
                return
            result = future.result()
            if result is not None:
                finish(index, result)
                return
            replayed[index] = True  # the task failed as a whole: every sample on its own
            task = loop.create_task(self._replay(tasks[index]))
            replays.add(task)
            task.add_done_callback(functools.partial(replay_done, index))

        for index, future in enumerate(await self._submit(tasks)):
            future.add_done_callback(functools.partial(settled, index))
        if tasks:
            await all_done
        results, index = [], 0
        for chunks in chunked:
            parts = range(index, index + len(chunks))
            index += len(chunks)
            results.append(CallResult([item for i in parts for item in items[i]],
                                      any(replayed[i] for i in parts)))
        return results

    async def _replay(self, chunk: VerifyCall) -> list[ItemResult]:
        """Every sample of ``chunk`` as its own task (never replayed again)."""
        singles = await self._submit([chunk.one(i) for i in range(len(chunk.samples))])
        return [single[0] for single in await asyncio.gather(*singles)]

    def _split(self, call: VerifyCall) -> list[VerifyCall]:
        """The call as tasks of at most :func:`max_samples_per_task` samples each."""
        size = self._chunk_sizes.get(call.timeout_s)
        if size is None:
            size = self._chunk_sizes[call.timeout_s] = max_samples_per_task(call.timeout_s,
                                                                            self.settings)
        if len(call.samples) <= size:
            return [call]
        return [replace(call, samples=call.samples[i:i + size])
                for i in range(0, len(call.samples), size)]

    async def _submit(self, calls: Sequence[VerifyCall]) -> list[asyncio.Future]:
        """Publish the calls (one batch, off the event loop); each future gives one
        ItemResult per sample, or None when a call of several samples must be replayed."""
        loop = self._bind_loop()
        futures: list[asyncio.Future] = []
        jobs: list[tuple[str, VerifyCall, asyncio.Future]] = []
        for call in calls:
            fut = loop.create_future()
            futures.append(fut)
            if not call.samples:
                fut.set_result([])
            elif self._closed:
                fut.set_result(_all_failed(call, _unavailable("executor closed"), 0.0))
            else:
                jobs.append((uuid(), call, fut))
        broker_down: Exception | None = None
        for start in range(0, len(jobs), PUBLISH_SLICE):
            part = jobs[start:start + PUBLISH_SLICE]
            if broker_down is not None:  # do not wait out the publish retries again
                errors: dict[str, Exception] = {task_id: broker_down for task_id, _, _ in part}
            else:
                try:
                    errors = await loop.run_in_executor(
                        self._io, self._publish, [(task_id, call) for task_id, call, _ in part])
                except Exception as exc:  # the I/O pool shut down under us (closing)
                    errors = {task_id: exc for task_id, _, _ in part}
                broker_down = next((e for e in errors.values()
                                    if isinstance(e, OperationalError)), None)
            started = time.monotonic()
            for task_id, call, fut in part:
                error = errors.get(task_id)
                if error is not None:
                    fut.set_result(_all_failed(call, _unavailable(
                        f"could not send the call to the broker: {type(error).__name__}: "
                        f"{error}"), 0.0))
                    continue
                limit = self.settings.queue_timeout_s + task_time_limits(call)[1]
                self._watch(task_id, fut, started + limit + DEADLINE_SLACK_S,
                            _mapper(call, started, limit))
        return futures

    def _publish(self, jobs: list[tuple[str, VerifyCall]]) -> dict[str, Exception]:
        """In an I/O thread: one task per call on one producer connection. Returns the
        calls that could not be sent. Once the broker is unreachable (after the publish
        retries) the rest of the batch is not tried."""
        errors: dict[str, Exception] = {}
        try:
            with self.app.producer_or_acquire() as producer:
                for index, (task_id, call) in enumerate(jobs):
                    soft, hard = task_time_limits(call)
                    try:
                        self._verify.apply_async(
                            args=call.task_args(), task_id=task_id, producer=producer,
                            queue=self.router.queue_for(call.verifier),
                            soft_time_limit=soft, time_limit=hard,
                            expires=self.settings.queue_timeout_s,
                            # monitoring reprs of the arguments: Celery would build them
                            # with saferepr, about 40% of the cost of publishing a group
                            argsrepr=call.verifier, kwargsrepr="")
                    except OperationalError as exc:  # broker down: the rest would fail too
                        errors.update((tid, exc) for tid, _ in jobs[index:])
                        break
                    except Exception as exc:  # this call only (e.g. not JSON-serializable)
                        errors[task_id] = exc
        except Exception as exc:  # no producer connection at all
            errors.update((tid, exc) for tid, _ in jobs if tid not in errors)
        return errors

    # ---- awaiting results ------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop. An executor serves one loop at a time; when called from a new
        one (a test's fresh loop), waiters of the old loop are dropped with it."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._waiters = {}
            self._poller = None
        return loop

    def _watch(self, task_id: str, future: asyncio.Future, deadline: float,
               transform: Callable[[Any], Any]) -> None:
        key = self._backend.get_key_for_task(task_id)
        self._waiters[task_id] = _Waiter(key, future, deadline, transform)
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
            client.delete(*(key for task_id, waiter, _ in found
                            for key in (waiter.key, deliveries_key(task_id))))
        except Exception:  # they expire anyway (result_expires)
            log.warning("could not delete %d read results; they expire in %d s", len(found),
                        self.settings.result_ttl_s)
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

    def _settle_all(self, marker: _Marker) -> None:
        waiters, self._waiters = list(self._waiters.values()), {}
        for waiter in waiters:
            waiter.resolve(waiter.settle(marker))

    # ---- readiness and description ---------------------------------------------------

    async def ready(self, wait_s: float = 5.0) -> bool:
        """A ping task on the ``cpu`` queue answered within ``wait_s`` (so the broker, the
        backend and at least one worker for the common verifiers are up). The ping expires
        after ``wait_s``: a worker that shows up later discards it instead of answering a
        question nobody is asking any more. Also refreshes the worker census now and then."""
        if self._closed:
            return False
        loop = self._bind_loop()
        self._maybe_census(loop)
        started = time.monotonic()
        task_id = uuid()
        try:
            await asyncio.wait_for(loop.run_in_executor(self._io, self._publish_ping, task_id,
                                                        wait_s), wait_s)
        except Exception:  # broker down or too slow: not ready
            return False
        future = loop.create_future()
        self._watch(task_id, future, started + wait_s, lambda meta: meta)
        try:
            meta = await asyncio.wait_for(future, wait_s + 1.0)
        except asyncio.TimeoutError:
            self._waiters.pop(task_id, None)
            return False
        if not isinstance(meta, dict) or meta.get("status") != states.SUCCESS:
            return False
        answer = meta.get("result") or {}
        if not answer.get("soft_deadline", True):
            log.warning("a worker runs tasks off its main thread: per-sample soft deadlines "
                        "cannot arm there (start workers with `rewardd worker`)")
        return answer.get("pong") == "pong"

    def _publish_ping(self, task_id: str, wait_s: float) -> None:
        self._ping.apply_async(task_id=task_id, queue=DEFAULT_QUEUE, expires=wait_s,
                               retry=False)

    def _maybe_census(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._census_job is not None and not self._census_job.done():
            return
        if self._census_at is not None and time.monotonic() - self._census_at < CENSUS_EVERY_S:
            return
        self._census_job = loop.run_in_executor(self._io, self._take_census)

    async def census(self) -> dict[str, Any]:
        """Take the worker census now (what :meth:`describe` reports) and return it."""
        loop = self._bind_loop()
        await loop.run_in_executor(self._io, self._take_census)
        return dict(self._census or {})

    def _take_census(self) -> None:
        """In an I/O thread: which workers answer a broadcast, and the queues each consumes."""
        try:
            replies = self.app.control.inspect(timeout=CENSUS_TIMEOUT_S).active_queues() or {}
        except Exception as exc:
            self._census = {"workers": None, "error": f"{type(exc).__name__}: {exc}"}
        else:
            by_queue: dict[str, int] = {}
            for queues in replies.values():
                for queue in queues or []:
                    by_queue[queue["name"]] = by_queue.get(queue["name"], 0) + 1
            self._census = {"workers": len(replies), "workers_by_queue": by_queue}
        self._census_at = time.monotonic()

    def describe(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": self.kind,
            "broker": redact_url(self.settings.broker_url),
            "result_backend": redact_url(self.settings.result_backend_url),
            "queues": self.router.queues,
            "pending_calls": len(self._waiters),
            "workers": None,
        }
        if self._census is not None and self._census_at is not None:
            body.update(self._census)
            body["census_age_s"] = round(time.monotonic() - self._census_at, 1)
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
                self._settle_all(marker)
                if self._poller is not None:
                    self._poller.cancel()
            elif loop.is_running():
                loop.call_soon_threadsafe(self._settle_all, marker)
        self._io.shutdown(wait=False, cancel_futures=True)
        self._poll_io.shutdown(wait=False, cancel_futures=True)
        self.app.close()


# ---- mapping stored results to typed outcomes -------------------------------------------------

def _unavailable(message: str) -> Outcome:
    return Outcome.failure(FailureKind.unavailable, message)


def _all_failed(call: VerifyCall, outcome: Outcome, elapsed_s: float) -> list[ItemResult]:
    return [ItemResult(outcome, elapsed_s) for _ in call.samples]


def _mapper(call: VerifyCall, started: float, limit_s: float) -> Callable[[Any], Any]:
    def transform(meta: Any) -> list[ItemResult] | None:
        return to_items(meta, call, time.monotonic() - started, limit_s)
    return transform


def to_items(meta: Any, call: VerifyCall, waited_s: float,
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
    if len(call.samples) > 1:
        return None
    if name in ("TimeLimitExceeded", "SoftTimeLimitExceeded"):
        how = ("its worker process was killed and replaced" if name == "TimeLimitExceeded"
               else "the task's time limit stopped it")
        return [ItemResult(Outcome.failure(
            FailureKind.timeout, f"verifier ran past its {call.timeout_s:g}s limit and could "
            f"not be interrupted; {how}", limit_s=call.timeout_s), call.timeout_s)]
    if name in ("WorkerLostError", CallAbandoned.__name__):
        code = parse_exitcode(message)
        return [ItemResult(Outcome.failure(
            FailureKind.crashed, f"worker process died (exit code {code}): {message}",
            exitcode=code), waited_s)]
    return _all_failed(call, _unavailable(f"{name}: {message}"), waited_s)


def _hard_time_limit(meta: Any) -> bool:
    return (isinstance(meta, dict) and meta.get("status") == states.FAILURE
            and isinstance(meta.get("result"), dict)
            and meta["result"].get("exc_type") == "TimeLimitExceeded")


def _in_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return not loop.is_running() and threading.current_thread() is threading.main_thread()
