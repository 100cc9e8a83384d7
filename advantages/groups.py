"""Vectorised per-group statistics over a flat batch of rollouts.

Scatter-adds (``index_add_``) give every group's count, mean and std in O(rollouts) with no
Python loop, which is what lets one request carry thousands of groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch
from rewardd.advantages.profiles import Pins, Whitening


@dataclass(frozen=True, slots=True)
class GroupStats:
    count: Tensor  # float64 [G]: included rollouts
    total: Tensor  # float64 [G]: sum of included rewards
    mean: Tensor  # float64 [G]; 0 for empty groups
    std: Tensor  # float64 [G]; NaN where count <= ddof
    zero_spread: Tensor  # bool [G]: two or more included rollouts, all with the same reward


def group_stats(batch: AdvantageBatch, ddof: int = 1) -> GroupStats:
    """Count, sum, mean and std (with ``ddof``) of the included rewards of every group."""
    g = batch.num_groups
    r = batch.masked_rewards
    valid = batch.valid.to(torch.float64)
    count = torch.zeros(g, dtype=torch.float64).index_add_(0, batch.group, valid)
    total = torch.zeros(g, dtype=torch.float64).index_add_(0, batch.group, r)
    mean = total / count.clamp(min=1.0)
    centred = torch.where(batch.valid, r - mean[batch.group], torch.zeros_like(r))
    sq = torch.zeros(g, dtype=torch.float64).index_add_(0, batch.group, centred * centred)
    denom = count - ddof
    std = torch.where(denom > 0, (sq / denom.clamp(min=1.0)).sqrt(),
                      torch.full_like(sq, float("nan")))
    return GroupStats(count=count, total=total, mean=mean, std=std,
                      zero_spread=(count >= 2) & _all_equal(batch))


def _all_equal(batch: AdvantageBatch) -> Tensor:
    """Per group: min == max over included rewards, decided exactly.

    Not std == 0: the mean of three 0.1s is 0.10000000000000002, so deviations and std of an
    all-equal group can be a rounding error away from 0.
    """
    inf = torch.full((batch.num_groups,), float("inf"), dtype=torch.float64)
    group, rewards = batch.group[batch.valid], batch.rewards[batch.valid]
    lo = inf.scatter_reduce(0, group, rewards, "amin")
    hi = (-inf).scatter_reduce(0, group, rewards, "amax")
    return lo == hi


def group_sum(batch: AdvantageBatch, values: Tensor) -> Tensor:
    """float64 [G]: per-group sum of a per-rollout tensor over included rollouts."""
    kept = torch.where(batch.valid, values, torch.zeros_like(values))
    return torch.zeros(batch.num_groups, dtype=values.dtype).index_add_(0, batch.group, kept)


def _scale(var: Tensor, how: Whitening) -> Tensor:
    """1 / the whitening denominator, by the trainer's formula (1 when only centring)."""
    if not how.scale:
        return torch.ones_like(var)
    if how.mode == "var_plus":
        return torch.rsqrt(var + how.eps)
    if how.mode == "var_clamp":
        return torch.rsqrt(var.clamp(min=how.eps))
    return 1.0 / (var.sqrt() + how.eps)


def whiten(values: Tensor, mask: Tensor, how: Whitening, *, shift_mean: bool = True) -> Tensor:
    """Batch whitening over the entries where ``mask`` is True (others come back +0.0), with
    one trainer's formula (see :class:`~rewardd.advantages.profiles.Whitening`). With
    ``shift_mean`` False the mean is added back.

    Two passes over the values (one fused variance-and-mean, one scale), plus a compaction
    only when some entries are masked: whitening runs on every token of a batch.
    """
    full = bool(mask.all())
    kept = values if full else values[mask]
    if kept.numel() == 0:
        return torch.zeros_like(values)
    var, mean = torch.var_mean(kept, correction=how.ddof) if kept.numel() > how.ddof else (
        kept.new_zeros(()), kept.mean())
    scale = _scale(var, how)
    out = (values - mean).mul_(scale)
    if not shift_mean:
        out.add_(mean)
    if not full:
        out.masked_fill_(~mask, 0.0)
    return out.add_(0.0)


def whiten_rollouts_over_tokens(values: Tensor, counts: Tensor, how: Whitening) -> Tensor:
    """Whitening of per-rollout values broadcast to their tokens, without broadcasting.

    Rollout i stands for ``counts[i]`` identical tokens, so the token mean and variance are
    count-weighted rollout sums: O(rollouts) instead of O(tokens), and the result stays one
    value per rollout. Rollouts with no counted token get +0.0.
    """
    weights = counts.to(values.dtype)
    n = weights.sum()
    out = torch.zeros_like(values)
    if n <= 0:
        return out
    # shifted by one counted value: exact when every counted value is the same (a batch with
    # no spread whitens to exact zeros, as whitening the broadcast tokens does)
    pivot = values[weights > 0][0]
    mean = pivot + (weights * (values - pivot)).sum() / n
    var = (weights * (values - mean) ** 2).sum() / (n - how.ddof).clamp(min=1)
    scale = _scale(var, how)
    return torch.where(weights > 0, (values - mean) * scale, out) + 0.0


def batch_whiten(values: Tensor, mask: Tensor, pins: Pins, entry: str) -> Tensor:
    """Whitening of ``entry`` with the profile's formula for it."""
    return whiten(values, mask, pins.whitening_for(entry))


@dataclass(frozen=True, slots=True)
class GroupFlags:
    """Per-group diagnostics computed alongside the advantages."""

    count: Tensor  # float64 [G] included rollouts
    mean: Tensor  # float64 [G]
    std: Tensor  # float64 [G] (NaN where fewer than 2 included)
    zero_spread: Tensor  # bool [G]
    singleton: Tensor  # bool [G]: exactly one rollout entered the baseline


def describe_groups(batch: AdvantageBatch, pins: Pins) -> GroupFlags:
    """Per-group count, mean, std and flags of the included rewards.

    ``singleton`` is exactly one included rollout: a lone rollout the profile's singleton rule
    applies to. A group whose every rollout was excluded (count 0) is not a singleton: it has
    no baseline at all, which its ``baseline_size`` of 0 and its ``excluded`` list say.
    """
    stats = group_stats(batch, ddof=pins.std_ddof)
    return GroupFlags(count=stats.count, mean=stats.mean, std=stats.std,
                      zero_spread=stats.zero_spread, singleton=stats.count == 1)
