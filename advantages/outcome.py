"""Outcome estimators: one scalar advantage per rollout from its group's rewards.

Each is a pure function over the flat batch (see ``groups.py``); the per-token broadcast and
the mask are applied afterwards by ``encode.py``. Excluded rollouts (``valid`` False) get 0
and take no part in any baseline. Groups with fewer than two included rollouts follow the
profile's singleton rule where the estimator has a mean baseline (grpo, dr_grpo, rloo, opo,
gpg, reinforce_pp_baseline); the others say what a lone rollout gets. reinforce_pp_baseline
is whitened over the batch's tokens, computed from each rollout's token count, so it stays
one value per rollout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.errors import invalid
from rewardd.advantages.groups import (GroupStats, group_stats, group_sum, whiten,
                                       whiten_rollouts_over_tokens)
from rewardd.advantages.models import FiniteFloat
from rewardd.advantages.profiles import Pins, Whitening
from rewardd.advantages.registry import EstimatorParams, register
from rewardd.advantages.returns import (check_clip_range, kept_tokens, reverse_scan, whiten_kept,
                                        whitened, whitening)


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


class ShapingParams(EstimatorParams):
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the per-token KL penalty sent as ``kl``: the advantage at token t becomes
    a_i - kl_coef * (sum of kl over the rollout's mask-1 tokens from t on), OpenRLHF's
    compute_reward followed by its cumulative return with gamma 1. The result is per token.
    Needs ``kl`` on the rollouts when not 0."""
    clip_range: tuple[FiniteFloat, FiniteFloat] | None = None
    """[lo, hi]: the group-shaped reward a_i is clipped to it before the KL term (where
    OpenRLHF's compute_reward clips). Unset: the profile's (openrlhf (-10, 10); none
    elsewhere)."""

    _lo_below_hi = field_validator("clip_range")(check_clip_range)


def building_block(pins: Pins) -> Pins:
    """``pins`` for grpo or dr_grpo run inside another estimator (segment, turn, gigpo,
    bipace, tempo): without the profile's clip range, which OpenRLHF applies to its own
    estimators' outputs only; the outer estimator's numbers are not clipped mid-way."""
    return replace(pins, clip_range=None)


def shaped(batch: AdvantageBatch, adv: Tensor, params: ShapingParams, pins: Pins
           ) -> Tensor | Advantages:
    """``adv`` clipped to the clip range and, with a KL weight, made per token:
    a_i - kl_coef * the KL still ahead of each mask-1 token (a suffix sum: gamma 1, so the
    profile's rule for holes changes nothing). Excluded rollouts stay 0."""
    bounds = params.clip_range if params.clip_range is not None else pins.clip_range
    if bounds is not None:
        adv = torch.where(batch.valid, adv.clamp(bounds[0], bounds[1]),
                          torch.zeros_like(adv)) + 0.0
    if params.kl_coef == 0.0:
        return adv
    if batch.kl is None:
        raise invalid(("body", "advantage", "params", "kl_coef"),
                      f"kl_coef {params.kl_coef} needs per-token kl on the rollouts")
    kept = kept_tokens(batch)
    ahead = reverse_scan(kept.gather(batch.kl) * params.kl_coef, kept.decay(1.0))
    token = kept.scatter(adv[kept.rollout] - ahead, batch.total_tokens)
    return Advantages(token=token)


class GrpoParams(ShapingParams):
    eps: float | None = Field(None, gt=0, le=1.0)
    """Epsilon added to the group std; unset uses the profile's (rewardd/verl 1e-6, trl 1e-4,
    openrlhf 1e-9)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """What r_i - mean_g r is divided by (TRL's GRPOConfig.scale_rewards): ``group``, the
    group's std plus eps; ``batch``, the std of every included reward of the batch (unbiased,
    TRL's nanstd) plus eps; ``none``, nothing (Dr. GRPO's numbers)."""
    var_floor: float = Field(0.0, ge=0.0, le=1.0)
    """Floor of the group variance before its square root: std = sqrt(max(var, var_floor)),
    verl's ``group_mean_std`` (its ``grpo_vectorized`` pins 1e-6, verl's epsilon, as issue 16
    measured it; verl 0.9.1 calls it with 0, which is plain ``grpo``). A group with spread but a
    variance under the floor is divided by sqrt(var_floor) + eps instead of its tiny std."""


@register("grpo", formula="a_i = (r_i - mean_g r) / (std_g r + eps)",
          source="DeepSeekMath (GRPO); verl compute_grpo_outcome_advantage", params=GrpoParams)
def grpo(batch: AdvantageBatch, params: GrpoParams, pins: Pins) -> Tensor | Advantages:
    """Group-normalised reward: centre on the group mean, divide by the group std plus
    epsilon. A zero-spread group gets exactly 0. Under verl's singleton rule a lone rollout
    keeps r / (1 + eps). ``scale_rewards`` as TRL's (``batch``: the batch std, ``none``: no
    division). ``clip_range`` and ``kl_coef`` as OpenRLHF's group_norm."""
    eps = params.eps if params.eps is not None else pins.eps
    stats = group_stats(batch, ddof=pins.std_ddof)
    g = batch.group
    adv = batch.rewards - stats.mean[g]
    if params.scale_rewards == "group":
        std = torch.nan_to_num(stats.std, nan=0.0)
        if params.var_floor > 0.0:
            std = torch.sqrt(torch.clamp(std * std, min=params.var_floor))
        adv = adv / (std[g] + eps)
    elif params.scale_rewards == "batch":
        included = batch.rewards[batch.valid]
        spread = included.std(correction=pins.std_ddof) if included.numel() > pins.std_ddof \
            else included.new_zeros(())
        adv = adv / (spread + eps)
    return shaped(batch, _finish(batch, adv, batch.rewards / (1.0 + eps), pins, stats),
                  params, pins)


@register("dr_grpo", formula="a_i = r_i - mean_g r",
          source="Dr. GRPO (Understanding R1-Zero-Like Training); verl norm_adv_by_std=False; "
          "OpenRLHF dr_grpo", params=ShapingParams)
def dr_grpo(batch: AdvantageBatch, params: ShapingParams, pins: Pins) -> Tensor | Advantages:
    """GRPO without the std division, which removes the difficulty bias of normalising by a
    small spread. Under verl's singleton rule a lone rollout keeps r (mean 0).
    ``clip_range`` and ``kl_coef`` as OpenRLHF's dr_grpo."""
    stats = group_stats(batch, ddof=pins.std_ddof)
    adv = batch.rewards - stats.mean[batch.group]
    return shaped(batch, _finish(batch, adv, batch.rewards, pins, stats), params, pins)


class RlooParams(ShapingParams):
    singleton: Literal["zero", "mean0_std1"] | None = None
    """What a lone rollout gets: ``zero``, or ``mean0_std1`` (verl's compute_rloo_outcome_
    advantage: it keeps r). Unset: the profile's rule. verl's ``rloo_vectorized`` pins
    ``zero`` (its (c r - sum) / max(c - 1, 1) * (c > 1))."""
    normalize_advantages: bool = False
    """Whiten the advantages over the batch's rollouts that have a leave-one-out baseline
    (two or more included in their group), (a - mean) / (std + eps) with the unbiased std and
    the profile's eps (TRL's RLOOConfig.normalize_advantages: nanmean and nanstd over its
    non-NaN advantages, 1e-4 under trl); the others stay 0."""


@register("rloo", formula="a_i = r_i - mean_{j != i} r_j",
          source="RLOO (Back to Basics, Ahmadian et al. 2024); verl compute_rloo_outcome_advantage",
          params=RlooParams)
def rloo(batch: AdvantageBatch, params: RlooParams, pins: Pins) -> Tensor | Advantages:
    """REINFORCE leave-one-out: each rollout's baseline is the mean of the other rollouts of
    its group, so the baseline does not depend on the rollout it scores. Under verl's
    singleton rule a lone rollout keeps r (``singleton`` overrides the profile's rule).
    ``normalize_advantages`` as TRL's RLOO; ``clip_range`` and ``kl_coef`` as OpenRLHF's
    rloo."""
    if params.singleton is not None:
        pins = replace(pins, singleton=params.singleton)
    stats = group_stats(batch, ddof=pins.std_ddof)
    g = batch.group
    others = (stats.count[g] - 1.0).clamp(min=1.0)
    adv = batch.rewards - (stats.total[g] - batch.rewards) / others
    adv = _finish(batch, adv, batch.rewards, pins, stats)
    if params.normalize_advantages:
        based = batch.valid & (stats.count[g] >= 2)
        adv = whiten(adv, based, Whitening(ddof=1, eps=pins.eps, mode="std_plus",
                                           level="rollout"))
    return shaped(batch, adv, params, pins)


def masked_lengths(batch: AdvantageBatch) -> Tensor:
    """float64 [R]: each rollout's count of mask-1 tokens (num_tokens without a mask)."""
    if batch.mask is None:
        return batch.num_tokens.to(torch.float64)
    return torch.zeros(batch.size, dtype=torch.float64).index_add_(
        0, batch.token_rollout, batch.mask.to(torch.float64))


@register("opo", formula="a_i = r_i - sum_j len_j r_j / sum_j len_j",
          source="OPO (On-Policy RL with Optimal reward baseline, arXiv 2505.23585); verl "
          "compute_opo_outcome_advantage")
def opo(batch: AdvantageBatch, params: EstimatorParams, pins: Pins) -> Tensor:
    """Length-weighted baseline: the group's rewards averaged with each rollout weighted by
    its length, the count of its mask-1 tokens (num_tokens where no mask is sent), as verl
    sums response_mask. The baseline minimises the variance of a sequence-level gradient
    whose norm grows with length. A group whose included rollouts have no tokens at all
    (scalar output without num_tokens) falls back to the plain mean. The length-weighted sum
    of a group's advantages is 0. Under verl's singleton rule a lone rollout keeps r."""
    stats = group_stats(batch, ddof=pins.std_ddof)
    length = masked_lengths(batch)
    total_length = group_sum(batch, length)
    weighted = group_sum(batch, length * batch.rewards)
    has_length = total_length > 0
    baseline = torch.where(has_length, weighted / torch.where(has_length, total_length, 1.0),
                           stats.mean)
    adv = batch.rewards - baseline[batch.group]
    return _finish(batch, adv, batch.rewards, pins, stats)


class GpgParams(EstimatorParams):
    count: Literal["spread", "reward"] | None = None
    """What counts as a valid sample in alpha = B / max(#valid, 1), B the included rollouts
    of the batch. ``spread``: rollouts in groups with two or more rollouts and non-zero
    reward spread (GPG's accurate gradient estimation, alpha = B / (B - M) with M the
    samples whose advantage is 0 for lack of spread). ``reward``: rollouts with a non-zero
    reward (verl's compute_gpg_outcome_advantage, count_nonzero of the scores). Unset:
    ``reward`` under the verl profile, ``spread`` otherwise."""


@register("gpg", formula="a_i = alpha (r_i - mean_g r), alpha = B / max(#valid samples, 1)",
          source="GPG (Group Policy Gradient, Chu et al. 2025, arXiv 2504.02546); verl "
          "compute_gpg_outcome_advantage", params=GpgParams)
def gpg(batch: AdvantageBatch, params: GpgParams, pins: Pins) -> Advantages:
    """Group-centred reward without std normalisation, scaled by alpha = B / max(M, 1):
    B the number of included rollouts in the batch, M those that carry a gradient signal
    (see ``count``). Zero-advantage samples dilute a batch-mean loss; alpha undoes that
    dilution. alpha, B and M are reported. Under verl's singleton rule a lone rollout keeps
    alpha * r (verl's mean 0)."""
    stats = group_stats(batch, ddof=pins.std_ddof)
    g = batch.group
    count = params.count or pins.gpg_count
    if count == "reward":
        signal = batch.valid & (batch.rewards != 0)
    else:
        signal = batch.valid & (stats.count[g] >= 2) & ~stats.zero_spread[g]
    size = int(batch.valid.sum())
    valid = int(signal.sum())
    alpha = size / max(valid, 1)
    adv = alpha * (batch.rewards - stats.mean[g])
    rollout = _finish(batch, adv, alpha * batch.rewards, pins, stats)
    return Advantages(rollout=rollout,
                      report={"alpha": alpha, "batch_size": size, "valid": valid, "count": count})


def _flag(batch: AdvantageBatch, name: str) -> Tensor:
    """bool [R]: a boolean rollout field of the request rollouts (False where unknown).

    A loop over rollouts: flags such as ``greedy`` are not among the batch's flat tensors."""
    if len(batch.rollouts) != batch.size:
        return torch.zeros(batch.size, dtype=torch.bool)
    return torch.tensor([bool(getattr(r, name)) for r in batch.rollouts], dtype=torch.bool)


def _group_ids(batch: AdvantageBatch, groups: Tensor) -> list[str]:
    if len(batch.groups) == batch.num_groups:
        return [batch.groups[gi].group_id for gi in groups.tolist()]
    return [str(gi) for gi in groups.tolist()]


@register("remax", formula="a_i = r_i - r_greedy(g)", inputs=("rewards", "greedy"),
          source="ReMax (Li et al. 2023, arXiv 2310.10505); verl compute_remax_outcome_advantage")
def remax(batch: AdvantageBatch, params: EstimatorParams, pins: Pins) -> Advantages:
    """REINFORCE with the reward of the group's greedy rollout as baseline; the trainer
    sends that rollout in the group with ``greedy: true`` (exactly one per group). The
    greedy rollout itself gets 0 (r - r). A group whose greedy rollout is excluded (a failed
    reward with no fallback) has no baseline: all its rollouts get 0, and its group_id is
    listed in the report under ``no_baseline``."""
    g = batch.group
    greedy = _flag(batch, "greedy") & batch.valid
    baseline = torch.zeros(batch.num_groups, dtype=torch.float64).index_add_(
        0, g[greedy], batch.rewards[greedy])
    has_baseline = torch.zeros(batch.num_groups, dtype=torch.int64).index_add_(
        0, g[greedy], torch.ones_like(g[greedy])) == 1
    keep = batch.valid & has_baseline[g]
    adv = torch.where(keep, batch.rewards - baseline[g], torch.zeros_like(batch.rewards)) + 0.0
    missing = (~has_baseline).nonzero().squeeze(1)
    report = {"no_baseline": _group_ids(batch, missing)} if missing.numel() else {}
    return Advantages(rollout=adv, report=report)


class PasskParams(EstimatorParams):
    k: int = Field(1, ge=1, le=4096)
    """Pass@k's k. A group with fewer than k included rollouts uses k = n (every k-subset
    is then the whole group, so its advantages are 0); the report counts such groups."""
    threshold: float = 0.5
    """A rollout counts as correct when its reward is >= threshold (rewards are meant to be
    0/1; the threshold makes other scores binary)."""
    eps: float | None = Field(None, gt=0, le=1.0)
    """Epsilon added to s; unset uses the profile's (rewardd/verl 1e-6, trl 1e-4,
    openrlhf 1e-9)."""


def _binomial_ratio(top: Tensor, bottom: Tensor, terms: Tensor, most: int) -> Tensor:
    """float64 [G]: C(top, k) / C(bottom, k) with k = ``terms`` per group, as the product
    of (top - j) / (bottom - j) over j < k: exact zeros when k > top, no overflowing
    binomials. Needs bottom >= k."""
    j = torch.arange(most, dtype=torch.float64)
    used = j[None, :] < terms[:, None]
    factors = (top[:, None] - j) / (bottom[:, None] - j).clamp(min=1.0)
    return torch.where(used, factors, torch.ones_like(factors)).prod(dim=1)


@register("passk", formula="rho = 1 - C(n-c,k)/C(n,k), s = sqrt(rho(1-rho)); "
          "a+ = (1-rho)/(s+eps), a- = (1-rho-C(n-c-1,k-1)/C(n-1,k-1))/(s+eps)",
          source="Pass@k Training (Chen et al. 2025, arXiv 2508.10751), analytic advantage",
          params=PasskParams)
def passk(batch: AdvantageBatch, params: PasskParams, pins: Pins) -> Advantages:
    """The analytic advantage of training on the Pass@k reward: with n included rollouts
    of which c are correct, rho is the group's Pass@k; a correct rollout gets a+, an
    incorrect one a- (its share of the k-subsets it fails to rescue). Advantages sum to 0
    in every group; k = 1 is GRPO with the population std. A group with no correct or no
    incorrect rollout, and a lone rollout, get 0."""
    eps = params.eps if params.eps is not None else pins.eps
    g = batch.group
    correct = batch.valid & (batch.rewards >= params.threshold)
    n = group_sum(batch, torch.ones_like(batch.rewards))
    c = group_sum(batch, correct.to(torch.float64))
    k = n.clamp(max=float(params.k))
    most = int(k.max()) if k.numel() else 0
    rho = 1.0 - _binomial_ratio(n - c, n, k, most)
    s = (rho * (1.0 - rho)).clamp(min=0.0).sqrt()
    rescued = _binomial_ratio(n - c - 1.0, n - 1.0, k - 1.0, most)
    positive = (1.0 - rho) / (s + eps)
    negative = (1.0 - rho - rescued) / (s + eps)
    adv = torch.where(correct, positive[g], negative[g])
    adv = torch.where(batch.valid, adv, torch.zeros_like(adv)) + 0.0
    clipped = int(((n > 0) & (n < params.k)).sum())
    return Advantages(rollout=adv, report={"clipped_k_groups": clipped} if clipped else {})


class GrpoPasskParams(EstimatorParams):
    eps: float | None = Field(None, gt=0, le=1.0)
    """Epsilon added to the group std; unset uses the profile's."""
    norm_by_std: bool = True
    """Divide the gap by the group std plus eps (verl's norm_adv_by_std_in_grpo)."""


@register("grpo_passk", formula="a_best = (r_max - r_second) / (std_g r + eps), others 0",
          source="verl compute_grpo_passk_outcome_advantage (after arXiv 2503.19595)",
          params=GrpoPasskParams)
def grpo_passk(batch: AdvantageBatch, params: GrpoPasskParams, pins: Pins) -> Tensor:
    """Only the best rollout of each group is credited, by its margin over the runner-up,
    normalised by the group's std. Ties at the top give a margin of 0, so the whole group
    gets 0 and which of the tied rollouts is "best" never matters (the first in request
    order is taken, as verl's argmax). A group with fewer than two included rollouts gets 0
    (verl raises)."""
    eps = params.eps if params.eps is not None else pins.eps
    g = batch.group
    stats = group_stats(batch, ddof=pins.std_ddof)
    inf = torch.full((batch.num_groups,), float("inf"), dtype=torch.float64)
    best = (-inf).scatter_reduce(0, g[batch.valid], batch.rewards[batch.valid], "amax")
    index = torch.arange(batch.size)
    at_top = batch.valid & (batch.rewards == best[g])
    first = torch.full((batch.num_groups,), batch.size, dtype=torch.int64).scatter_reduce(
        0, g[at_top], index[at_top], "amin")
    chosen = index == first[g]
    others = batch.valid & ~chosen
    second = (-inf).scatter_reduce(0, g[others], batch.rewards[others], "amax")
    enough = stats.count >= 2
    gap = torch.where(enough, best - torch.where(enough, second, best), torch.zeros_like(best))
    if params.norm_by_std:
        gap = gap / (torch.nan_to_num(stats.std, nan=0.0) + eps)
    return torch.where(chosen & enough[g], gap[g], torch.zeros_like(batch.rewards)) + 0.0


class BaselineParams(ShapingParams):
    whiten: bool | None = None
    """Whiten over the batch's mask-1 tokens; unset follows the profile (whitened under
    rewardd, verl and openrlhf, not under trl)."""
    no_std_norm: bool = False
    """Whitening centres on the batch mean without dividing by the std (OpenRLHF's
    --algo.advantage.no_std_norm)."""


@register("reinforce_pp_baseline", formula="a_i = r_i - mean_g r, broadcast, then whitened "
          "over the batch's mask-1 tokens",
          source="REINFORCE++-baseline (arXiv 2501.03262); verl "
          "compute_reinforce_plus_plus_baseline_outcome_advantage; OpenRLHF "
          "'reinforce_baseline'", params=BaselineParams)
def reinforce_pp_baseline(batch: AdvantageBatch, params: BaselineParams, pins: Pins
                          ) -> Advantages | Tensor:
    """The group-mean baseline of Dr. GRPO, broadcast to every token and whitened over all
    mask-1 tokens of the batch's included rollouts (each rollout weighs by its length, as
    verl's masked_whiten and OpenRLHF's normalisation do), with the profile's variance and
    epsilon. Whitening shifts every token by the batch mean, so a zero-spread group ends at
    -mean/std, not 0, as in both trainers; ``whiten: false`` keeps the exact zeros. A batch
    sent without token counts (scalar output) is whitened over its rollouts, one entry
    each. Under verl's singleton rule a lone rollout keeps r before whitening.
    ``clip_range`` and ``kl_coef`` act before the whitening, as OpenRLHF's
    reinforce_baseline (the advantages are then per token)."""
    stats = group_stats(batch, ddof=pins.std_ddof)
    adv = shaped(batch, _finish(batch, batch.rewards - stats.mean[batch.group], batch.rewards,
                                pins, stats), params, pins)
    if not whitened("reinforce_pp_baseline", params.whiten, pins):
        return adv
    how = whitening("reinforce_pp_baseline", pins, params.no_std_norm)
    if isinstance(adv, Advantages):  # per token (a KL term): over the mask-1 tokens
        return Advantages(token=whiten_kept(adv.token, kept_tokens(batch), how))
    if batch.total_tokens == 0:
        return whiten(adv, batch.valid, how)
    # whitened over the batch's mask-1 tokens, from token counts: stays one value per rollout
    counts = torch.where(batch.valid, batch.mask_counts, torch.zeros_like(batch.mask_counts))
    return whiten_rollouts_over_tokens(adv, counts, how)
