"""plan -> execute -> reward table -> advantages -> response: the one path every entry uses.

The HTTP routes, the CLI and embedding applications all call the functions here, so a batch
scored offline and a batch scored over HTTP give the same bytes.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from service import advantages as adv
from service import metrics
from service.gcpause import gc_paused
from service.models import (AdvantageSpec, AdvantagesRequest, Profile, RewardSpec,
                            RewardsRequest, ScoreRequest)
from service.settings import Settings
from service.table import (Column, Combined, FlatBatch, combine, precomputed_columns,
                           verifier_columns)
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
                progress: ProgressCallback | None = None) -> dict[str, Any]:
    """POST /v1/score: verify every rollout, then advantages."""
    return await _verify_then_respond(req, req.advantage, executor, settings, progress)


async def rewards(req: RewardsRequest, executor: Executor, settings: Settings,
                  progress: ProgressCallback | None = None) -> dict[str, Any]:
    """POST /v1/rewards: verify every rollout; no advantages."""
    return await _verify_then_respond(req, None, executor, settings, progress)


async def _verify_then_respond(req: ScoreRequest | RewardsRequest, spec: AdvantageSpec | None,
                               executor: Executor, settings: Settings,
                               progress: ProgressCallback | None) -> dict[str, Any]:
    with gc_paused():
        validate_score(req, settings)
        flat = FlatBatch.of(req.groups)
    columns = await run_verifiers(flat, req.rewards, executor, settings, progress)
    with gc_paused():
        columns += precomputed_columns(flat.rollouts, spec.weights if spec else {})
        return respond(req.run_id, flat, combine(columns, len(flat.rollouts)), spec)


def advantages(req: AdvantagesRequest) -> dict[str, Any]:
    """POST /v1/advantages: pure compute from the rewards the rollouts carry."""
    with gc_paused():
        return _advantages(req)


def _advantages(req: AdvantagesRequest) -> dict[str, Any]:
    validate_advantages(req)
    flat = FlatBatch.of(req.groups)
    columns = precomputed_columns(flat.rollouts, req.advantage.weights)
    return respond(req.run_id, flat, combine(columns, len(flat.rollouts)), req.advantage)


def _batch(flat: FlatBatch, combined: Combined) -> adv.OutcomeBatch:
    rewards = torch.tensor([r if r is not None else 0.0 for r in combined.reward],
                           dtype=torch.float64)
    valid = torch.tensor([r is not None for r in combined.reward], dtype=torch.bool)
    num_tokens = torch.tensor([resolved_num_tokens(r) or 0 for r in flat.rollouts],
                              dtype=torch.int64)
    return adv.OutcomeBatch(rewards=rewards, group=torch.tensor(flat.group_of, dtype=torch.int64),
                            valid=valid, num_tokens=num_tokens, num_groups=len(flat.groups))


def _layout(flat: FlatBatch, batch: adv.OutcomeBatch) -> adv.TokenLayout:
    if not any(r.mask is not None for r in flat.rollouts):
        return adv.TokenLayout(batch.num_tokens, None)
    flat_mask: list[int] = []
    for rollout, n in zip(flat.rollouts, batch.num_tokens.tolist()):
        flat_mask.extend(rollout.mask if rollout.mask is not None else [1] * n)
    return adv.TokenLayout(batch.num_tokens, torch.tensor(flat_mask, dtype=torch.bool))


def _finite_or_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def respond(run_id: str | None, flat: FlatBatch, combined: Combined,
            spec: AdvantageSpec | None) -> dict[str, Any]:
    """Compute advantages (when asked) and build the response payload as plain data.

    The payload is built as dicts, not response models: a dense batch holds millions of
    floats, and numpy arrays go straight to orjson. Tests validate it against ScoreResponse.
    """
    batch = _batch(flat, combined)
    profile = spec.profile if spec is not None else Profile.rewardd
    flags = adv.describe_groups(batch, adv.pins_for(profile))
    encoded: list[Any] | None = None
    rollout_adv = None
    if spec is not None:
        rollout_adv = adv.compute(batch, spec.estimator, spec.params, spec.profile)
        layout = _layout(flat, batch) if spec.output in ("dense", "rle") else None
        encoded = adv.encode(rollout_adv, layout, spec.output)
    groups = _group_results(flat, combined, flags, encoded)
    summary = _summary(flat, combined, flags, rollout_adv)
    metrics.observe_batch(summary)
    return {"run_id": run_id, "estimator": spec.estimator if spec else None,
            "profile": profile.value if spec else None, "groups": groups, "summary": summary}


def _group_results(flat: FlatBatch, combined: Combined, flags: adv.GroupFlags,
                   encoded: list[Any] | None) -> list[dict[str, Any]]:
    count, mean, std = flags.count.tolist(), flags.mean.tolist(), flags.std.tolist()
    zero_spread, singleton = flags.zero_spread.tolist(), flags.singleton.tolist()
    out: list[dict[str, Any]] = []
    i = 0
    for gi, group in enumerate(flat.groups):
        rollouts, excluded = [], []
        for rollout in group.rollouts:
            reward = combined.reward[i]
            if reward is None:
                excluded.append(rollout.rollout_id)
            rollouts.append({
                "rollout_id": rollout.rollout_id, "reward": reward,
                "rewards": combined.rewards[i], "status": combined.status[i],
                "advantages": encoded[i] if encoded is not None else None,
                "num_tokens": resolved_num_tokens(rollout), "excluded": reward is None})
            i += 1
        out.append({"group_id": group.group_id, "rollouts": rollouts, "diagnostics": {
            "zero_spread": zero_spread[gi], "filtered": False, "singleton": singleton[gi],
            "baseline_size": int(count[gi]), "excluded": excluded,
            "reward_mean": mean[gi] if count[gi] else None,
            "reward_std": _finite_or_none(std[gi])}})
    return out


def _summary(flat: FlatBatch, combined: Combined, flags: adv.GroupFlags,
             rollout_adv: torch.Tensor | None) -> dict[str, Any]:
    included = torch.tensor([r for r in combined.reward if r is not None], dtype=torch.float64)
    summary: dict[str, Any] = {
        "rollouts": len(flat.rollouts), "groups": len(flat.groups),
        "failed_cells": combined.failed_cells,
        "excluded_rollouts": len(flat.rollouts) - included.numel(),
        "zero_spread_groups": int(flags.zero_spread.sum()),
        "singleton_groups": int(flags.singleton.sum()),
        "zero_advantage_fraction": None,
        "reward_mean": included.mean().item() if included.numel() else None,
        "reward_std": included.std().item() if included.numel() > 1 else None,
        "advantage_mean": None, "advantage_std": None}
    if rollout_adv is not None and rollout_adv.numel():
        summary["zero_advantage_fraction"] = (rollout_adv == 0).double().mean().item()
        summary["advantage_mean"] = rollout_adv.mean().item()
        summary["advantage_std"] = rollout_adv.std().item() if rollout_adv.numel() > 1 else None
    return summary
