"""Filters and sampling advice: returned beside the advantages, never applied to them.

A filter is ``fn(batch, advantages, params, pins) -> dict`` (JSON-ready). The response
carries the dict under ``advice[name]``; a ``"filtered": [group_id, ...]`` key in it marks
those groups' ``diagnostics.filtered``. The trainer decides what to do with the advice (drop
the groups, resample, reweight its data loader); the advantages are the same with or
without any filter.

Everything here reads included rollouts only (``batch.valid``). Rewards are the ones the
estimator saw (after the reward transforms); advantages are the final ones (after
reweighting). A token-level result is read per rollout as its mean over mask-1 tokens.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.groups import group_stats, group_sum
from rewardd.advantages.profiles import Pins
from rewardd.advantages.registry import EstimatorParams, register

UCB_STATE_KEY = "ucb_curriculum"


# ----------------------------------------------------------------------------- helpers


def _group_ids(batch: AdvantageBatch) -> list[str]:
    return [g.group_id for g in batch.groups]


def _per_rollout(batch: AdvantageBatch, advantages: Advantages, absolute: bool = False
                 ) -> Tensor:
    """float64 [R]: each rollout's advantage (or |advantage|); a token-level result gives the
    mean over the rollout's mask-1 tokens (0 for a rollout without any)."""
    if advantages.rollout is not None:
        a = advantages.rollout
        return a.abs() if absolute else a
    tokens = advantages.per_token(batch)
    if absolute:
        tokens = tokens.abs()
    zeros = torch.zeros(batch.size, dtype=torch.float64)
    total = zeros.index_add(0, batch.token_rollout, tokens)
    count = zeros.index_add(0, batch.token_rollout, batch.token_mask.to(torch.float64))
    return total / count.clamp(min=1.0)


def _accuracy(batch: AdvantageBatch, threshold: float) -> tuple[Tensor, Tensor]:
    """Per group: (included rollouts, those with reward >= threshold), float64 [G] each."""
    count = group_sum(batch, torch.ones_like(batch.rewards))
    correct = group_sum(batch, (batch.rewards >= threshold).to(torch.float64))
    return count, correct


# ----------------------------------------------------------------------------- dynamic sampling


class DynamicSamplingParams(EstimatorParams):
    min_score: float | None = None
    """Also mark a group whose mean included reward is below this (unset: no lower bound)."""
    max_score: float | None = None
    """Also mark a group whose mean included reward is above this (unset: no upper bound)."""
    filter_singletons: bool = False
    """Mark groups with one included rollout too. False keeps them, as verl's DAPO recipe
    does (``std > 0 or len == 1``)."""

    @model_validator(mode="after")
    def _ordered(self) -> DynamicSamplingParams:
        if self.min_score is not None and self.max_score is not None \
                and self.min_score > self.max_score:
            raise ValueError(f"min_score {self.min_score} is above max_score {self.max_score}")
        return self


@register("dynamic_sampling", kind="filter", params=DynamicSamplingParams,
          formula="filter g if min_g r == max_g r over included rollouts "
                  "(or mean_g r outside [min_score, max_score])",
          source="DAPO (Yu et al. 2025), dynamic sampling; verl recipe/dapo filter_groups")
def dynamic_sampling(batch: AdvantageBatch, advantages: Advantages,
                     params: DynamicSamplingParams, pins: Pins) -> dict[str, Any]:
    """DAPO's dynamic sampling as advice: mark the groups whose included rollouts all have the
    same reward (all correct or all wrong), since group-relative advantages give them no
    gradient. Spread is decided exactly (min == max), not by std > 0.

    Also marked: groups with no included rollout; groups whose mean reward lies outside
    [min_score, max_score] when either bound is set; groups with a single included rollout
    when filter_singletons (verl's recipe keeps them, so the default does too).

    Returns ``filtered`` (group ids, in request order), ``kept`` (number of groups not
    marked) and ``fraction_filtered``.
    """
    stats = group_stats(batch, ddof=pins.std_ddof)
    marked = stats.zero_spread | (stats.count == 0)
    if params.filter_singletons:
        marked |= stats.count == 1
    if params.min_score is not None:
        marked |= stats.mean < params.min_score
    if params.max_score is not None:
        marked |= stats.mean > params.max_score
    ids = _group_ids(batch)
    filtered = [ids[g] for g in marked.nonzero().flatten().tolist()]
    return {"filtered": filtered, "kept": batch.num_groups - len(filtered),
            "fraction_filtered": len(filtered) / max(batch.num_groups, 1)}


# ----------------------------------------------------------------------------- pairwise sampling


class PairwiseSamplingParams(EstimatorParams):
    k: int = Field(1, ge=1)
    """Pairs per group, at most floor(n/2) for n included rollouts."""
    by: Literal["advantage", "reward"] = "advantage"
    """Contrast measured on final advantages (Shuffle-R1) or on rewards. Token-level
    advantages count as each rollout's mean over its mask-1 tokens."""


@register("pairwise_sampling", kind="filter", params=PairwiseSamplingParams,
          formula="sort group by x; pair j = (j-th largest, j-th smallest), contrast "
                  "x_high - x_low; keep the first k pairs with contrast > 0",
          source="Shuffle-R1 (Zhu et al. 2025), pairwise trajectory sampling")
def pairwise_sampling(batch: AdvantageBatch, advantages: Advantages,
                      params: PairwiseSamplingParams, pins: Pins) -> dict[str, Any]:
    """Shuffle-R1's pairwise trajectory sampling: the highest-contrast pairs of each group.

    Pairs are disjoint, as in Shuffle-R1: sorting the group's included rollouts by x
    (advantage, or reward with ``by='reward'``), pair j joins the j-th largest with the j-th
    smallest. That greedy matching maximises the total contrast |x_a - x_b| over disjoint
    pairs, and contrasts decrease with j, so the first k pairs are the top k. Pairs of
    contrast 0 carry no signal and are left out. Ties in x keep request order (the later
    rollout sorts higher). One sort of the whole batch by (group, x): O(R log R).

    Returns ``pairs``: {group_id: [[high rollout_id, low rollout_id, contrast], ...]} for
    every group (an empty list where no pair has contrast).
    """
    x = _per_rollout(batch, advantages) if params.by == "advantage" else batch.rewards
    included = batch.valid.nonzero().flatten()
    values, groups = x[included], batch.group[included]
    by_value = torch.argsort(values, stable=True)
    order = by_value[torch.argsort(groups[by_value], stable=True)]
    ranked = included[order]  # included rollouts sorted by (group, x ascending)
    n = torch.bincount(groups, minlength=batch.num_groups)
    start = torch.cumsum(n, 0) - n
    m = torch.clamp(n // 2, max=params.k)
    pair_group = torch.repeat_interleave(torch.arange(batch.num_groups), m)
    j = torch.arange(int(m.sum())) - (torch.cumsum(m, 0) - m)[pair_group]
    low = ranked[start[pair_group] + j]
    high = ranked[start[pair_group] + n[pair_group] - 1 - j]
    contrast = x[high] - x[low]
    keep = contrast > 0
    ids = _group_ids(batch)
    pairs: dict[str, list[list[Any]]] = {gid: [] for gid in ids}
    # Building the JSON answer is a loop over the (at most k per group) selected pairs.
    for g, a, b, c in zip(pair_group[keep].tolist(), high[keep].tolist(), low[keep].tolist(),
                          contrast[keep].tolist()):
        pairs[ids[g]].append([batch.rollouts[a].rollout_id, batch.rollouts[b].rollout_id, c])
    return {"pairs": pairs}


# ----------------------------------------------------------------------------- variance priority


class VariancePriorityParams(EstimatorParams):
    mode: Literal["binary", "variance"] = "binary"
    """binary: p (1 - p) with p the group accuracy; variance: population variance of the
    rewards over (high - low)^2. Both lie in [0, 0.25] and agree on 0/1 rewards."""
    threshold: float = 0.5
    """binary mode: a rollout is correct when its reward is >= threshold."""
    low: float = 0.0
    """variance mode: the lowest reward possible."""
    high: float = 1.0
    """variance mode: the highest reward possible."""

    @model_validator(mode="after")
    def _range(self) -> VariancePriorityParams:
        if self.high <= self.low:
            raise ValueError(f"high {self.high} must be above low {self.low}")
        return self


@register("variance_priority", kind="filter", params=VariancePriorityParams,
          formula="binary: s_g = p_g (1 - p_g), p_g = mean_g [r >= threshold]; "
                  "variance: s_g = var_g(r) / (high - low)^2 (population variance)",
          source="VCRL (variance-based curriculum RL, 2025)")
def variance_priority(batch: AdvantageBatch, advantages: Advantages, params: VariancePriorityParams,
                      pins: Pins) -> dict[str, Any]:
    """VCRL's curriculum score: prompts of moderate difficulty (high reward variance) first;
    too easy or too hard prompts (low variance) last.

    binary: s = p (1 - p), p the fraction of included rollouts with reward >= threshold.
    variance: the population variance over the squared reward range, so 0/1 rewards give
    exactly p (1 - p) in both modes (VCRL's sigma^2 / sigma^2_max is 4 s). A group with no
    included rollout scores 0; a zero-spread group scores exactly 0.

    Returns ``scores`` {group_id: s} and ``order``: group ids by descending score, ties in
    request order.
    """
    if params.mode == "binary":
        count, correct = _accuracy(batch, params.threshold)
        p = correct / count.clamp(min=1.0)
        score = p * (1.0 - p)
    else:
        stats = group_stats(batch)
        centred = batch.rewards - stats.mean[batch.group]
        var = group_sum(batch, centred * centred) / stats.count.clamp(min=1.0)
        score = torch.where(stats.zero_spread, torch.zeros_like(var),
                            var / (params.high - params.low) ** 2)
    score = score + 0.0
    ids = _group_ids(batch)
    order = torch.argsort(-score, stable=True).tolist()
    return {"scores": dict(zip(ids, score.tolist())), "order": [ids[g] for g in order]}


# ----------------------------------------------------------------------------- budget


class BudgetParams(EstimatorParams):
    total: int = Field(ge=0)
    """Rollouts to allocate over this batch's prompts for the next round (required)."""
    min_per_prompt: int = Field(0, ge=0)
    """Floor for every prompt that is not skipped (lowered to total // prompts when the
    budget cannot cover it)."""
    max_per_prompt: int = Field(64, ge=1)
    """Cap per prompt; budget that every prompt at the cap cannot use is ``unallocated``."""
    weight: Literal["std", "variance"] = "std"
    """Allocate proportionally to sqrt(p (1 - p)) (std, the default) or to p (1 - p)."""
    threshold: float = 0.5
    """A pilot rollout is correct when its reward is >= threshold."""
    skip_solved: bool = True
    """Skip prompts whose pilot rollouts were all correct or all wrong (low signal), once
    there are at least min_pilot of them."""
    min_pilot: int = Field(2, ge=1)
    """Included pilot rollouts needed before all-correct / all-wrong counts as confident."""
    prior: float = Field(0.0, ge=0.0)
    """Beta pseudo-count: p = (correct + prior) / (n + 2 prior). 0 uses the raw accuracy; a
    prompt without included pilot rollouts gets p = 1/2 (unexplored: the largest weight)."""

    @model_validator(mode="after")
    def _bounds(self) -> BudgetParams:
        if self.max_per_prompt < self.min_per_prompt:
            raise ValueError(f"max_per_prompt {self.max_per_prompt} is below min_per_prompt "
                             f"{self.min_per_prompt}")
        return self


def _water_fill(w: Tensor, total: int, lo: int, hi: int) -> Tensor:
    """float64 quotas q = clip(lam w, lo, hi) with sum q = total, for lo * n <= total <=
    hi * n. Prompts of weight 0 stay at lo unless the others all reach hi first."""
    positive = w > 0
    n_pos, n_zero = int(positive.sum()), int((~positive).sum())
    q = torch.full_like(w, float(lo))
    if total >= n_pos * hi + n_zero * lo:  # the weighted prompts saturate; the rest split
        q[positive] = float(hi)
        if n_zero:
            q[~positive] = (total - n_pos * hi) / n_zero
        return q
    target = total - n_zero * lo
    wp = w[positive]
    lam_lo, lam_hi = 0.0, hi / float(wp.min())
    # sum clip(lam w) is monotone in lam: bisection converges to float resolution.
    for _ in range(200):
        lam = 0.5 * (lam_lo + lam_hi)
        if float((lam * wp).clamp(lo, hi).sum()) < target:
            lam_lo = lam
        else:
            lam_hi = lam
    q[positive] = (lam_hi * wp).clamp(lo, hi)
    return q


def _largest_remainder(q: Tensor, total: int, hi: int) -> Tensor:
    """int64 allocation: floor(q), then +1 for the largest remainders until the sum is total
    (ties in request order)."""
    floor = q.floor()
    short = total - int(floor.sum())
    remainder = torch.where(floor < hi, q - floor, torch.full_like(q, -1.0))
    top = torch.argsort(-remainder, stable=True)[:max(short, 0)]
    return floor.to(torch.int64).index_add_(0, top, torch.ones_like(top))


@register("budget", kind="filter", params=BudgetParams,
          formula="n_g = largest_remainder(clip(lam sqrt(p_g (1 - p_g)), min, max)), "
                  "sum_g n_g = total; p in {0, 1} skipped",
          source="Pilot-Commit (budget-aware rollout allocation); difficulty-based rollout "
                 "allocation (E3-RL4LLMs)")
def budget(batch: AdvantageBatch, advantages: Advantages, params: BudgetParams,
           pins: Pins) -> dict[str, Any]:
    """Pilot-Commit's commit stage as advice: treat this batch as the pilot and split
    ``total`` rollouts over its prompts for the next round, more to prompts of high reward
    variance, none to prompts the pilot found solved or hopeless.

    p_g = (c_g + prior) / (n_g + 2 prior) from the n_g included pilot rollouts, c_g of them
    with reward >= threshold. A prompt whose pilot rollouts were all correct or all wrong
    (c_g in {0, n_g}, n_g >= min_pilot) is skipped (skip_solved). The others share the budget proportionally to
    w_g = sqrt(p_g (1 - p_g)) (``weight='variance'``: p_g (1 - p_g)), within
    [min_per_prompt, max_per_prompt]: a continuous water-filling (the proportionality
    constant found by bisection), then integers by the largest-remainder method, so the
    allocation sums to exactly ``total``. Exceptions, reported in ``unallocated``: every
    prompt skipped (all of total), or every prompt at max_per_prompt (the excess). If total
    cannot give every prompt min_per_prompt, the floor drops to total // prompts. If no
    prompt has weight (all p in {0, 1}, prior 0, not skipped), the budget splits evenly.

    Returns ``allocation`` {group_id: n} (skipped prompts 0), ``skipped`` (group ids) and
    ``unallocated``.
    """
    count, correct = _accuracy(batch, params.threshold)
    solved = (correct == 0) | (correct == count)
    skipped = params.skip_solved & (count >= params.min_pilot) & solved
    denom = count + 2.0 * params.prior
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    p = torch.where(denom > 0, (correct + params.prior) / safe, torch.full_like(count, 0.5))
    w = p * (1.0 - p)
    if params.weight == "std":
        w = w.sqrt()
    active = ~skipped
    m = int(active.sum())
    allocation = torch.zeros(batch.num_groups, dtype=torch.int64)
    unallocated = params.total
    if m:
        hi = params.max_per_prompt
        lo = min(params.min_per_prompt, params.total // m)
        spend = min(params.total, m * hi)
        wa = w[active]
        if not bool((wa > 0).any()):
            wa = torch.ones_like(wa)
        q = _water_fill(wa, spend, lo, hi)
        allocation[active] = _largest_remainder(q, spend, hi)
        unallocated = params.total - spend
    ids = _group_ids(batch)
    return {"allocation": dict(zip(ids, allocation.tolist())),
            "skipped": [ids[g] for g in skipped.nonzero().flatten().tolist()],
            "unallocated": unallocated}


# ----------------------------------------------------------------------------- UCB curriculum


class UcbParams(EstimatorParams):
    c: float = Field(1.0, ge=0.0)
    """Exploration weight of the UCB bonus."""
    temperature: float = Field(1.0, gt=0.0)
    """Softmax temperature of the sampling weights."""


@register("ucb_curriculum", kind="filter", params=UcbParams, inputs=("data_source",),
          stateful=True,
          formula="score_s = mean|A|_s + c sqrt(2 ln N / n_s); w = softmax(score / T)",
          source="DUMP (Wang et al. 2025), distribution-level curriculum by UCB")
def ucb_curriculum(batch: AdvantageBatch, advantages: Advantages, params: UcbParams,
                   pins: Pins) -> dict[str, Any]:
    """DUMP's distribution-level curriculum: sample more from data sources where the policy
    still has much to learn (large mean |advantage|) or that were seen little.

    Per run, per data source s: n_s, the prompts (groups with at least one included
    rollout) seen so far, and mean|A|_s, the running mean over those prompts of each
    prompt's mean |A| over its included rollouts (DUMP's E_x E_o |A|; a token-level result
    counts as the rollout's mean |A_t| over mask-1 tokens). N = sum_s n_s. The state lives
    in the run under ``ucb_curriculum`` and grows by every request, so resending a batch
    counts it twice. Weights are a softmax over every source seen in the run so far;
    sources whose groups had no included rollout are not counted.

    Returns ``weights``, ``scores``, ``counts`` and ``mean_abs_advantage``, each by source.
    """
    if batch.run is None:  # validation demands a run_id; this is a caller without a store
        raise RuntimeError("ucb_curriculum keeps per-run state: pass a RunStore with the "
                           "request (pipeline.advantages(req, runs))")
    state = batch.run.get(UCB_STATE_KEY) or {"sources": {}}
    sources = state["sources"]
    names = list(dict.fromkeys(g.data_source for g in batch.groups))
    index = {name: k for k, name in enumerate(names)}
    # Mapping the groups' source names to indices is a loop over groups (strings).
    group_source = torch.tensor([index[g.data_source] for g in batch.groups], dtype=torch.int64)
    count = group_sum(batch, torch.ones_like(batch.rewards))
    abs_mean = group_sum(batch, _per_rollout(batch, advantages, absolute=True)) \
        / count.clamp(min=1.0)
    seen = (count > 0).to(torch.float64)
    zeros = torch.zeros(len(names), dtype=torch.float64)
    prompts = zeros.index_add(0, group_source, seen)
    abs_total = zeros.index_add(0, group_source, abs_mean * seen)
    for name, n_new, total_new in zip(names, prompts.tolist(), abs_total.tolist()):
        if n_new == 0:
            continue
        old = sources.get(name, {"count": 0, "mean_abs_advantage": 0.0})
        n = old["count"] + int(n_new)
        mean = (old["mean_abs_advantage"] * old["count"] + total_new) / n
        sources[name] = {"count": n, "mean_abs_advantage": mean}
    batch.run.put(UCB_STATE_KEY, state)
    seen_names = list(sources)
    n_s = torch.tensor([sources[s]["count"] for s in seen_names], dtype=torch.float64)
    mean_s = torch.tensor([sources[s]["mean_abs_advantage"] for s in seen_names],
                          dtype=torch.float64)
    score = mean_s + params.c * torch.sqrt(2.0 * torch.log(n_s.sum()) / n_s)
    weights = torch.softmax(score / params.temperature, 0) if seen_names else score
    return {"weights": dict(zip(seen_names, weights.tolist())),
            "scores": dict(zip(seen_names, score.tolist())),
            "counts": {s: sources[s]["count"] for s in seen_names},
            "mean_abs_advantage": dict(zip(seen_names, mean_s.tolist()))}
