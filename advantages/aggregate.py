"""Multi-reward aggregation: how reward components combine into advantages.

An aggregate is ``fn(batch, params, pins, estimate) -> Advantages``; ``estimate`` runs the
request's estimator (with its params) on a batch, so an aggregate can apply it to the
weighted sum (``sum``) or to each component on its own (gdpo and its kin).

The decoupled entries (gdpo, sa_mrpo, dara, gd2po) share one shape: A_i^k, the estimator on
component k alone (with grpo, the group z-score of component k), a per-component weight
w_k' (the request's w_k, or a batch-adaptive one), a weighted sum, then an optional batch
whitening. They need a rollout-level estimator: per-token advantages of a single component
are not defined, so a token-level estimator is a 422.
"""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.groups import batch_whiten, group_sum, whiten_rollouts_over_tokens
from rewardd.advantages.profiles import Pins
from rewardd.advantages.errors import invalid
from rewardd.advantages.registry import EstimatorParams, register
from rewardd.advantages.models import FiniteFloat

Estimate = Callable[[AdvantageBatch], Advantages]


@register("sum", kind="aggregate", formula="R_i = sum_k w_k r_i^k, then the estimator on R",
          source="sum_then_normalize (docs/estimators.md); every trainer's default")
def sum_then_normalize(batch: AdvantageBatch, params: EstimatorParams, pins: Pins,
                       estimate: Estimate) -> Advantages:
    """The weighted sum of the components is the reward; the estimator normalises it.
    The default, and the only choice with a single component."""
    return estimate(batch)


# ---- the decoupled family: shared parts ----------------------------------------------------

WhitenLevel = Literal["token", "rollout"]


class DecoupledParams(EstimatorParams):
    whiten: bool | None = None
    """Whiten the combined advantages over the batch. Unset: the profile decides (its
    ``whitened`` pins list gdpo for the whole family: rewardd, verl and trl whiten, openrlhf
    does not). Whitening uses the profile's whitening pins (ddof, epsilon) and shifts by the
    batch mean, so a group without signal gets -mean/std rather than 0, as in both trainers."""
    whiten_level: WhitenLevel | None = None
    """What the whitening statistics count. ``token``: each unmasked token of a kept rollout
    once, as verl's masked_whiten over the response mask, so a rollout weighs by its length
    (a kept rollout without an unmasked token gets 0). ``rollout``: each kept rollout once, as
    TRL's GDPO. Unset: the profile's level, else token; a batch with no unmasked token of a
    kept rollout (num_tokens not sent, scalar output) falls back to rollout. The level used is
    reported as ``whitening``."""


def _columns(batch: AdvantageBatch) -> tuple[Tensor, Tensor, tuple[str, ...], Tensor]:
    """Component rewards [R, K], where each counts (rollout and cell valid) [R, K], names,
    weights [K]. A batch without components (library use) is one component: its reward."""
    if batch.components is None or not batch.component_names:
        return (batch.rewards[:, None], batch.valid[:, None], ("reward",),
                torch.ones(1, dtype=torch.float64))
    k = len(batch.component_names)
    weights = batch.weights if batch.weights is not None else torch.ones(k, dtype=torch.float64)
    return (batch.components, batch.valid[:, None] & batch.component_valid,
            batch.component_names, weights)


def _token_level(entry: str) -> Exception:
    return invalid(
        ("body", "advantage", "estimator"),
        f"aggregate {entry!r} combines one advantage per rollout and component; the estimator "
        "gives per-token advantages: choose a rollout-level estimator (grpo, dr_grpo, rloo)")


def _per_component(batch: AdvantageBatch, estimate: Estimate, entry: str) -> Tensor:
    """float64 [R, K]: A_i^k, the estimator on component k alone over the rollouts that have
    it (others 0). One estimator call per component; K is small."""
    values, valid, names, _ = _columns(batch)
    out = []
    for k in range(len(names)):
        result = estimate(batch.with_rewards(values[:, k], valid=valid[:, k]))
        if result.rollout is None:
            raise _token_level(entry)
        out.append(result.rollout)
    return torch.stack(out, 1)


def _finish(entry: str, params: DecoupledParams, pins: Pins, batch: AdvantageBatch,
            combined: Tensor, keep: Tensor) -> tuple[Tensor, WhitenLevel | None]:
    """Zero outside ``keep``, whiten over ``keep`` where asked or pinned; the advantages [R]
    and the whitening level used (None: not whitened)."""
    combined = torch.where(keep, combined, torch.zeros_like(combined))
    whiten = params.whiten if params.whiten is not None else bool(
        {entry, "gdpo"} & pins.whitened)
    if not whiten:
        return combined + 0.0, None
    # gdpo's kin whiten as the trainer whitens gdpo unless the profile pins them itself
    pinned = entry if entry in pins.whitening else "gdpo"
    level = params.whiten_level or pins.whitening_for(pinned).level
    if level == "token":
        # rollout values broadcast to their mask-1 tokens, whitened over those tokens (verl's
        # masked_whiten), computed from token counts without broadcasting
        counts = torch.where(keep, batch.mask_counts, torch.zeros_like(batch.mask_counts))
        if int(counts.sum()) > 0:
            return whiten_rollouts_over_tokens(combined, counts,
                                               pins.whitening_for(pinned)), "token"
    return batch_whiten(combined, keep, pins, pinned), "rollout"


def _by_name(names: tuple[str, ...], values: Tensor) -> dict[str, float]:
    return dict(zip(names, values.tolist()))


def _decoupled(entry: str, params: DecoupledParams, pins: Pins, batch: AdvantageBatch,
               per: Tensor, weights: Tensor, report: dict) -> Advantages:
    """A_i = sum_k w_k' A_i^k over included rollouts, then ``_finish``."""
    names = _columns(batch)[2]
    adv, level = _finish(entry, params, pins, batch, (per * weights).sum(1), batch.valid)
    return Advantages(rollout=adv, components=dict(zip(names, per.T.contiguous().unbind(0))),
                      report={**report, "whitening": level})


# ---- gdpo -----------------------------------------------------------------------------------


@register("gdpo", kind="aggregate", params=DecoupledParams,
          formula="A_i = whiten_batch(sum_k w_k A_i^k); A^k = the estimator on component k "
                  "alone (grpo: (r^k - mean_g r^k) / (std_g r^k + eps))",
          source="GDPO (Group reward-Decoupled normalization Policy Optimization); NVlabs "
                 "verl-GDPO (masked_whiten) and trl-GDPO")
def gdpo(batch: AdvantageBatch, params: DecoupledParams, pins: Pins,
         estimate: Estimate) -> Advantages:
    """Normalise each reward component within its group on its own (with grpo, the group
    z-score over the rollouts that have the component), sum with the weights, then whiten
    the sum over the batch (``whiten``, ``whiten_level``). Normalising before summing keeps
    apart rollouts with different reward profiles that a weighted sum would merge.
    ``components`` holds each A^k, before weights and whitening."""
    per = _per_component(batch, estimate, "gdpo")
    return _decoupled("gdpo", params, pins, batch, per, _columns(batch)[3], {})


# ---- sa_mrpo --------------------------------------------------------------------------------


class SaMrpoParams(DecoupledParams):
    gamma: float = Field(1.0, ge=0.0, le=100.0)
    """Exponent of the saturation discount w_k' = w_k (1 - s_k)^gamma; 0 is GDPO."""
    ranges: dict[str, tuple[FiniteFloat, FiniteFloat]] = Field(default_factory=dict)
    """Declared [lo, hi] of a component's reward, by component name (as TRL's SA-GDPO
    reward_mins / reward_maxs). A component not listed uses the min and max of its included
    values in this batch."""

    @field_validator("ranges")
    @classmethod
    def _lo_below_hi(cls, ranges: dict[str, tuple[float, float]]
                     ) -> dict[str, tuple[float, float]]:
        for name, (lo, hi) in ranges.items():
            if not lo < hi:
                raise ValueError(f"range of {name!r} must have lo < hi; got [{lo}, {hi}]")
        return ranges


def _saturation(values: Tensor, valid: Tensor, names: tuple[str, ...],
                ranges: dict[str, tuple[float, float]]) -> Tensor:
    """s_k = clip((mean_k - lo_k) / (hi_k - lo_k), 0, 1) over the included values of k.
    0 where k has no included value or an empty range (all equal: no advantage to weigh)."""
    count = valid.sum(0)
    mean = torch.where(valid, values, torch.zeros_like(values)).sum(0) / count.clamp(min=1)
    lo = torch.where(valid, values, torch.full_like(values, math.inf)).amin(0)
    hi = torch.where(valid, values, torch.full_like(values, -math.inf)).amax(0)
    declared = [names.index(n) for n in ranges]
    if declared:
        bounds = torch.tensor(list(ranges.values()), dtype=torch.float64)
        lo[declared], hi[declared] = bounds[:, 0], bounds[:, 1]
    span = hi - lo
    known = (count > 0) & (span > 0) & torch.isfinite(span)
    s = ((mean - lo) / torch.where(known, span, torch.ones_like(span))).clamp(0.0, 1.0)
    return torch.where(known, s, torch.zeros_like(s)) + 0.0


def _check_ranges(names: tuple[str, ...], ranges: dict[str, tuple[float, float]]) -> None:
    """A declared range must name a component of the batch (422 otherwise)."""
    unknown = sorted(set(ranges) - set(names))
    if unknown:
        raise invalid(
            ("body", "advantage", "aggregate_params", "ranges", unknown[0]),
            f"aggregate 'sa_mrpo': no reward component {unknown[0]!r}; components: "
            f"{', '.join(names)}")


@register("sa_mrpo", kind="aggregate", params=SaMrpoParams,
          formula="w_k' = w_k (1 - s_k)^gamma, s_k = clip((mean r^k - lo_k) / (hi_k - lo_k), "
                  "0, 1); A_i = whiten_batch(sum_k w_k' A_i^k)",
          source="SA-MRPO (Saturation Aware Advantage Reweighting for Multi-Reward Policy "
                 "Optimization); trl-GDPO apply_sa_gdpo")
def sa_mrpo(batch: AdvantageBatch, params: SaMrpoParams, pins: Pins,
            estimate: Estimate) -> Advantages:
    """GDPO with weights discounted by saturation, moving effort to objectives with headroom.
    s_k is the batch mean of component k over its included rollouts, rescaled to [0, 1] by
    [lo_k, hi_k]: the declared ``ranges`` entry, else the min and max of its included values
    in this batch (so with binary rewards s_k is the batch pass rate), clipped to [0, 1]; an
    empty range gives s_k = 0. Reports ``saturation`` and the ``weights`` w_k' by name."""
    values, valid, names, weights = _columns(batch)
    _check_ranges(names, params.ranges)
    s = _saturation(values, valid, names, params.ranges)
    adapted = weights * (1.0 - s) ** params.gamma + 0.0
    per = _per_component(batch, estimate, "sa_mrpo")
    return _decoupled("sa_mrpo", params, pins, batch, per, adapted,
                      {"saturation": _by_name(names, s), "weights": _by_name(names, adapted)})


# ---- dara -----------------------------------------------------------------------------------


def _density(batch: AdvantageBatch, values: Tensor, valid: Tensor) -> Tensor:
    """rho_k [K]: the fraction of groups (those with an included rollout) in which component k
    has spread, two included values that differ (an exact test, as the zero-spread rule)."""
    g, k = batch.num_groups, values.shape[1]
    index = batch.group[:, None].expand(-1, k)
    inf = torch.full((g, k), math.inf, dtype=torch.float64)
    lo = inf.scatter_reduce(0, index, torch.where(valid, values, math.inf), "amin")
    hi = (-inf).scatter_reduce(0, index, torch.where(valid, values, -math.inf), "amax")
    present = group_sum(batch, torch.ones_like(batch.rewards)) > 0
    active = (hi > lo) & present[:, None]
    return active.sum(0).to(torch.float64) / present.sum().clamp(min=1)


@register("dara", kind="aggregate", params=DecoupledParams,
          formula="rho_k = fraction of groups where r^k has spread; w_k' = c w_k / sqrt(rho_k) "
                  "(0 where rho_k = 0), c so sum |w'| = sum |w|; A_i = whiten_batch(sum_k "
                  "w_k' A_i^k)",
          source="DARA (Density-Aware Reward Aggregation), inverse-square-root density "
                 "correction")
def dara(batch: AdvantageBatch, params: DecoupledParams, pins: Pins,
         estimate: Estimate) -> Advantages:
    """GDPO with weights corrected for density: a component's advantage energy over the
    batch grows with rho_k, the fraction of groups where it has spread, so w_k / sqrt(rho_k)
    evens out rarely active components. Renormalised so sum |w_k'| = sum |w_k| (the scale the
    request chose; the released code instead scales by sqrt(max rho / rho), equal up to that
    constant, which whitening removes). rho_k = 0 gives w_k' = 0: the component has no signal.
    With every component dense (rho_k equal) it is GDPO. Reports ``density`` and ``weights``."""
    values, valid, names, weights = _columns(batch)
    rho = _density(batch, values, valid)
    raw = torch.where(rho > 0, weights / rho.sqrt(), torch.zeros_like(weights))
    total = raw.abs().sum()
    adapted = (raw * (weights.abs().sum() / total) if bool(total > 0) else raw) + 0.0
    per = _per_component(batch, estimate, "dara")
    return _decoupled("dara", params, pins, batch, per, adapted,
                      {"density": _by_name(names, rho), "weights": _by_name(names, adapted)})


# ---- gd2po ----------------------------------------------------------------------------------


class Gd2poParams(DecoupledParams):
    tau: float = Field(0.8, ge=0.0, le=1.0)
    """Conflict threshold: rollouts with conflict > tau are masked (advantage 0). The abstract
    gives no value; 0.8 is the released code's threshold 0.2 on |sum_k A^k| / sum_k |A^k|
    (masked below it). 0 masks every rollout whose weighted component advantages have mixed
    signs (the paper's "hard" variant); 1 masks none."""
    consensus: Literal["agreement", "keep_ratio"] = "agreement"
    """Group weight. ``agreement``: mean of 1 - conflict over the group's included rollouts,
    masked ones too (docs/estimators.md: mean agreement of its rollouts). ``keep_ratio``: the
    fraction of them not masked (the released code's group keep ratio)."""


def _ids(items: object, attr: str, count: int) -> list[str]:
    """Request ids of rollouts or groups; positions as strings for batches built directly."""
    return [getattr(x, attr) for x in items] if items else [str(i) for i in range(count)]


@register("gd2po", kind="aggregate", params=Gd2poParams,
          formula="conflict_i = 1 - |sum_k w_k A_i^k| / sum_k |w_k A_i^k| (0/0 -> 0); masked "
                  "if conflict_i > tau; c_g = mean_{i in g} (1 - conflict_i); A_i = "
                  "whiten_batch(c_g sum_k w_k A_i^k) over unmasked rollouts, 0 on masked",
          source="GD^2PO (Group-Dynamic reward-Decoupled Policy Optimization); "
                 "Qwen-Applications/GD2PO")
def gd2po(batch: AdvantageBatch, params: Gd2poParams, pins: Pins,
          estimate: Estimate) -> Advantages:
    """GDPO that masks rollouts whose component advantages pull against each other, so
    opposing signals do not cancel, and weights each group by its reward consensus.
    Agreement of a rollout is |sum_k w_k A_i^k| / sum_k |w_k A_i^k| (1 when every A_i^k is
    0), conflict = 1 - agreement; |w_k| in the denominator keeps it in [0, 1] with negative
    weights. The group weight c_g follows ``consensus``; it scales the sum before the
    whitening, which then runs over the unmasked rollouts only (as the released code).
    Reports ``masked`` (rollout ids) and ``consensus`` by group id (null for a group with no
    included rollout)."""
    _, _, names, weights = _columns(batch)
    per = _per_component(batch, estimate, "gd2po")
    parts = per * weights
    total, spread = parts.sum(1), parts.abs().sum(1)
    agreement = torch.where(spread > 0, total.abs() / torch.where(spread > 0, spread, 1.0),
                            torch.ones_like(total))
    masked = batch.valid & (1.0 - agreement > params.tau)
    count = group_sum(batch, torch.ones_like(total))
    share = agreement if params.consensus == "agreement" else (~masked).to(torch.float64)
    consensus = group_sum(batch, share) / count.clamp(min=1)
    adv, level = _finish("gd2po", params, pins, batch, consensus[batch.group] * total,
                         batch.valid & ~masked)
    rollout_ids = _ids(batch.rollouts, "rollout_id", batch.size)
    group_ids = _ids(batch.groups, "group_id", batch.num_groups)
    report = {
        "masked": [rollout_ids[i] for i in masked.nonzero().flatten().tolist()],
        "consensus": {gid: (c if n else None) for gid, c, n in
                      zip(group_ids, consensus.tolist(), count.tolist())},
        "tau": params.tau, "whitening": level}
    return Advantages(rollout=adv, components=dict(zip(names, per.T.contiguous().unbind(0))),
                      report=report)
