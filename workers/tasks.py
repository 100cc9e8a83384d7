"""Task functions: the code a worker process runs for one verifier call.

They take and return plain data (names, dicts, floats), never live objects, so the same
functions serve the embedded process pool and, later, Celery workers. They are importable
at module level, which the forkserver and Celery both require.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from verifiers import REGISTRY, Sample, get_verifier, run_verifier


def verify_task(verifier: str, sample: Mapping[str, Any], reference: Mapping[str, Any],
                params: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
    """Run one verifier call; return the outcome as plain data and its duration in seconds."""
    started = time.perf_counter()
    outcome = run_verifier(get_verifier(verifier), Sample(**sample), reference, params)
    return outcome.to_dict(), time.perf_counter() - started


def ping_task() -> str:
    """A no-op round trip, used by readiness checks to prove a worker answers."""
    return "pong"


def warm_up() -> None:
    """Warm every registered verifier; the embedded executor's forkserver runs this once."""
    for verifier in REGISTRY.values():
        verifier.warm_up()
