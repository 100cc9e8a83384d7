"""The response to a scoring or advantages request, as the service sends it.

The body itself is the advantage library's (:mod:`rewardd.advantages.response`, the same
functions the in-process entry point calls); the service adds what is its own: the run
store's scope, committed only once the response is whole (a request that fails late leaves
the run's state as it was), and the batch metrics.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rewardd.advantages.batch import RunState
from rewardd.advantages.checks import DEFAULT_LIMITS, SizeLimits
from rewardd.advantages.models import AdvantageSpec, AdvantagesRequest
from rewardd.advantages.compute import respond_to
from rewardd.advantages.response import build_response
from rewardd.advantages.table import Column, Combined, FlatBatch
from rewardd.service import metrics
from rewardd.service.runstate import RunStore


def _with_run(run_id: str | None, runs: RunStore | None,
              build: Callable[[RunState | None], dict[str, Any]]) -> dict[str, Any]:
    run = runs.scope(run_id) if runs is not None and run_id is not None else None
    out = build(run)
    if run is not None:
        run.commit()
    metrics.observe_batch(out["summary"])
    return out


def respond(run_id: str | None, flat: FlatBatch, combined: Combined, columns: Sequence[Column],
            spec: AdvantageSpec | None, runs: RunStore | None = None) -> dict[str, Any]:
    """The body for a verified reward table (``/v1/score``, ``/v1/rewards``, jobs)."""
    return _with_run(run_id, runs,
                     lambda run: build_response(run_id, flat, combined, columns, spec, run))


def respond_advantages(req: AdvantagesRequest, runs: RunStore | None = None,
                       limits: SizeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The body of ``/v1/advantages``: what :func:`rewardd.advantages.compute_advantages`
    computes in process, with the service's run store, metrics and size limits."""
    return _with_run(req.run_id, runs, lambda run: respond_to(req, run, limits))
