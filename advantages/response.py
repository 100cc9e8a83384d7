"""Turn a reward table into the response: advantages (when asked), diagnostics, summary.

The payload is built as plain dicts, not response models: a dense batch holds millions of
floats, and numpy arrays go straight to orjson. Tests validate it against ScoreResponse.
It is the advantage library's, not the service's, so the in-process entry point
(:func:`rewardd.advantages.compute_advantages`) answers with the server's very numbers; the
service adds the run store's commit and the metrics around it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from rewardd.advantages import compose
from rewardd.advantages.batch import AdvantageBatch, RunState
from rewardd.advantages.checks import resolved_num_tokens
from rewardd.advantages.encode import NotConstant, encode, encode_tokens
from rewardd.advantages.errors import RequestInvalid, error
from rewardd.advantages.groups import GroupFlags, describe_groups
from rewardd.advantages.inputs import build_batch
from rewardd.advantages.models import AdvantageSpec, Profile
from rewardd.advantages.profiles import pins_for
from rewardd.advantages.table import Column, Combined, FlatBatch, nansum_missing


def build_response(run_id: str | None, flat: FlatBatch, combined: Combined,
                   columns: Sequence[Column], spec: AdvantageSpec | None,
                   run: RunState | None = None) -> dict[str, Any]:
    """The response body for a reward table: advantages per ``spec`` (None: rewards only),
    each group's diagnostics, the batch summary, advice and report. Stateful entries read
    and write ``run``; committing its writes is the caller's, once the response is whole."""
    profile = spec.profile if spec is not None else Profile.rewardd
    if spec is not None and pins_for(profile).missing == "nansum":
        combined = nansum_missing(combined, columns)
    batch = build_batch(flat, combined, columns, run)
    out: dict[str, Any] = {"run_id": run_id, "estimator": spec.estimator if spec else None,
                           "profile": profile.value if spec else None}
    encoded = returns = None
    composed = None
    if spec is not None:
        composed = compose.run_stages(batch, spec)
        batch = composed.batch
        try:
            encoded = encode(composed.advantages, batch, spec.output)
        except NotConstant as exc:
            raise RequestInvalid([error(("body", "advantage", "output"),
                                        f"estimator {spec.estimator!r}: {exc}")]) from None
        if composed.advantages.returns is not None and spec.output != "none":
            returns = encode_tokens(_masked(composed.advantages.returns, batch), batch,
                                    "dense" if spec.output == "scalar" else spec.output)
    flags = describe_groups(batch, pins_for(profile))
    zero_rollouts = _zero_rollouts(composed, batch)
    out["groups"] = _group_results(flat, combined, flags, encoded, returns, composed,
                                   spec, zero_rollouts)
    out["summary"] = _summary(flat, combined, flags, composed, batch, zero_rollouts)
    out["advice"] = composed.advice if composed else {}
    out["report"] = composed.report if composed else {}
    return out


def _masked(values: torch.Tensor, batch: AdvantageBatch) -> torch.Tensor:
    return torch.where(batch.token_mask, values, torch.zeros_like(values)) + 0.0


def _zero_rollouts(composed: compose.Composed | None, batch: AdvantageBatch
                   ) -> torch.Tensor | None:
    """bool [R]: rollouts whose advantages are zero on every token."""
    if composed is None:
        return None
    a = composed.advantages
    if a.rollout is not None:
        if batch.mask is None:
            return a.rollout == 0
        unmasked = torch.zeros(batch.size, dtype=torch.int64).index_add_(
            0, batch.token_rollout, batch.mask.to(torch.int64))
        return (a.rollout == 0) | (unmasked == 0)
    nonzero = torch.zeros(batch.size, dtype=torch.int64).index_add_(
        0, batch.token_rollout, (a.per_token(batch) != 0).to(torch.int64))
    return nonzero == 0


def _finite_or_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _group_results(flat: FlatBatch, combined: Combined, flags: GroupFlags,
                   encoded: list[Any] | None, returns: list[Any] | None,
                   composed: compose.Composed | None, spec: AdvantageSpec | None,
                   zero_rollouts: torch.Tensor | None) -> list[dict[str, Any]]:
    count, mean, std = flags.count.tolist(), flags.mean.tolist(), flags.std.tolist()
    zero_spread, singleton = flags.zero_spread.tolist(), flags.singleton.tolist()
    filtered = set()
    components = None
    if composed is not None:
        for advice in composed.advice.values():
            filtered.update(advice.get("filtered", ()) if isinstance(advice, dict) else ())
        if spec is not None and spec.components and composed.advantages.components:
            names = list(composed.advantages.components)
            columns = torch.stack([composed.advantages.components[n] for n in names], 1).tolist()
            components = [dict(zip(names, row)) for row in columns]
    out: list[dict[str, Any]] = []
    i = 0
    for gi, group in enumerate(flat.groups):
        rollouts, excluded = [], []
        for rollout in group.rollouts:
            reward = combined.reward[i]
            if reward is None:
                excluded.append(rollout.rollout_id)
            item = {"rollout_id": rollout.rollout_id, "reward": reward,
                    "rewards": combined.rewards[i], "status": combined.status[i],
                    "advantages": encoded[i] if encoded is not None else None,
                    "num_tokens": resolved_num_tokens(rollout), "excluded": reward is None}
            if returns is not None:
                item["returns"] = returns[i]
            if components is not None:
                item["component_advantages"] = components[i]
            rollouts.append(item)
            i += 1
        entry: dict[str, Any] = {"group_id": group.group_id}
        if group.source is not None:  # echoed only when sent
            entry["source"] = group.source
        out.append({**entry, "rollouts": rollouts, "diagnostics": {
            "zero_spread": zero_spread[gi], "filtered": group.group_id in filtered,
            "singleton": singleton[gi], "baseline_size": int(count[gi]), "excluded": excluded,
            "reward_mean": mean[gi] if count[gi] else None,
            "reward_std": _finite_or_none(std[gi])}})
    return out


def _summary(flat: FlatBatch, combined: Combined, flags: GroupFlags,
             composed: compose.Composed | None, batch: AdvantageBatch,
             zero_rollouts: torch.Tensor | None) -> dict[str, Any]:
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
        "advantage_mean": None, "advantage_std": None,
        "silent_group_fraction": None, "component_energy": None}
    if composed is None or zero_rollouts is None or not batch.size:
        return summary
    a = composed.advantages
    values = a.rollout if a.rollout is not None else a.per_token(batch)[batch.token_mask]
    summary["zero_advantage_fraction"] = zero_rollouts.double().mean().item()
    if values.numel():
        summary["advantage_mean"] = values.mean().item()
        summary["advantage_std"] = values.std().item() if values.numel() > 1 else None
    loud = torch.zeros(batch.num_groups, dtype=torch.int64).index_add_(
        0, batch.group, (~zero_rollouts).to(torch.int64))
    summary["silent_group_fraction"] = (loud == 0).double().mean().item()
    if a.components:
        summary["component_energy"] = {
            name: (comp[batch.valid] ** 2).mean().item() if bool(batch.valid.any()) else 0.0
            for name, comp in a.components.items()}
    return summary
