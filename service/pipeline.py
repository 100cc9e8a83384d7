"""plan -> execute -> reward table -> advantages -> response: the one path every entry uses.

The HTTP routes, the CLI and embedding applications all call the functions here, so a batch
scored offline and a batch scored over HTTP give the same bytes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from service import metrics
from service.gcpause import gc_paused
from service.models import (AdvantageSpec, AdvantagesRequest, RewardSpec, RewardsRequest,
                            ScoreRequest)
from service.respond import respond
from service.runstate import RunStore
from service.settings import Settings
from service.table import Column, FlatBatch, combine, precomputed_columns, verifier_columns
from service.validation import resolved_num_tokens, validate_advantages, validate_score
from verifiers.base import Sample
from workers.executor import CallResult, Executor, ProgressCallback, VerifyCall


def call_timeout(requested_s: float | None, settings: Settings) -> float:
    """The wall-clock limit of one call: the request's, else the server default (validation
    has already rejected requests above the server's maximum)."""
    return min(requested_s or settings.verifier_timeout_s, settings.max_verifier_timeout_s)


def plan(flat: FlatBatch, specs: Sequence[RewardSpec], settings: Settings) -> list[VerifyCall]:
    """One call per (rollout, component), rollout-major."""
    calls = []
    for rollout, gi in zip(flat.rollouts, flat.group_of):
        group = flat.groups[gi]
        sample = Sample(completion=rollout.completion or "", prompt=group.prompt,
                        num_tokens=resolved_num_tokens(rollout))
        for spec in specs:
            calls.append(VerifyCall(spec.verifier, sample, group.reference, spec.params,
                                    call_timeout(spec.timeout_s, settings)))
    return calls


async def run_calls(calls: Sequence[VerifyCall], executor: Executor,
                    progress: ProgressCallback | None = None) -> list[CallResult]:
    """Run calls on the executor and record each outcome and duration in the metrics."""
    results = await executor.run(calls, progress)
    for call, result in zip(calls, results):
        outcome = "ok" if result.outcome.ok else result.outcome.error.value
        metrics.observe_verifier(call.verifier, outcome, result.elapsed_s)
    return results


async def run_verifiers(flat: FlatBatch, specs: Sequence[RewardSpec], executor: Executor,
                        settings: Settings, progress: ProgressCallback | None) -> list[Column]:
    results = await run_calls(plan(flat, specs, settings), executor, progress)
    return verifier_columns(specs, [r.outcome for r in results])


async def score(req: ScoreRequest, executor: Executor, settings: Settings,
                progress: ProgressCallback | None = None,
                runs: RunStore | None = None) -> dict[str, Any]:
    """POST /v1/score: verify every rollout, then advantages."""
    return await _verify_then_respond(req, req.advantage, executor, settings, progress, runs)


async def rewards(req: RewardsRequest, executor: Executor, settings: Settings,
                  progress: ProgressCallback | None = None) -> dict[str, Any]:
    """POST /v1/rewards: verify every rollout; no advantages."""
    return await _verify_then_respond(req, None, executor, settings, progress, None)


async def _verify_then_respond(req: ScoreRequest | RewardsRequest, spec: AdvantageSpec | None,
                               executor: Executor, settings: Settings,
                               progress: ProgressCallback | None,
                               runs: RunStore | None) -> dict[str, Any]:
    with gc_paused():
        validate_score(req, settings)
        flat = FlatBatch.of(req.groups)
    columns = await run_verifiers(flat, req.rewards, executor, settings, progress)

    def finish() -> dict[str, Any]:
        with gc_paused():
            columns.extend(precomputed_columns(flat.rollouts, spec.weights if spec else {}))
            return respond(req.run_id, flat, combine(columns, len(flat.rollouts)), columns,
                           spec, runs)

    # the advantage step is CPU-bound: off the event loop, so other requests keep flowing
    return await asyncio.to_thread(finish)


def advantages(req: AdvantagesRequest, runs: RunStore | None = None) -> dict[str, Any]:
    """POST /v1/advantages: pure compute from the rewards the rollouts carry."""
    with gc_paused():
        return _advantages(req, runs)


def _advantages(req: AdvantagesRequest, runs: RunStore | None) -> dict[str, Any]:
    validate_advantages(req)
    flat = FlatBatch.of(req.groups)
    columns = precomputed_columns(flat.rollouts, req.advantage.weights)
    return respond(req.run_id, flat, combine(columns, len(flat.rollouts)), columns,
                   req.advantage, runs)
