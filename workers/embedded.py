"""The embedded executor: verifier calls in a local pool of killable worker processes.

Why pebble: it is the well-kept library whose process pool enforces a per-task wall-clock
limit by terminating the worker that overran and starting a replacement, which the standard
library's ProcessPoolExecutor cannot do (a hung task there wedges its worker for good).

Workers start from a forkserver that has already imported the verifiers, so a replacement
after a kill costs a fork, not a fresh interpreter plus a sympy import, and forking never
copies the API server's threads.

A task is a whole group (:func:`rewardd.workers.tasks.verify_group_task`), so the IPC round trip and
the parsing of the group's reference are paid once per group; each sample still has its own
limit, enforced in the worker by a soft deadline and backed by the task's hard limit.

Surviving any payload. pebble pickles a task in its scheduler thread and catches only
``PicklingError``, ``TypeError`` and ``AttributeError`` there; anything else (a reference nested
500 levels deep raises ``RecursionError``: pickle spends two levels of the interpreter's 1,000 per
level of nesting) kills that thread, and with it the pool: the call hangs, every later call is
``unavailable``. So a task's arguments travel sealed (:class:`_Sealed`): the seal pickles them
itself, still in pebble's thread, so no cost moves onto the event loop and none is added (a
16-sample group of 78 KB: 73 us sealed, 122 us as pebble pickled it, the seal's inner
``pickle.dumps`` being faster than multiprocessing's pickler). When that fails for any reason
the task carries the call's typed failure instead (:class:`Refused`: ``invalid_reference`` when the reference is
what would not pickle, else ``error``), which the worker hands straight back. Checking the
arguments before scheduling would cost a second full pickle of every call on the event loop.

Fairness between requests. pebble runs its tasks first come, first served, so handing it every
call at once would make a small request wait behind all of a big one. Calls go through a fair
queue (:mod:`rewardd.workers.fairness`, one flow per request) that hands pebble at most
:data:`IN_PEBBLE_S_PER_WORKER` of checks per worker, estimated from each verifier's recent
checks, and never more than :data:`IN_PEBBLE_PER_WORKER` samples; the rest wait there (where
the order is fair, and a flow's urgent calls go first) and start as calls finish. A call of
more than :data:`CHUNK_SAMPLES` samples of a verifier that is not group-level runs as several
chunks, so no single call holds a worker for long; the chunks' items go back in order, and
the replay rule holds per chunk.

A pool that dies anyway (one of its threads gone for an unforeseen reason, or pebble marking it
broken, as it does when a worker dies while no task runs) is noticed by a watchdog that looks
while calls are pending (:data:`WATCH_EVERY_S`), by every new call and by every readiness
probe; it is replaced by a new pool at once, the calls it held settle as ``unavailable``
(retryable), and ``/readyz`` is not ready, with the reason, until the new pool answers a ping.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import multiprocessing
import pickle
import threading
import time
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from typing import Any, Sequence

import pebble
from pebble.common import ProcessExpired

from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ItemResult,
                              ProgressCallback, VerifyCall, keeps_group_whole, unsendable)
from rewardd.workers.fairness import (DEFAULT_FLOW, FairQueue, Flow, QueueClosed, Ticket,
                                      current_flow)
from rewardd.workers.tasks import init_worker, ping_task, verify_group_task

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.5
"""How often the watchdog checks the pool while calls are pending: a pool that died holding
calls has them settle as ``unavailable`` within about this long (one ``is_alive`` per pebble
thread per tick: microseconds)."""


START_SLICE = 256
"""Calls started per turn of the event loop (see :meth:`EmbeddedExecutor.run`)."""

IN_PEBBLE_PER_WORKER = 64
"""Samples handed to pebble per worker at most (the fair queue's capacity, counted in
samples, is ``pool_size`` times this); the others wait in the fair queue. So a new request's
first call starts after at most one chunk's worth of checks per worker (pebble's own queue is
first come, first served: what is in it is ahead of every later request).

Why samples and this many. A finished call frees its place in the event loop (one hop,
which the result needed anyway: settling there costs one ``call_soon_threadsafe`` per call,
as before this queue; freeing it in pebble's result thread instead measured more API CPU per
call) and the next call then crosses pebble's scheduler thread to a worker: milliseconds on a
loaded machine, while a check of a cheap verifier takes microseconds. Bounded in calls, at
``pool_size`` or twice that, the workers idled through those hops (single-tenant throughput
of one-sample ``exact_match`` calls fell by about half); bounded in samples, each worker has
64 checks queued, many cheap calls or one 64-sample chunk, which covers the hop for all but
the cheapest checks. 128 per worker served tiny checks a little faster, but a small request
then waited behind twice as much (bench_load, a 60,000-rollout request beside 8 trainers on
2 workers: their p99 2.2x alone at 128, 1.2x at 64)."""

IN_PEBBLE_S_PER_WORKER = 0.025
"""Estimated seconds of checks handed to pebble per worker at most (the fair queue's
capacity is ``pool_size`` times this, its units each call's estimated duration); a check
counts at least ``IN_PEBBLE_S_PER_WORKER / IN_PEBBLE_PER_WORKER`` (0.4 ms), so cheap checks
keep the bound of :data:`IN_PEBBLE_PER_WORKER` samples, and whatever the estimate every
worker may have one call (the queue's ``floor``: a big call is never held back by its size).

Why time as well as samples. What is in pebble is ahead of every later call, a flow's urgent
ones included: 64 samples of a 20 ms check per worker are 1.3 s of queue, which a streaming
session's group completed during a burst waited out before its event, however urgent
(bench_stream.py --compare, seed 1, pool 8: p99 group delay 260-320 ms against a 120 ms
target; with 25 ms per worker and urgent calls that take their group's along, 50-110 ms in
eight runs of nine, 189 ms in one whose p50 was 50% above the others'; with 50 ms, 75-120 ms
in four). The cost: a worker whose queue ran dry waits for the event loop to hand it the
next call, so in a burst of small calls throughput drops a little, and without urgent calls
the burst's groups wait longer (p99 250-380 ms in four runs where 64 samples gave 260-320 in
six). One big call per worker is always allowed, so a batch keeps every worker busy: 32
groups of 16 such checks on 8 workers took as long as with 64 samples per worker (1.31-1.34 s
both)."""

CHECK_S_WEIGHT = 0.2
"""Weight of a call's mean check time in its verifier's running estimate (an exponential
moving average: a verifier whose checks grow slower is followed within a few calls)."""

CHUNK_SAMPLES = 64
"""Most samples of one pebble task (a bigger call of a verifier that is not group-level is
split): a worker is never held by one call for more than 64 checks, so a waiting flow's turn
comes within one chunk of the calls running. The same bound as a Celery task's
(REWARDD_TASK_MAX_SAMPLES). Each chunk is replayed on its own."""


def _context(plugins: Sequence[str]) -> Any:
    """The forkserver context, preloading the task modules and any verifier plugins.

    The preload list is per process (one forkserver serves every pool of the process), so
    every executor of one process must name the same plugins.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["rewardd.workers.tasks", "rewardd.workers.embedded", *plugins,
                                "rewardd.workers.warm"])
    return ctx


class Refused:
    """What a sealed task becomes when its arguments cannot be pickled: the call's failure,
    one plain-data item per sample, which :func:`run_sealed` returns as the task's result."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items


class _Sealed:
    """One call's task arguments (:meth:`VerifyCall.task_args`), built and pickled by the
    seal itself when pebble sends the task (see the module docstring)."""

    __slots__ = ("call",)

    def __init__(self, call: VerifyCall) -> None:
        self.call = call

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        try:
            blob = pickle.dumps(self.call.task_args(), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # RecursionError, PicklingError, MemoryError: anything
            failure = unsendable(self.call, exc).to_dict()
            return Refused, ([{"outcome": failure, "elapsed_s": 0.0}
                              for _ in self.call.samples],)
        return pickle.loads, (blob,)


def run_sealed(args: tuple[Any, ...] | Refused) -> list[dict[str, Any]]:
    """The task a worker runs: :func:`verify_group_task`, or a refused call's failure."""
    if isinstance(args, Refused):
        return args.items
    return verify_group_task(*args)


@dataclass(eq=False, slots=True)
class _Task:
    """One call on its way through the fair queue and pebble."""

    call: VerifyCall
    result: asyncio.Future
    ticket: Ticket[Any] | None = None
    pool: pebble.ProcessPool | None = None
    fut: Any = None
    """pebble's future, once scheduled."""
    started: float = 0.0
    dropped: bool = False
    """Its caller was cancelled: not to be started, or to be cancelled in pebble."""


class EmbeddedExecutor(Executor):
    """A pebble ProcessPool of ``pool_size`` workers; one task per call (one group).

    Limits: inside the task each sample's check has a soft deadline of ``call.timeout_s``
    (:mod:`rewardd.workers.deadline`); the task as a whole has the hard limit
    :meth:`~rewardd.workers.executor.VerifyCall.hard_limit_s`, after which pebble kills its worker.

    Replay rule: when a call of several samples is killed at its hard limit, its worker dies,
    or its task fails as a whole (a result that will not pickle), nobody knows which sample
    was to blame, so every sample runs again as its own one-sample call. The innocent samples
    get their real outcomes; only the culprit's own call is killed or dies again and becomes
    ``timeout`` or ``crashed`` (or ``unavailable``). Replays are never replayed.

    A dead pool is replaced (module docstring); ``rebuilds`` counts the replacements and
    ``fault`` says why the last one happened until the new pool has answered a ping.

    Every call's place in the fair queue is released exactly once, whichever settles it:
    its result (in the loop), a failure to schedule, a pool rebuild or :meth:`close` (which
    also settles the calls still waiting as ``unavailable``); a cancelled caller's waiting
    calls are dropped at once and its running ones cancelled in pebble.
    """

    kind = "embedded"

    def __init__(self, pool_size: int, plugins: Sequence[str] = ()) -> None:
        self.pool_size = pool_size
        self.plugins = tuple(plugins)
        self.rebuilds = 0
        self.fault: str | None = None
        self._closed = False
        self._pool = self._new_pool()
        self._lock = threading.Lock()
        self._pending: dict[asyncio.Future, _Task] = {}
        """Every call in pebble and not yet settled (guarded by ``_lock``: the result
        thread starts calls too)."""
        self._fair: FairQueue[_Task] = FairQueue(pool_size * IN_PEBBLE_S_PER_WORKER,
                                                 floor=pool_size)
        """Calls beyond :data:`IN_PEBBLE_S_PER_WORKER` wait here, fairly per flow
        (:mod:`~rewardd.workers.fairness`); units: estimated seconds (:meth:`_units`)."""
        self._check_s: dict[str, float] = {}
        """Per verifier, the running estimate of one check's duration (in the loop)."""
        self._watchdog: asyncio.Task | None = None

    def _new_pool(self) -> pebble.ProcessPool:
        return pebble.ProcessPool(max_workers=self.pool_size, context=_context(self.plugins),
                                  initializer=init_worker, initargs=(self.plugins,))

    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        """Cancelling the caller drops its calls still waiting in the fair queue and cancels
        its pebble tasks (a running one has its worker stopped and replaced by pebble), so a
        cancelled job frees the pool at once; the pool itself keeps serving.

        The calls are one flow (:func:`~rewardd.workers.fairness.current_flow`: the request
        the service is serving); at most :data:`IN_PEBBLE_S_PER_WORKER` of checks per
        worker (estimated) are in pebble at once, the others wait in the fair queue. A call
        of more than :data:`CHUNK_SAMPLES` samples of a verifier that is not group-level runs
        as several chunks.

        The calls start :data:`START_SLICE` at a time with a turn of the event loop between
        slices: starting 10^5 at once queued 10^5 callbacks ahead of every other request."""
        flow = current_flow()
        tasks: list[asyncio.Task[CallResult]] = []
        try:
            for start in range(0, len(calls), START_SLICE):
                tasks.extend(asyncio.ensure_future(self._run(call, progress, on_call_done, i,
                                                             flow))
                             for i, call in enumerate(calls[start:start + START_SLICE], start))
                await asyncio.sleep(0)
            return list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise

    async def _run(self, call: VerifyCall, progress: ProgressCallback | None,
                   on_call_done: CallDoneCallback | None = None, index: int = 0,
                   flow: Flow = DEFAULT_FLOW) -> CallResult:
        loop = asyncio.get_running_loop()
        pieces = chunks(call)
        parts = ([await self._run_chunk(loop, call, flow)] if len(pieces) == 1 else
                 await asyncio.gather(*(self._run_chunk(loop, piece, flow) for piece in pieces)))
        items = [item for part_items, _ in parts for item in part_items]
        if progress is not None:
            progress(len(call.samples))
        result = CallResult(items, any(replayed for _, replayed in parts))
        if on_call_done is not None:
            on_call_done(index, result)
        return result

    async def _run_chunk(self, loop: asyncio.AbstractEventLoop, call: VerifyCall,
                         flow: Flow) -> tuple[list[ItemResult], bool]:
        """One chunk, replayed one sample per call when it was killed or its worker died."""
        items = await self._submit(loop, call, flow)
        if items is not None:
            return items, False
        singles = await asyncio.gather(*(self._submit(loop, call.one(i), flow)
                                         for i in range(len(call.samples))))
        return [single[0] for single in singles], True  # one-sample calls never replay

    def _submit(self, loop: asyncio.AbstractEventLoop, call: VerifyCall,
                flow: Flow = DEFAULT_FLOW) -> asyncio.Future[list[ItemResult] | None]:
        """Queue one call in the fair queue; the future gives one ItemResult per sample, or
        None when a call of several samples was killed or its worker died and must be
        replayed. Cancelling the future drops the call (waiting) or its pebble task."""
        result: asyncio.Future[list[ItemResult] | None] = loop.create_future()
        if not call.samples:
            result.set_result([])
            return result
        task = _Task(call, result)
        self._live_pool()  # every new call checks the pool (module docstring)
        try:
            task.ticket, admitted = self._fair.submit(flow, len(call.samples), task,
                                                      self._units(call))
        except QueueClosed:
            result.set_result(_all_failed(call, _closed_outcome(), 0.0))
            return result
        self._watch(loop)
        result.add_done_callback(functools.partial(self._forget, task))
        self._start(admitted)
        return result

    def _start(self, admitted: list[Ticket[_Task]]) -> None:
        """Hand admitted calls to pebble; from the loop or pebble's result thread."""
        todo = collections.deque(admitted)
        while todo:
            ticket = todo.popleft()
            task = ticket.item
            task.ticket = ticket  # (another thread may start it before submit() returned)
            with self._lock:
                dropped = task.dropped
            if dropped:  # its caller gave up between admission and now
                todo.extend(self._fair.release(ticket))
                continue
            pool = self._pool
            try:
                fut = pool.schedule(run_sealed, args=(_Sealed(task.call),),
                                    timeout=task.call.hard_limit_s())
            except RuntimeError as exc:  # pool closed or broken
                todo.extend(self._settle(task, _all_failed(task.call, Outcome.failure(
                    FailureKind.unavailable, f"executor not running: {exc}"), 0.0)))
                continue
            task.started = time.perf_counter()
            with self._lock:
                task.pool, task.fut = pool, fut
                self._pending[task.result] = task
                dropped = task.dropped
            fut.add_done_callback(functools.partial(self._done, task))
            if dropped:
                fut.cancel()

    def _done(self, task: _Task, done: Any) -> None:
        """pebble's result thread: map the outcome, then settle the call, free its slot and
        start the next calls in the loop, with one hop (see :data:`IN_PEBBLE_PER_WORKER`)."""
        items = _to_items(done, task.call, time.perf_counter() - task.started)
        try:
            task.result.get_loop().call_soon_threadsafe(self._done_in_loop, task, items)
        except RuntimeError:  # the loop is closed: nobody waits, but free the slot
            self._start(self._settle(task, items))

    def _units(self, call: VerifyCall) -> float:
        """What ``call`` takes of the fair queue's capacity: its estimated seconds in a
        worker, each check counted at least the share of :data:`IN_PEBBLE_PER_WORKER`."""
        least = IN_PEBBLE_S_PER_WORKER / IN_PEBBLE_PER_WORKER
        return len(call.samples) * max(self._check_s.get(call.verifier, 0.0), least)

    def _learn(self, call: VerifyCall, items: list[ItemResult]) -> None:
        """Fold a finished call's mean check time into its verifier's estimate."""
        if not items:
            return
        mean = sum(item.elapsed_s for item in items) / len(items)
        known = self._check_s.get(call.verifier)
        self._check_s[call.verifier] = mean if known is None else \
            known + CHECK_S_WEIGHT * (mean - known)

    def _done_in_loop(self, task: _Task, items: list[ItemResult] | None) -> None:
        with self._lock:
            self._pending.pop(task.result, None)
        if items is not None:
            self._learn(task.call, items)
        _set_if_pending(task.result, items)
        if task.ticket is not None:
            self._start(self._fair.release(task.ticket))

    def _settle(self, task: _Task, items: list[ItemResult] | None) -> list[Ticket[_Task]]:
        """Settle ``task`` (from any thread) and release its slot: exactly once, whichever
        of pebble's callback, a pool rebuild or the executor's close gets there first (the
        future keeps the first value). Returns the calls this admits, for :meth:`_start`."""
        with self._lock:
            self._pending.pop(task.result, None)
        try:
            task.result.get_loop().call_soon_threadsafe(_set_if_pending, task.result, items)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass
        return self._fair.release(task.ticket) if task.ticket is not None else []

    def _forget(self, task: _Task, done: asyncio.Future) -> None:
        """In the loop, once the call's future is done: a cancelled caller drops the call
        from the fair queue, or cancels its pebble task (whose callback, or a rebuild of a
        dead pool, frees the slot)."""
        if not done.cancelled():
            return
        with self._lock:
            task.dropped = True
            fut = task.fut
        if task.ticket is not None and not self._fair.cancel(task.ticket) \
                and fut is not None:
            fut.cancel()

    def _live_pool(self) -> pebble.ProcessPool:
        """The pool, replaced first when it is dead (a pebble thread gone, or the pool marked
        broken): the calls the dead pool held settle as ``unavailable``, its workers are
        stopped in the background, and :attr:`fault` says what happened."""
        pool = self._pool
        if self._closed or pool.active:
            return pool
        reason = _why_dead(pool)
        self.rebuilds += 1
        self.fault = (f"the worker pool failed ({reason}) and was replaced by a new one "
                      f"(replacement {self.rebuilds}); waiting for its workers to answer")
        log.error("embedded executor: %s", self.fault)
        self._pool = self._new_pool()
        lost = Outcome.failure(FailureKind.unavailable, f"the worker pool failed ({reason}) "
                               "while this call was pending; a new pool serves from now on: "
                               "retry the request")
        self._settle_pending(lost, pool)
        threading.Thread(target=_dispose, args=(pool,), name="rewardd-pool-dispose",
                         daemon=True).start()
        return self._pool

    def _settle_pending(self, outcome: Outcome, pool: pebble.ProcessPool | None = None) -> None:
        """Settle the calls in pebble (of ``pool`` only, when given) with ``outcome`` and
        free their slots (a dead pool never calls back); from any thread, through the
        futures' own loops. The calls this admits go to the current pool."""
        with self._lock:
            tasks = [task for task in self._pending.values()
                     if pool is None or task.pool is pool]
        admitted: list[Ticket[_Task]] = []
        for task in tasks:
            admitted.extend(self._settle(task, _all_failed(task.call, outcome, 0.0)))
        self._start(admitted)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Keep the watchdog running while calls are pending on ``loop``."""
        if self._watchdog is None or self._watchdog.done() or \
                self._watchdog.get_loop() is not loop:
            self._watchdog = loop.create_task(self._watch_pool())

    async def _watch_pool(self) -> None:
        while (self._pending or self._fair.waiting) and not self._closed:
            await asyncio.sleep(WATCH_EVERY_S)
            self._live_pool()

    async def ready(self, wait_s: float = 5.0) -> bool:
        """A ping answered within ``wait_s``. The limit covers queueing too (pebble's own
        timeout starts only when a worker picks the task up), so a pool busy with long calls
        answers "not ready" promptly instead of holding the probe. A dead pool is replaced
        first (and is not ready until the new one answers)."""
        try:
            fut = self._live_pool().schedule(ping_task, timeout=wait_s)
        except RuntimeError:  # pool closed
            return False
        try:
            answered = await asyncio.wait_for(asyncio.wrap_future(fut), wait_s) == "pong"
        except Exception:  # timeout, crash or cancellation of the probe: not ready
            fut.cancel()
            return False
        if answered:
            self.fault = None
        return answered

    def not_ready_reason(self, wait_s: float = 5.0) -> str:
        if self._closed:
            return "the executor is closed (the server is shutting down)"
        return self.fault or super().not_ready_reason(wait_s)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "pool_size": self.pool_size, "active": self._pool.active,
                "rebuilds": self.rebuilds, "fault": self.fault, "fair_queue": self._fair.stats()}

    def close(self) -> None:
        """Stop the workers; calls still pending or waiting settle as ``unavailable`` at once."""
        self._closed = True
        for ticket in self._fair.close():
            ticket.item.ticket = ticket
            self._settle(ticket.item, _all_failed(ticket.item.call, _closed_outcome(), 0.0))
        self._settle_pending(_closed_outcome())
        self._pool.stop()
        self._pool.join(timeout=10)


def _why_dead(pool: pebble.ProcessPool) -> str:
    """Which of pebble's threads died, else that pebble marked the pool broken (reads
    pebble's thread attributes: a diagnosis only, never a decision)."""
    names = {"_task_scheduler_loop": "its task scheduler thread died",
             "_pool_manager_loop": "its pool manager thread died",
             "_message_manager_loop": "its result reader thread died"}
    dead = [text for attr, text in names.items()
            if (thread := getattr(pool, attr, None)) is not None and not thread.is_alive()]
    return "; ".join(dead) or "pebble marked it broken"


def _dispose(pool: pebble.ProcessPool) -> None:
    """Stop a dead pool's workers and threads (in a thread of its own: joining may wait)."""
    try:
        pool.stop()
        pool.join()
    except Exception:  # a half-dead pool: its daemon threads end with the process
        log.exception("embedded executor: could not stop a dead pool cleanly")


def _closed_outcome() -> Outcome:
    return Outcome.failure(FailureKind.unavailable, "executor closed (the server is shutting "
                           "down)")


def chunks(call: VerifyCall, size: int | None = None) -> list[VerifyCall]:
    """``call`` as calls of at most ``size`` (:data:`CHUNK_SAMPLES`) samples, in order, so no
    single call holds a worker for long; a group-level verifier's call stays whole."""
    size = size or CHUNK_SAMPLES
    if len(call.samples) <= size or keeps_group_whole(call.verifier):
        return [call]
    return [replace(call, samples=call.samples[start:start + size])
            for start in range(0, len(call.samples), size)]


def _set_if_pending(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _all_failed(call: VerifyCall, outcome: Outcome, elapsed_s: float) -> list[ItemResult]:
    return [ItemResult(outcome, elapsed_s) for _ in call.samples]


def _to_items(done: Any, call: VerifyCall, waited_s: float) -> list[ItemResult] | None:
    """Map a finished pebble future to one typed outcome per sample; never raises.

    None when the call must be replayed sample by sample: a call of several samples that
    was killed, whose worker died, or whose task failed as a whole. A one-sample call is its
    own culprit, and so is the call of a group-level verifier (every sample gets the
    failure). A cancelled call (executor shutting down) is not replayed.
    """
    replay = len(call.samples) > 1 and not keeps_group_whole(call.verifier)
    try:
        return [ItemResult.from_task(item) for item in done.result()]
    except FutureTimeout:
        if replay:
            return None
        return _all_failed(call, Outcome.failure(
            FailureKind.timeout, f"verifier ran past its {call.timeout_s:g}s limit and could "
            "not be interrupted; its worker process was killed and replaced",
            limit_s=call.timeout_s), call.timeout_s)
    except ProcessExpired as exc:
        if replay:
            return None
        return _all_failed(call, Outcome.failure(
            FailureKind.crashed, f"worker process died (exit code {exc.exitcode})",
            exitcode=exc.exitcode), waited_s)
    except CancelledError:
        return _all_failed(call, Outcome.failure(FailureKind.unavailable, "call cancelled"),
                           waited_s)
    except Exception as exc:  # pickling errors, broken pool: typed, never lost
        if replay:  # e.g. one sample's result would not pickle
            return None
        return _all_failed(call, Outcome.failure(
            FailureKind.unavailable, f"{type(exc).__name__}: {exc}"), waited_s)
