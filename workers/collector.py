"""The result collector of the Celery executor: awaiting published tasks' results in Redis.

:class:`rewardd.workers.distributed.CeleryExecutor` publishes each task
(:mod:`rewardd.workers.publisher`) and hands its future to a :class:`ResultCollector`, which
settles it exactly once: with the task's stored result mapped to one typed outcome per sample
(:func:`to_items`), or with a marker saying why there is none (no result by the task's
deadline, the backend unreachable for :data:`BACKEND_OUTAGE_S`, the executor closed).

How results are awaited without blocking the event loop: one poller coroutine per executor
asks Redis for every pending result key with a single MGET per tick, in a thread of its own
(redis-py and kombu sockets block), then deletes the keys of the results it read with one DEL
(what ``AsyncResult.forget()`` does, batched; in the same round trip it reads the redelivery
counters, for ``rewardd_task_retries_total``) before handing them over.
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
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from celery import states
from celery.backends.redis import RedisBackend

from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.workers import metrics
from rewardd.workers.celery_app import CallAbandoned, deliveries_key, parse_exitcode
from rewardd.workers.executor import ItemResult, keeps_group_whole
from rewardd.workers.packing import Pack
from rewardd.workers.settings import WorkerSettings

log = logging.getLogger(__name__)

POLL_MIN_S = 0.005
POLL_MAX_S = 0.05
"""Poll interval bounds: back to the minimum whenever a tick found results, else x1.5."""

BACKEND_OUTAGE_S = 30.0
"""While the result backend is unreachable the poller retries with backoff (up to 1 s
apart); after this long without one successful read every pending call is ``unavailable``."""

DEADLINE_SLACK_S = 5.0
"""A call is given up (``unavailable``) this long after the latest moment its task could
still be running: queue timeout (its message expires then) plus its hard time limit."""

MGET_CHUNK = 1000

REDELETE_AFTER_S = 2.0

ResultMeta = dict[str, Any]
"""A stored Celery result, decoded: plain JSON data (``status``, ``result``, ...)."""

TaskValue = list[ItemResult] | None
"""What a task's future gets: one ItemResult per sample of its pack, or None when a task of
several samples failed as a whole and is to be replayed one sample per task."""


class Marker:
    """Why a call settled without a stored result."""

    def __init__(self, message: str) -> None:
        self.message = message


class Expired(Marker):
    """No result by the call's deadline."""


class Unavailable(Marker):
    """Broker or backend unreachable, or the executor closed."""


@dataclass(slots=True)
class Waiter:
    key: bytes | str
    """The result's Redis key (``celery-task-meta-<id>``)."""
    future: asyncio.Future[TaskValue]
    deadline: float
    """time.monotonic() after which the waiter settles as :class:`Expired`."""
    transform: Callable[[ResultMeta | Marker], TaskValue]
    """Turns the decoded result meta (or a marker) into the future's value. Pure, so the
    poller runs it in its thread: mapping thousands of results must not stall the loop."""
    queue: str | None = None
    """The task's queue, for the task metrics (None: not counted, e.g. a readiness ping)."""
    verifier: str = ""
    published: float = 0.0
    """time.monotonic() just before the task was published (for its latency)."""

    def settle(self, meta: ResultMeta | Marker) -> TaskValue:
        """The future's value for ``meta``; never raises. Counts the task in the metrics."""
        if self.queue is not None:
            _observe(self, meta)
        try:
            return self.transform(meta)
        except Exception as exc:  # never leave a request hanging on a mapping bug
            log.exception("could not map a Celery result")
            return self.transform(Unavailable(f"{type(exc).__name__}: {exc}"))

    def resolve(self, value: TaskValue) -> None:
        """In the loop: hand the value over (once)."""
        if not self.future.done():
            self.future.set_result(value)


class ResultCollector:
    """Settles the futures of published tasks from the result backend (see the module doc).

    An executor serves one event loop at a time (:meth:`bind`); everything but
    :meth:`close` and the poll thread's work runs in that loop."""

    def __init__(self, backend: RedisBackend, settings: WorkerSettings) -> None:
        self.backend = backend
        self.settings = settings
        self.closed = False
        self._io = ThreadPoolExecutor(1, thread_name_prefix="rewardd-celery-poll")
        self._waiters: dict[str, Waiter] = {}
        self._poller: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiters(self) -> Mapping[str, Waiter]:
        """Every published task still awaited, by id."""
        return self._waiters

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve ``loop`` from now on: the waiters of the previous loop are dropped with it."""
        self._loop = loop
        self._waiters = {}
        self._poller = None

    def watch(self, task_id: str, future: asyncio.Future[TaskValue], deadline: float,
              transform: Callable[[ResultMeta | Marker], TaskValue], queue: str | None = None,
              verifier: str = "", published: float = 0.0) -> None:
        """Settle ``future`` with ``transform`` of the task's result, or of :class:`Expired`
        once ``deadline`` (time.monotonic()) passed without one."""
        key = self.backend.get_key_for_task(task_id)
        self._waiters[task_id] = Waiter(key, future, deadline, transform, queue, verifier,
                                        published)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    def pop(self, task_id: str) -> Waiter | None:
        """Stop awaiting ``task_id``; its waiter (if it was awaited), for its caller to settle."""
        return self._waiters.pop(task_id, None)

    def forget_cancelled(self) -> list[str]:
        """Drop the waiters whose futures were cancelled (their ``run()`` was cancelled);
        their task ids, for revoking. The poller stops once no waiter is left."""
        gone = [task_id for task_id, waiter in self._waiters.items()
                if waiter.future.cancelled()]
        for task_id in gone:
            del self._waiters[task_id]
        return gone

    def settle_all(self, marker: Marker) -> None:
        """In the loop: every waiter settles with ``marker``."""
        waiters, self._waiters = list(self._waiters.values()), {}
        for waiter in waiters:
            waiter.resolve(waiter.settle(marker))

    def stop_polling(self) -> None:
        """In the loop, closing: the poller stops now instead of at its next tick."""
        if self._poller is not None:
            self._poller.cancel()

    def close(self) -> None:
        """No more deletes are started; the poll thread stops (waiters settle by
        :meth:`settle_all`)."""
        self.closed = True
        self._io.shutdown(wait=False, cancel_futures=True)

    async def _poll(self) -> None:
        """Settle waiters until none is left: one fetch per tick (MGET, DEL of what is ready,
        mapping to items, all in the poll thread), then hand the values over in the loop."""
        loop = asyncio.get_running_loop()
        interval = POLL_MIN_S
        failing_since: float | None = None
        while self._waiters:
            batch = list(self._waiters.items())
            try:
                ready = await loop.run_in_executor(self._io, self._fetch, batch)
                failing_since = None
            except Exception as exc:  # backend unreachable: back off, then give up
                ready = []
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > BACKEND_OUTAGE_S:
                    self.settle_all(Unavailable(
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
                waiter.resolve(waiter.settle(Expired("deadline")))
            if failing_since is None:
                interval = POLL_MIN_S if ready else min(interval * 1.5, POLL_MAX_S)
            await asyncio.sleep(interval)

    def _fetch(self, batch: list[tuple[str, Waiter]]) -> list[tuple[str, TaskValue]]:
        """In the poll thread: read every pending result, delete those that are ready, and
        map them to their futures' values. Deleting before handing over means that once a
        call's result is back, Redis holds nothing of it (what ``AsyncResult.forget()``
        does, batched into one DEL)."""
        client = self.backend.client
        keys = [waiter.key for _, waiter in batch]
        raws: list[bytes | None] = []
        for start in range(0, len(keys), MGET_CHUNK):
            raws.extend(client.mget(keys[start:start + MGET_CHUNK]))
        found: list[tuple[str, Waiter, ResultMeta]] = []
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

    def _decode(self, raw: bytes | None) -> object:
        if raw is None:
            return None
        try:
            return self.backend.decode(raw)  # plain data: exceptions stay dicts
        except Exception as exc:
            return {"status": states.FAILURE,
                    "result": {"exc_type": "UndecodableResult", "exc_message": [str(exc)]}}

    def _delete(self, keys: list[bytes | str]) -> None:
        self.backend.client.delete(*keys)

    def _delete_soon(self, keys: list[bytes | str]) -> None:
        if self.closed:
            return  # the second copy expires with the TTL
        try:
            self._io.submit(self._delete, keys)
        except RuntimeError:  # I/O pool shut down meanwhile
            pass


# ---- mapping stored results to typed outcomes -------------------------------------------------

def unavailable_outcome(message: str) -> Outcome:
    return Outcome.failure(FailureKind.unavailable, message)


def all_failed(call: Pack, outcome: Outcome, elapsed_s: float) -> list[ItemResult]:
    """``outcome`` for every sample of ``call``."""
    return [ItemResult(outcome, elapsed_s) for _ in call.samples]


def item_mapper(call: Pack, started: float,
                limit_s: float) -> Callable[[ResultMeta | Marker], TaskValue]:
    """The :attr:`Waiter.transform` of ``call``'s task, published at ``started``."""
    def transform(meta: ResultMeta | Marker) -> TaskValue:
        return to_items(meta, call, time.monotonic() - started, limit_s)
    return transform


def to_items(meta: ResultMeta | Marker, call: Pack, waited_s: float,
             limit_s: float) -> TaskValue:
    """Map a stored Celery result (or a marker) to one typed outcome per sample; never
    raises. None when a call of several samples must be replayed sample by sample (its task
    failed as a whole), exactly where the embedded executor replays."""
    if isinstance(meta, Expired):
        return all_failed(call, unavailable_outcome(
            f"no worker finished the call within {limit_s + DEADLINE_SLACK_S:g} s: are "
            "workers consuming its queue?"), waited_s)
    if isinstance(meta, Marker):
        return all_failed(call, unavailable_outcome(meta.message), waited_s)
    status = meta.get("status")
    if status == states.REVOKED:
        return all_failed(call, unavailable_outcome(
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
        failure = meta.get("result") or {}
        name = str(failure.get("exc_type") or "TaskFailed")
        args = failure.get("exc_message") or []
        message = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
    if len(call.samples) > 1 and not keeps_group_whole(call.verifier):
        return None
    if name in ("TimeLimitExceeded", "SoftTimeLimitExceeded"):
        how = ("its worker process was killed and replaced" if name == "TimeLimitExceeded"
               else "the task's time limit stopped it")
        return all_failed(call, Outcome.failure(
            FailureKind.timeout, f"verifier ran past its {call.timeout_s:g}s limit and could "
            f"not be interrupted; {how}", limit_s=call.timeout_s), call.timeout_s)
    if name in ("WorkerLostError", CallAbandoned.__name__):
        code = parse_exitcode(message)
        return all_failed(call, Outcome.failure(
            FailureKind.crashed, f"worker process died (exit code {code}): {message}",
            exitcode=code), waited_s)
    return all_failed(call, unavailable_outcome(f"{name}: {message}"), waited_s)


def _hard_time_limit(meta: ResultMeta) -> bool:
    return (isinstance(meta, dict) and meta.get("status") == states.FAILURE
            and isinstance(meta.get("result"), dict)
            and meta["result"].get("exc_type") == "TimeLimitExceeded")


# ---- task metrics ----------------------------------------------------------------------------

def _observe(waiter: Waiter, meta: ResultMeta | Marker) -> None:
    """Count one settled task (``rewardd_tasks_total``) and, for a stored result, its
    publish-to-result latency (``rewardd_task_duration_seconds``). Never raises."""
    try:
        if isinstance(meta, Expired):
            state = "expired"
        elif isinstance(meta, Marker):
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


def _count_redeliveries(found: Sequence[tuple[str, Waiter, ResultMeta]],
                        redeliveries: Sequence[bytes | None]) -> None:
    """``rewardd_task_retries_total{reason="worker_lost"}``: the redeliveries each task's
    guard counted in its ``deliveries_key`` hash (absent: delivered once)."""
    for (_, waiter, _), count in zip(found, redeliveries):
        if count is None or waiter.queue is None:
            continue
        try:
            metrics.TASK_RETRIES.labels(waiter.queue, "worker_lost").inc(int(count))
        except (TypeError, ValueError):
            pass
