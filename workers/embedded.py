"""The embedded executor: verifier calls in a local pool of killable worker processes.

Why pebble: it is the well-kept library whose process pool enforces a per-task wall-clock
limit by terminating the worker that overran and starting a replacement, which the standard
library's ProcessPoolExecutor cannot do (a hung task there wedges its worker for good).

Workers start from a forkserver that has already imported the verifiers, so a replacement
after a kill costs a fork, not a fresh interpreter plus a sympy import, and forking never
copies the API server's threads.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any, Sequence

import pebble
from pebble.common import ProcessExpired

from verifiers.base import FailureKind, Outcome
from workers.executor import CallResult, Executor, ProgressCallback, VerifyCall
from workers.tasks import ping_task, verify_task


def _context(plugins: Sequence[str]) -> Any:
    """The forkserver context, preloading the task module and any verifier plugins.

    The preload list is per process (one forkserver serves every pool of the process), so
    every executor of one process must name the same plugins.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["workers.tasks", *plugins, "workers.warm"])
    return ctx


class EmbeddedExecutor(Executor):
    """A pebble ProcessPool of ``pool_size`` workers; one call per task, each with its limit."""

    kind = "embedded"

    def __init__(self, pool_size: int, plugins: Sequence[str] = ()) -> None:
        self.pool_size = pool_size
        self._pool = pebble.ProcessPool(max_workers=pool_size, context=_context(plugins))

    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None) -> list[CallResult]:
        loop = asyncio.get_running_loop()
        pending = [self._submit(loop, call) for call in calls]
        if progress is not None:
            for fut in pending:
                fut.add_done_callback(lambda _f: progress(1))
        return list(await asyncio.gather(*pending))

    def _submit(self, loop: asyncio.AbstractEventLoop, call: VerifyCall) -> asyncio.Future:
        sample = {"completion": call.sample.completion, "prompt": call.sample.prompt,
                  "num_tokens": call.sample.num_tokens}
        result: asyncio.Future = loop.create_future()
        try:
            fut = self._pool.schedule(
                verify_task, args=(call.verifier, sample, dict(call.reference), dict(call.params)),
                timeout=call.timeout_s)
        except RuntimeError as exc:  # pool closed or broken
            result.set_result(CallResult(
                Outcome.failure(FailureKind.unavailable, f"executor not running: {exc}"), 0.0))
            return result
        started = time.perf_counter()

        def settle(done: Any) -> None:
            call_result = _to_call_result(done, call.timeout_s, time.perf_counter() - started)
            loop.call_soon_threadsafe(_set_if_pending, result, call_result)

        fut.add_done_callback(settle)
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


def _set_if_pending(fut: asyncio.Future, value: CallResult) -> None:
    if not fut.done():
        fut.set_result(value)


def _to_call_result(done: Any, timeout_s: float, waited_s: float) -> CallResult:
    """Map a finished pebble future to a typed outcome; never raises."""
    try:
        outcome, elapsed = done.result()
        return CallResult(Outcome.from_dict(outcome), elapsed)
    except FutureTimeout:
        return CallResult(Outcome.failure(
            FailureKind.timeout, f"verifier ran past its {timeout_s:g}s limit; "
            "its worker process was killed and replaced", limit_s=timeout_s), timeout_s)
    except ProcessExpired as exc:
        return CallResult(Outcome.failure(
            FailureKind.crashed, f"worker process died (exit code {exc.exitcode})",
            exitcode=exc.exitcode), waited_s)
    except CancelledError:
        return CallResult(Outcome.failure(FailureKind.unavailable, "call cancelled"), waited_s)
    except Exception as exc:  # pickling errors, broken pool: typed, never lost
        return CallResult(Outcome.failure(
            FailureKind.unavailable, f"{type(exc).__name__}: {exc}"), waited_s)
