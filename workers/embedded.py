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
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any, Sequence

import pebble
from pebble.common import ProcessExpired

from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ItemResult,
                              ProgressCallback, VerifyCall, keeps_group_whole)
from rewardd.workers.tasks import init_worker, ping_task, verify_group_task


def _context(plugins: Sequence[str]) -> Any:
    """The forkserver context, preloading the task module and any verifier plugins.

    The preload list is per process (one forkserver serves every pool of the process), so
    every executor of one process must name the same plugins.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["rewardd.workers.tasks", *plugins, "rewardd.workers.warm"])
    return ctx


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
    """

    kind = "embedded"

    def __init__(self, pool_size: int, plugins: Sequence[str] = ()) -> None:
        self.pool_size = pool_size
        self._pool = pebble.ProcessPool(max_workers=pool_size, context=_context(plugins),
                                        initializer=init_worker, initargs=(tuple(plugins),))

    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        """Cancelling the caller cancels every pending pebble task: queued ones are dropped,
        and a running one has its worker stopped and replaced (pebble), so a cancelled job
        frees the pool at once; the pool itself keeps serving."""
        return list(await asyncio.gather(*(self._run(call, progress, on_call_done, index)
                                           for index, call in enumerate(calls))))

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
        try:
            fut = self._pool.schedule(verify_group_task, args=call.task_args(),
                                      timeout=call.hard_limit_s())
        except RuntimeError as exc:  # pool closed or broken
            result.set_result(_all_failed(call, Outcome.failure(
                FailureKind.unavailable, f"executor not running: {exc}"), 0.0))
            return result
        started = time.perf_counter()

        def settle(done: Any) -> None:
            items = _to_items(done, call, time.perf_counter() - started)
            loop.call_soon_threadsafe(_set_if_pending, result, items)

        fut.add_done_callback(settle)
        # the awaiting task was cancelled (a cancelled job): drop or stop the pebble task
        result.add_done_callback(lambda done: fut.cancel() if done.cancelled() else None)
        return result

    async def ready(self, wait_s: float = 5.0) -> bool:
        """A ping answered within ``wait_s``. The limit covers queueing too (pebble's own
        timeout starts only when a worker picks the task up), so a pool busy with long calls
        answers "not ready" promptly instead of holding the probe."""
        try:
            fut = self._pool.schedule(ping_task, timeout=wait_s)
        except RuntimeError:  # pool closed or broken
            return False
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), wait_s) == "pong"
        except Exception:  # timeout, crash or cancellation of the probe: not ready
            fut.cancel()
            return False

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "pool_size": self.pool_size, "active": self._pool.active}

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=10)


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
