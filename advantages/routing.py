"""Token routing: advantages that differ between the parts of one response.

An outcome estimator gives every token of a rollout the same advantage. The entries here
route credit to spans instead: reward components to labelled segments (``segment``), a
stratified baseline to a later block (``outcome_conditioned``), per-turn returns to turns
(``turn``). The span helpers below also serve ``steps.py`` (gigpo, bipace).

Spans arrive as the validated request objects on ``batch.rollouts``. Building their index
tensors is one Python pass over the spans (O(spans); the objects are pydantic models), after
which all work is vectorised over the flat token tensor. A validated request never has
overlapping spans of one kind in a rollout; where a batch built directly does, the
contributions of overlapping spans add up.

Sets smaller than a group (the rollouts carrying a segment, the rollouts at turn j, a step
group) give 0 to a set of fewer than two included members whatever the profile: no trainer
implements these entries, so there is no trainer rule to reproduce. The profile still sets
the std estimator and the epsilon.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.groups import GroupStats, group_stats
from rewardd.advantages.outcome import (GrpoParams, ShapingParams, building_block, dr_grpo,
                                        grpo)
from rewardd.advantages.profiles import Pins
from rewardd.advantages.errors import invalid
from rewardd.advantages.registry import register
from rewardd.advantages.models import Name

Base = Literal["grpo", "dr_grpo"]


# ---- spans -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spans:
    """Spans of one kind (segments, turns or steps) over the batch, rollout by rollout, each
    rollout's in order of start."""

    rollout: Tensor  # int64 [S]
    start: Tensor  # int64 [S], token index inside the rollout
    end: Tensor  # int64 [S], exclusive
    index: Tensor  # int64 [S], rank of the span inside its rollout: 0, 1, ...
    remaining: Tensor  # int64 [S], spans after this one in its rollout
    items: list[Any]  # the request objects (Segment, Turn, Step), same order

    @property
    def size(self) -> int:
        return len(self.items)

    def tokens(self, batch: AdvantageBatch) -> tuple[Tensor, Tensor]:
        """(flat token index [M], span index [M]) for every token of every span."""
        lengths = self.end - self.start
        span = torch.repeat_interleave(torch.arange(self.size), lengths)
        first_pair = torch.cumsum(lengths, 0) - lengths
        within = torch.arange(int(lengths.sum())) - first_pair[span]
        token = (batch.offsets[self.rollout] + self.start)[span] + within
        return token, span

    def where(self, keep: Tensor) -> Spans:
        """The spans where ``keep`` [S] is True, in the same order."""
        picked = keep.nonzero().squeeze(1).tolist()
        return Spans(rollout=self.rollout[keep], start=self.start[keep], end=self.end[keep],
                     index=self.index[keep], remaining=self.remaining[keep],
                     items=[self.items[k] for k in picked])


def spans_of(batch: AdvantageBatch, field: Literal["segments", "turns", "steps"]) -> Spans:
    """The ``field`` spans of every rollout (a rollout without them has none)."""
    if len(batch.rollouts) != batch.size:
        raise ValueError(f"routing by {field} needs the request rollouts on the batch")
    rollout: list[int] = []
    bounds: list[tuple[int, int]] = []
    index: list[int] = []
    remaining: list[int] = []
    items: list[Any] = []
    for i, r in enumerate(batch.rollouts):
        spans = sorted(getattr(r, field) or (), key=lambda s: s.start)
        for j, span in enumerate(spans):
            rollout.append(i)
            bounds.append((span.start, span.end))
            index.append(j)
            remaining.append(len(spans) - 1 - j)
            items.append(span)
    pairs = torch.tensor(bounds, dtype=torch.int64).reshape(-1, 2)
    return Spans(rollout=torch.tensor(rollout, dtype=torch.int64), start=pairs[:, 0],
                 end=pairs[:, 1], index=torch.tensor(index, dtype=torch.int64),
                 remaining=torch.tensor(remaining, dtype=torch.int64), items=items)


def spread_to_tokens(batch: AdvantageBatch, spans: Spans, span_values: Tensor
                     ) -> tuple[Tensor, Tensor]:
    """float64 [N]: each span's value [S] on its tokens, 0 elsewhere; and the bool [N] of the
    tokens inside some span."""
    token, span = spans.tokens(batch)
    out = torch.zeros(batch.total_tokens, dtype=torch.float64).index_add_(
        0, token, span_values[span])
    covered = torch.zeros(batch.total_tokens, dtype=torch.bool)
    covered[token] = True
    return out, covered


# ---- statistics over sets smaller than a group ---------------------------------------------

def _sets(values: Tensor, keys: Tensor, include: Tensor) -> AdvantageBatch:
    """A batch whose "groups" are the distinct ``keys``, so group_stats and the outcome
    estimators run unchanged over any partition of rows."""
    sets = torch.unique(keys, return_inverse=True)[1] if keys.numel() else keys
    return AdvantageBatch(rewards=values, group=sets, valid=include,
                          num_tokens=torch.zeros_like(sets),
                          num_groups=int(sets.max()) + 1 if sets.numel() else 0)


def set_stats(values: Tensor, keys: Tensor, include: Tensor, ddof: int
              ) -> tuple[GroupStats, Tensor]:
    """Count, mean, std and zero spread of the sets of equal ``keys`` (included rows only),
    and each row's set index."""
    sub = _sets(values, keys, include)
    return group_stats(sub, ddof=ddof), sub.group


def relative(values: Tensor, keys: Tensor, include: Tensor, pins: Pins, base: Base = "grpo",
             eps: float | None = None) -> Tensor:
    """float64 [rows]: the ``base`` advantage of ``values`` within the sets of equal ``keys``,
    over the ``include`` rows. Rows not included, sets of fewer than two included rows and
    sets of one value get exactly 0."""
    if values.numel() == 0:
        return torch.zeros_like(values)
    sub = _sets(values, keys, include)
    zero_rule = replace(building_block(pins), singleton="zero")
    if base == "grpo":
        return grpo(sub, GrpoParams(eps=eps), zero_rule)
    return dr_grpo(sub, ShapingParams(), zero_rule)


def discounted_suffix_sum(values: Tensor, remaining: Tensor, gamma: float) -> Tensor:
    """G_s = sum_{k=0..remaining_s} gamma^k values_{s+k} over runs of consecutive rows (a
    row's run ends ``remaining`` rows later). Doubling: after round j each G covers 2^j rows,
    so O(rows log longest run), with only non-negative powers of gamma (no overflow)."""
    out = values.clone()
    shift, factor = 1, gamma
    longest = int(remaining.max()) if remaining.numel() else 0
    while shift <= longest:
        ahead = torch.zeros_like(out)
        ahead[:-shift] = out[shift:]
        out = out + torch.where(remaining >= shift, factor * ahead, torch.zeros_like(out))
        shift, factor = 2 * shift, factor * factor
    return out


def base_advantage(batch: AdvantageBatch, base: Base, eps: float | None, pins: Pins) -> Tensor:
    """float64 [R]: grpo or dr_grpo of the batch's rewards under the profile's own rules."""
    if base == "grpo":
        return grpo(batch, GrpoParams(eps=eps), building_block(pins))
    return dr_grpo(batch, ShapingParams(), building_block(pins))


# ---- segment -------------------------------------------------------------------------------

class SegmentParams(GrpoParams):
    bindings: dict[Name, list[Name]] = {}
    """Component name -> the segment labels its advantage is routed to, for example
    {"format": ["think"], "correct": ["answer"]}. A label bound to several components gets the
    sum of their advantages. Empty: nothing is routed and every token gets the default."""
    default: Literal["zero", "total"] = "zero"
    """Tokens outside every routed segment: ``zero`` gives them 0; ``total`` gives them the
    ``base`` advantage of the weighted total reward (what the plain estimator gives)."""
    base: Base = "grpo"
    """Group-relative advantage of each component: grpo (r - mean) / (std + eps), or
    dr_grpo r - mean."""
    weighted: bool = False
    """Multiply each routed component's advantage by its weight (the weights of the total)."""


@register("segment", formula="A_{i,t} = sum_{k bound to label(t)} a_i^k, a^k = base(r^k) over "
          "the group's rollouts that carry a segment of k; default elsewhere",
          source="Blockwise Advantage Estimation; SLCA-GRPO (segment-locked credit); "
          "DSS-GRPO (segment-wise GRPO with hard token masks)",
          params=SegmentParams, inputs=("segments", "components"))
def segment(batch: AdvantageBatch, params: SegmentParams, pins: Pins) -> Advantages:
    """Each reward component gets its own group-relative advantage, applied only to the
    tokens of the segments bound to it (``bindings``), so one objective's signal does not
    leak into another's tokens.

    A component is normalised over the included rollouts of the group that carry at least one
    of its segments; fewer than two such rollouts give it 0. Overlapping bindings add up.
    Tokens outside every routed segment get the ``default``. Reads the component values
    (``batch.components``), so reward transforms that rewrite only the total do not reach the
    routed components; the ``total`` default does see them. Returns the per-component
    advantages [R] as ``components``."""
    names = list(params.bindings)
    unknown = [n for n in names if n not in batch.component_names]
    if unknown:
        raise invalid(("body", "advantage", "params", "bindings", unknown[0]),
                      f"estimator 'segment': no reward component {unknown[0]!r}; components "
                      f"of this request: {', '.join(batch.component_names)}")
    segs = spans_of(batch, "segments")
    labels: dict[str, int] = {}
    seg_label = torch.tensor([labels.setdefault(s.label, len(labels)) for s in segs.items],
                             dtype=torch.int64)
    bound = torch.zeros(len(labels), len(names), dtype=torch.bool)
    for b, name in enumerate(names):
        for label in params.bindings[name]:
            if label in labels:
                bound[labels[label], b] = True
    seg_bound = bound[seg_label]  # [S, B]
    carries = torch.zeros(batch.size, len(names), dtype=torch.float64).index_add_(
        0, segs.rollout, seg_bound.to(torch.float64)) > 0
    include = batch.valid[:, None] & carries
    per = torch.zeros(batch.size, len(names), dtype=torch.float64)
    if names:
        cols = torch.tensor([batch.component_names.index(n) for n in names], dtype=torch.int64)
        if batch.component_valid is not None:
            include &= batch.component_valid[:, cols]
        keys = batch.group[:, None] * len(names) + torch.arange(len(names))
        per = relative(batch.components[:, cols].flatten(), keys.flatten(), include.flatten(),
                       pins, params.base, params.eps).reshape(batch.size, len(names))
        if params.weighted:
            per = per * batch.weights[cols]
    routed_spans = seg_bound.any(1)
    span_values = (seg_bound.to(torch.float64) * per[segs.rollout]).sum(1)
    out, routed = spread_to_tokens(batch, segs.where(routed_spans), span_values[routed_spans])
    if params.default == "total":
        total = base_advantage(batch, params.base, params.eps, pins)[batch.token_rollout]
        out = torch.where(routed, out, total)
    return Advantages(
        token=out + 0.0, components={n: per[:, b] + 0.0 for b, n in enumerate(names)},
        report={"carriers": {n: int(include[:, b].sum()) for b, n in enumerate(names)},
                "routed_tokens": int(routed.sum())})


# ---- outcome-conditioned baseline ----------------------------------------------------------

class OutcomeConditionedParams(GrpoParams):
    block: Name | None = None
    """Label of the segments the advantage is applied to (the later block); other tokens get 0.
    Unset: the whole rollout, one advantage per rollout. Rollouts without such a segment get 0
    on every token."""
    min_stratum: int = Field(2, ge=1)
    """Fewest included rollouts a stratum needs to serve as the baseline; smaller strata fall
    back to the group mean."""
    normalize: bool = False
    """Divide by the std (plus eps) of the rollouts that gave the baseline (stratum or group)."""


@register("outcome_conditioned", formula="a_i = (r_i - mean_{j in S(i)} r_j) [/ (std_S r + "
          "eps)], S(i) the group members with i's label when at least min_stratum, else the "
          "group", source="Blockwise Advantage Estimation (Outcome-Conditioned Baseline)",
          params=OutcomeConditionedParams, inputs=("label",))
def outcome_conditioned(batch: AdvantageBatch, params: OutcomeConditionedParams, pins: Pins
                        ) -> Advantages:
    """The baseline of a later block is the mean reward of the group members that share the
    rollout's intermediate outcome (``label``, derived from the prefix), which approximates
    the value of the intermediate state without nested rollouts. A stratum with fewer than
    ``min_stratum`` included rollouts falls back to the group mean. A baseline set of fewer
    than two included rollouts, or of equal rewards, gives exactly 0. Rollout-level when
    ``block`` is unset, else applied only to the tokens of the segments labelled ``block``."""
    if len(batch.rollouts) != batch.size:
        raise ValueError("outcome_conditioned needs the request rollouts on the batch")
    labels: dict[str | None, int] = {}
    label = torch.tensor([labels.setdefault(r.label, len(labels)) for r in batch.rollouts],
                         dtype=torch.int64)
    strata, stratum = set_stats(batch.masked_rewards, batch.group * len(labels) + label,
                                batch.valid, pins.std_ddof)
    group = group_stats(batch, ddof=pins.std_ddof)
    g = batch.group
    own = strata.count[stratum] >= params.min_stratum

    def pick(a: Tensor, b: Tensor) -> Tensor:
        return torch.where(own, a[stratum], b[g])

    count, mean = pick(strata.count, group.count), pick(strata.mean, group.mean)
    adv = batch.rewards - mean
    if params.normalize:
        eps = params.eps if params.eps is not None else pins.eps
        std = torch.nan_to_num(pick(strata.std, group.std), nan=0.0)
        adv = adv / (std + eps)
    keep = batch.valid & (count >= 2) & ~pick(strata.zero_spread, group.zero_spread)
    adv = torch.where(keep, adv, torch.zeros_like(adv)) + 0.0
    report = {"stratum_baselines": int((own & batch.valid).sum()),
              "group_fallbacks": int((~own & batch.valid).sum())}
    if params.block is None:
        return Advantages(rollout=adv, report=report)
    lacking = next((i for i, r in enumerate(batch.rollouts) if r.segments is None), None)
    if lacking is not None:  # an input that only this parameter makes necessary
        gi = int(batch.group[lacking])
        ri = lacking - int((batch.group < gi).sum())
        raise invalid(("body", "groups", gi, "rollouts", ri, "segments"),
                      f"estimator 'outcome_conditioned' with block {params.block!r} needs "
                      "segments on every rollout")
    segs = spans_of(batch, "segments")
    block = segs.where(torch.tensor([s.label == params.block for s in segs.items],
                                    dtype=torch.bool))
    out, _ = spread_to_tokens(batch, block, adv[block.rollout])
    return Advantages(token=out + 0.0, report=report)


# ---- turn ----------------------------------------------------------------------------------

class TurnParams(GrpoParams):
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount of later turns' rewards in the return from turn j."""
    base: Base = "grpo"
    """How returns at one turn index are made relative across the group: grpo
    (G - mean) / (std + eps), or dr_grpo G - mean."""


@register("turn", formula="G_ij = sum_{k>=j} gamma^(k-j) r_ik; A on turn j's tokens = "
          "(G_ij - mean_i' G_i'j) / (std_i' G_i'j + eps) over the group's rollouts with a turn j",
          source="MR-Search (turn-level relative advantage for multi-turn agents)",
          params=TurnParams, inputs=("turns",))
def turn(batch: AdvantageBatch, params: TurnParams, pins: Pins) -> Advantages:
    """Turn-level credit for multi-turn rollouts: the discounted return from turn j (turn
    rewards; a missing one counts 0; the rollout's outcome reward is not used) is compared
    with the returns of the group's other included rollouts at the same turn index j (turns
    ordered by start), and applied to turn j's tokens. Fewer than two rollouts with a turn j
    give it 0. Tokens outside every turn get 0."""
    turns = spans_of(batch, "turns")
    rewards = torch.tensor([t.reward if t.reward is not None else 0.0 for t in turns.items],
                           dtype=torch.float64)
    returns = discounted_suffix_sum(rewards, turns.remaining, params.gamma)
    width = int(turns.index.max()) + 1 if turns.size else 1
    keys = batch.group[turns.rollout] * width + turns.index
    per_turn = relative(returns, keys, batch.valid[turns.rollout], pins, params.base,
                        params.eps)
    out, _ = spread_to_tokens(batch, turns, per_turn)
    return Advantages(token=out + 0.0)
