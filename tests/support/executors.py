"""Executors for tests that exercise the API without running verifiers."""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from rewardd.verifiers.base import Outcome

from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ItemResult,
                              ProgressCallback, VerifyCall)
from rewardd.workers.tasks import verify_group_task


class RefusingExecutor(Executor):
    """Counts calls to ``run`` and refuses them: for tests where no verifier may run
    (validation rejects first, or the route never verifies)."""

    kind = "refusing"

    def __init__(self) -> None:
        self.run_calls = 0

    async def run(self, calls: Sequence[VerifyCall], progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        self.run_calls += 1
        raise AssertionError(f"executor.run called with {len(calls)} calls; no verifier "
                             "should run here")

    async def ready(self, wait_s: float = 5.0) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def close(self) -> None:
        pass


class GatedExecutor(RefusingExecutor):
    """Answers every check with reward 1 once :attr:`gate` opens: holds requests in flight
    for as long as a test needs (the tenant limiter counts them)."""

    kind = "gated"

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = 0

    async def run(self, calls: Sequence[VerifyCall], progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        self.entered += 1
        await self.gate.wait()
        return [CallResult([ItemResult(Outcome.success(1.0), 0.0) for _ in call.samples])
                for call in calls]


class InlineExecutor(GatedExecutor):
    """Runs each call with the worker's own task function, in this process: real verdicts
    without a pool (the API's tests of what happens after verification)."""

    kind = "inline"

    async def run(self, calls: Sequence[VerifyCall], progress: Any = None,
                  on_call_done: Any = None) -> list[CallResult]:
        results = [CallResult([ItemResult.from_task(item)
                               for item in verify_group_task(*call.task_args())])
                   for call in calls]
        if on_call_done is not None:
            for index, result in enumerate(results):
                on_call_done(index, result)
        return results


class CountingInlineExecutor(InlineExecutor):
    """:class:`InlineExecutor` that notes how many calls each ``run`` got: one executor run
    per batch, with what rides beside it (canaries, audits)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[int] = []

    async def run(self, calls: Sequence[VerifyCall], progress: Any = None,
                  on_call_done: Any = None) -> list[CallResult]:
        self.runs.append(len(calls))
        return await super().run(calls, progress, on_call_done)
