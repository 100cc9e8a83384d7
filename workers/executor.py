"""The executor interface the service plans against.

The service turns a request into a list of :class:`VerifyCall` and awaits a list of
:class:`CallResult` in the same order. Whether the calls run in local process pools or on
Celery workers is the executor's business; every failure mode (timeout, crash, broken pool)
comes back as a typed :class:`~verifiers.base.Outcome`, never as an exception or a 0.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from verifiers.base import Outcome, Sample

ProgressCallback = Callable[[int], None]
"""Called with the number of calls that just finished (for progress bars)."""


@dataclass(frozen=True, slots=True)
class VerifyCall:
    """One verifier call: plain data, so it can cross a process boundary or a queue."""

    verifier: str
    sample: Sample
    reference: Mapping[str, Any]
    params: Mapping[str, Any]
    timeout_s: float


@dataclass(frozen=True, slots=True)
class CallResult:
    outcome: Outcome
    elapsed_s: float
    """Time inside the verifier (the limit, for a timeout); excludes queueing."""


class Executor(abc.ABC):
    """Runs verifier calls. Implementations: :class:`workers.embedded.EmbeddedExecutor`."""

    kind: str

    @abc.abstractmethod
    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None) -> list[CallResult]:
        """Run every call; results come back in the order of ``calls``."""

    @abc.abstractmethod
    async def ready(self, wait_s: float = 5.0) -> bool:
        """True when a worker answers a round trip within ``wait_s`` (used by /readyz)."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What /readyz reports about this executor."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the workers; pending calls fail as ``unavailable``."""
