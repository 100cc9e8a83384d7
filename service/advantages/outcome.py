"""Outcome estimators of the GRPO family: one scalar advantage per rollout.

Each is a pure function over the flat batch (see ``groups.py``); the per-token broadcast and
the mask are applied afterwards by ``encode.py``. Excluded rollouts (``valid`` False) get 0
and take no part in any baseline. Groups with fewer than two included rollouts follow the
profile's singleton rule.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from service.advantages.batch import AdvantageBatch
from service.advantages.groups import GroupStats, group_stats
from service.advantages.profiles import Pins
from service.advantages.registry import EstimatorParams, register


def _finish(batch: AdvantageBatch, adv: Tensor, singleton_value: Tensor, pins: Pins,
            stats: GroupStats) -> Tensor:
    """Apply the singleton rule; give excluded rollouts and zero-spread groups exactly 0.

    Zero-spread groups are zeroed explicitly because r - mean can be a rounding error away
    from 0 (0.1 - 0.10000000000000002), which a division by eps would magnify. Adding +0.0
    maps -0.0 to +0.0 (IEEE 754), so a zero always has one bit pattern and run-length
    encoding never splits a run of zeros.
    """
    g = batch.group
    zero = torch.zeros_like(adv)
    if pins.singleton == "mean0_std1":
        adv = torch.where(stats.count[g] < 2, singleton_value, adv)
    else:
        adv = torch.where(stats.count[g] < 2, zero, adv)
    keep = batch.valid & ~stats.zero_spread[g]
    return torch.where(keep, adv, zero) + 0.0


class GrpoParams(EstimatorParams):
    eps: float | None = Field(None, gt=0, le=1.0)
    """Epsilon added to the group std; unset uses the profile's (rewardd/verl 1e-6, trl 1e-4,
    openrlhf 1e-9)."""


@register("grpo", formula="a_i = (r_i - mean_g r) / (std_g r + eps)",
          source="DeepSeekMath (GRPO); verl compute_grpo_outcome_advantage", params=GrpoParams)
def grpo(batch: AdvantageBatch, params: GrpoParams, pins: Pins) -> Tensor:
    """Group-normalised reward: centre on the group mean, divide by the group std plus
    epsilon. A zero-spread group gets exactly 0. Under verl's singleton rule a lone rollout
    keeps r / (1 + eps)."""
    eps = params.eps if params.eps is not None else pins.eps
    stats = group_stats(batch, ddof=pins.std_ddof)
    g = batch.group
    std = torch.nan_to_num(stats.std, nan=0.0)
    adv = (batch.rewards - stats.mean[g]) / (std[g] + eps)
    return _finish(batch, adv, batch.rewards / (1.0 + eps), pins, stats)


@register("dr_grpo", formula="a_i = r_i - mean_g r",
          source="Dr. GRPO (Understanding R1-Zero-Like Training); verl norm_adv_by_std=False")
def dr_grpo(batch: AdvantageBatch, params: EstimatorParams, pins: Pins) -> Tensor:
    """GRPO without the std division, which removes the difficulty bias of normalising by a
    small spread. Under verl's singleton rule a lone rollout keeps r (mean 0)."""
    stats = group_stats(batch, ddof=pins.std_ddof)
    adv = batch.rewards - stats.mean[batch.group]
    return _finish(batch, adv, batch.rewards, pins, stats)


@register("rloo", formula="a_i = r_i - mean_{j != i} r_j",
          source="RLOO (Back to Basics, Ahmadian et al. 2024); verl compute_rloo_outcome_advantage")
def rloo(batch: AdvantageBatch, params: EstimatorParams, pins: Pins) -> Tensor:
    """REINFORCE leave-one-out: each rollout's baseline is the mean of the other rollouts of
    its group, so the baseline does not depend on the rollout it scores. Under verl's
    singleton rule a lone rollout keeps r."""
    stats = group_stats(batch, ddof=pins.std_ddof)
    g = batch.group
    others = (stats.count[g] - 1.0).clamp(min=1.0)
    adv = batch.rewards - (stats.total[g] - batch.rewards) / others
    return _finish(batch, adv, batch.rewards, pins, stats)
