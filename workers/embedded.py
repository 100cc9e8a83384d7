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

A pool that dies anyway (one of its threads gone for an unforeseen reason, or pebble marking it
broken, as it does when a worker dies while no task runs) is noticed by a watchdog that looks
while calls are pending (:data:`WATCH_EVERY_S`), by every new call and by every readiness
probe; it is replaced by a new pool at once, the calls it held settle as ``unavailable``
(retryable), and ``/readyz`` is not ready, with the reason, until the new pool answers a ping.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import pickle
import threading
import time
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any, Sequence

import pebble
from pebble.common import ProcessExpired

from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ItemResult,
                              ProgressCallback, VerifyCall, keeps_group_whole, unsendable)
from rewardd.workers.tasks import init_worker, ping_task, verify_group_task

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.5
"""How often the watchdog checks the pool while calls are pending: a pool that died holding
calls has them settle as ``unavailable`` within about this long (one ``is_alive`` per pebble
thread per tick: microseconds)."""


START_SLICE = 256
"""Calls started per turn of the event loop (see :meth:`EmbeddedExecutor.run`)."""


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
    """

    kind = "embedded"

    def __init__(self, pool_size: int, plugins: Sequence[str] = ()) -> None:
        self.pool_size = pool_size
        self.plugins = tuple(plugins)
        self.rebuilds = 0
        self.fault: str | None = None
        self._closed = False
        self._pool = self._new_pool()
        self._pending: dict[asyncio.Future, tuple[pebble.ProcessPool, VerifyCall]] = {}
        """Every call not yet settled, with the pool that holds it."""
        self._watchdog: asyncio.Task | None = None

    def _new_pool(self) -> pebble.ProcessPool:
        return pebble.ProcessPool(max_workers=self.pool_size, context=_context(self.plugins),
                                  initializer=init_worker, initargs=(self.plugins,))

    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        """Cancelling the caller cancels every pending pebble task: queued ones are dropped,
        and a running one has its worker stopped and replaced (pebble), so a cancelled job
        frees the pool at once; the pool itself keeps serving.

        The calls start :data:`START_SLICE` at a time with a turn of the event loop between
        slices: starting 10^5 at once queued 10^5 callbacks ahead of every other request."""
        tasks: list[asyncio.Task[CallResult]] = []
        try:
            for start in range(0, len(calls), START_SLICE):
                tasks.extend(asyncio.ensure_future(self._run(call, progress, on_call_done, i))
                             for i, call in enumerate(calls[start:start + START_SLICE], start))
                await asyncio.sleep(0)
            return list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise

    async def _run(self, call: VerifyCall, progress: ProgressCallback | None,
                   on_call_done: CallDoneCallback | None = None, index: int = 0) -> CallResult:
        loop = asyncio.get_running_loop()
        items = await self._submit(loop, call)
        replayed = items is None
        if items is None:
            singles = await asyncio.gather(*(self._submit(loop, call.one(i))
                                             for i in range(len(call.samples))))
            items = [single[0] for single in singles]  # one-sample calls never need replay
        if progress is not None:
            progress(len(call.samples))
        result = CallResult(items, replayed)
        if on_call_done is not None:
            on_call_done(index, result)
        return result

    def _submit(self, loop: asyncio.AbstractEventLoop,
                call: VerifyCall) -> asyncio.Future[list[ItemResult] | None]:
        """Schedule one call; the future gives one ItemResult per sample, or None when a
        call of several samples was killed or its worker died and must be replayed."""
        result: asyncio.Future[list[ItemResult] | None] = loop.create_future()
        if not call.samples:
            result.set_result([])
            return result
        pool = self._live_pool()
        try:
            fut = pool.schedule(run_sealed, args=(_Sealed(call),),
                                timeout=call.hard_limit_s())
        except RuntimeError as exc:  # pool closed or broken
            result.set_result(_all_failed(call, Outcome.failure(
                FailureKind.unavailable, f"executor not running: {exc}"), 0.0))
            return result
        started = time.perf_counter()
        self._pending[result] = (pool, call)
        self._watch(loop)

        def settle(done: Any) -> None:
            items = _to_items(done, call, time.perf_counter() - started)
            try:
                loop.call_soon_threadsafe(_set_if_pending, result, items)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        def forget(done: asyncio.Future) -> None:
            self._pending.pop(done, None)
            if done.cancelled():  # a cancelled job: drop or stop the pebble task
                fut.cancel()

        fut.add_done_callback(settle)
        result.add_done_callback(forget)
        return result

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
        """Settle the pending calls (of ``pool`` only, when given) with ``outcome``; from any
        thread of the loop's, through the futures' own loops."""
        for result, (owner, call) in list(self._pending.items()):
            if pool is None or owner is pool:
                try:
                    result.get_loop().call_soon_threadsafe(_set_if_pending, result,
                                                           _all_failed(call, outcome, 0.0))
                except RuntimeError:  # its loop is closed: nobody waits any more
                    pass

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Keep the watchdog running while calls are pending on ``loop``."""
        if self._watchdog is None or self._watchdog.done() or \
                self._watchdog.get_loop() is not loop:
            self._watchdog = loop.create_task(self._watch_pool())

    async def _watch_pool(self) -> None:
        while self._pending and not self._closed:
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
                "rebuilds": self.rebuilds, "fault": self.fault}

    def close(self) -> None:
        """Stop the workers; calls still pending settle as ``unavailable`` at once."""
        self._closed = True
        self._settle_pending(Outcome.failure(FailureKind.unavailable, "executor closed (the "
                                             "server is shutting down)"))
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
