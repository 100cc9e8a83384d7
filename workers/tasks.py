"""Task functions: the code a worker process runs for one verifier call.

They take and return plain data (names, lists, dicts, floats), never live objects, so the
same functions serve the embedded process pool and, later, Celery workers. They are
importable at module level, which the forkserver and Celery both require.
"""

from __future__ import annotations

import importlib
import signal
import time
from typing import Any, Mapping, Sequence

from rewardd.verifiers import REGISTRY, Sample, Verifier, get_verifier, run_verifier
from rewardd.verifiers.base import GroupContext, run_group_verifier
from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.workers.deadline import CheckTimeout, SoftDeadline


def verify_group_task(verifier: str, samples: Sequence[Mapping[str, Any]],
                      reference: Mapping[str, Any], params: Mapping[str, Any],
                      timeout_s: float,
                      context: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Check each sample of one group in turn, each under its own soft ``timeout_s``.

    Returns one ``{"outcome": <Outcome.to_dict()>, "elapsed_s": float}`` per sample, in
    order. A check that runs past its limit is interrupted in place and becomes a
    ``timeout`` cell; the loop goes on with the next sample in the same process, so the
    samples share this process's verifier caches (the group's reference is parsed once).
    """
    impl = get_verifier(verifier)
    if impl.group_level:
        return check_group(impl, [Sample(**sample) for sample in samples], reference, params,
                           timeout_s, GroupContext.from_dict(context))
    return [check(impl, Sample(**sample), reference, params, timeout_s) for sample in samples]


def verify_groups_task(verifier: str, groups: Sequence[Sequence[Any]],
                       params: Mapping[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    """:func:`verify_group_task` over several ``[samples, reference, context]`` groups of one
    verifier (context optional), one after the other, as one flat list of items: a Celery
    task that carries a pack of small groups (:mod:`rewardd.workers.packing`)."""
    return [item for group in groups
            for item in verify_group_task(verifier, group[0], group[1], params, timeout_s,
                                          group[2] if len(group) > 2 else None)]


def check(impl: Verifier, sample: Sample, reference: Mapping[str, Any],
          params: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """One sample under a soft deadline, as plain data; never raises for the sample's sake."""
    deadline = SoftDeadline(timeout_s)
    started = time.perf_counter()
    outcome: Outcome | None = None
    try:
        with deadline:
            outcome = run_verifier(impl, sample, reference, params)
    except CheckTimeout:
        pass
    finally:
        deadline.disarm()
    elapsed = time.perf_counter() - started
    if deadline.expired or outcome is None:  # expired even if the verifier swallowed it
        return {"outcome": Outcome.failure(
            FailureKind.timeout, f"verifier ran past its {timeout_s:g}s limit and was "
            "interrupted", limit_s=timeout_s).to_dict(), "elapsed_s": timeout_s}
    return {"outcome": outcome.to_dict(), "elapsed_s": elapsed}


def check_group(impl: Verifier, samples: list[Sample], reference: Mapping[str, Any],
                params: Mapping[str, Any], timeout_s: float,
                context: GroupContext | None = None) -> list[dict[str, Any]]:
    """A group-level verifier over the whole group under one soft deadline of ``timeout_s``
    per sample (the group's share of the call's limit); past it every sample is ``timeout``
    (an arena's scores do not exist for part of a group). ``elapsed_s`` is the group's time
    divided evenly."""
    limit = timeout_s * len(samples)
    deadline = SoftDeadline(limit)
    started = time.perf_counter()
    outcomes: list[Outcome] | None = None
    try:
        with deadline:
            outcomes = run_group_verifier(impl, samples, reference, params, context)
    except CheckTimeout:
        pass
    finally:
        deadline.disarm()
    if deadline.expired or outcomes is None:
        failure = Outcome.failure(FailureKind.timeout, f"the group's check ran past its "
                                  f"{limit:g}s limit ({timeout_s:g}s per sample) and was "
                                  "interrupted", limit_s=timeout_s).to_dict()
        return [{"outcome": failure, "elapsed_s": timeout_s} for _ in samples]
    share = (time.perf_counter() - started) / max(len(samples), 1)
    return [{"outcome": outcome.to_dict(), "elapsed_s": share} for outcome in outcomes]


def ping_task() -> str:
    """A no-op round trip, used by readiness checks to prove a worker answers."""
    return "pong"


def init_worker(plugins: Sequence[str] = ()) -> None:
    """Run once in each embedded worker process before its first task.

    Imports the executor's verifier plugins. The forkserver usually preloaded them already,
    but there is one forkserver per process and its preload list is the first executor's:
    a later executor with other plugins would otherwise find its verifiers missing.

    pebble stops a worker that overran its hard limit with SIGTERM and waits 3 s before
    SIGKILL; its SIGTERM handler is Python code, which cannot run while the worker is stuck
    in C code (the very hangs the hard limit exists for), so each such kill would take 3 s
    more than the limit and hold pebble's pool manager meanwhile. With the default
    disposition the kernel ends the process at once. The worker owns nothing that needs a
    clean exit: results travel only after a task returns.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for plugin in plugins:
        importlib.import_module(plugin)


def warm_up() -> None:
    """Warm every registered verifier; the embedded executor's forkserver runs this once."""
    for verifier in REGISTRY.values():
        verifier.warm_up()
