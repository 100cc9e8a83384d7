"""An executor for tests that exercise the API without running verifiers."""

from __future__ import annotations

from typing import Any, Sequence

from workers.executor import CallResult, Executor, ProgressCallback, VerifyCall


class RefusingExecutor(Executor):
    """Counts calls to ``run`` and refuses them: for tests where no verifier may run
    (validation rejects first, or the route never verifies)."""

    kind = "refusing"

    def __init__(self) -> None:
        self.run_calls = 0

    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None) -> list[CallResult]:
        self.run_calls += 1
        raise AssertionError(f"executor.run called with {len(calls)} calls; no verifier "
                             "should run here")

    async def ready(self, wait_s: float = 5.0) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def close(self) -> None:
        pass
