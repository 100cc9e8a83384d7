"""Vectorised per-group statistics over a flat batch of rollouts.

Rollouts of all groups lie in one flat tensor; ``group`` maps each rollout to its group.
Scatter-adds (``index_add_``) give every group's count, mean and std in O(rollouts) with no
Python loop, which is what lets one request carry thousands of groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class OutcomeBatch:
    """Scalar rewards of a flat batch of rollouts and how they are grouped.

    ``valid`` is False for rollouts excluded from their group's baseline (a failed cell with no
    fallback); estimators give them advantage 0 and leave them out of every statistic.
    """

    rewards: Tensor  # float64 [R]; value of an invalid rollout is ignored
    group: Tensor  # int64 [R], 0..num_groups-1
    valid: Tensor  # bool [R]
    num_tokens: Tensor  # int64 [R]
    num_groups: int

    @property
    def masked_rewards(self) -> Tensor:
        return torch.where(self.valid, self.rewards, torch.zeros_like(self.rewards))


@dataclass(frozen=True, slots=True)
class GroupStats:
    count: Tensor  # float64 [G]: included rollouts
    total: Tensor  # float64 [G]: sum of included rewards
    mean: Tensor  # float64 [G]; 0 for empty groups
    std: Tensor  # float64 [G]; NaN where count <= ddof
    zero_spread: Tensor  # bool [G]: two or more included rollouts, all with the same reward


def group_stats(batch: OutcomeBatch, ddof: int = 1) -> GroupStats:
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


def _all_equal(batch: OutcomeBatch) -> Tensor:
    """Per group: min == max over included rewards, decided exactly.

    Not std == 0: the mean of three 0.1s is 0.10000000000000002, so deviations and std of an
    all-equal group can be a rounding error away from 0.
    """
    inf = torch.full((batch.num_groups,), float("inf"), dtype=torch.float64)
    group, rewards = batch.group[batch.valid], batch.rewards[batch.valid]
    lo = inf.scatter_reduce(0, group, rewards, "amin")
    hi = (-inf).scatter_reduce(0, group, rewards, "amax")
    return lo == hi
