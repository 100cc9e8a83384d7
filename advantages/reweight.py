"""Reweighting: rescale advantages after the estimator, per group or per rollout.

A reweight is ``fn(batch, advantages, params, pins) -> Advantages``. Most multiply by a
per-rollout factor (``Advantages.scaled``), which keeps the level (rollout or token) and
keeps excluded rollouts at 0; ``modulate`` multiplies per token and returns token-level
advantages. Every factor here is positive, so no reweight flips the sign of an advantage.

"Correct" means an included rollout with reward >= ``threshold``, the reward being the one
the estimator saw (after any transforms). Where a rule needs a rollout's total advantage
(uniqueness, gagar), it is a_i for rollout-level advantages and the sum over the rollout's
mask-1 tokens for token-level ones, so the preserved sums hold at either level.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.groups import group_sum
from rewardd.advantages.profiles import Pins
from rewardd.advantages.errors import RequestInvalid, error
from rewardd.advantages.registry import EstimatorParams, register
from rewardd.advantages.transforms import group_ranks


class ThresholdParams(EstimatorParams):
    threshold: float = Field(0.5, ge=-1e6, le=1e6)
    """A rollout is correct (passing) when its reward is at least this."""


def _correct(batch: AdvantageBatch, threshold: float) -> Tensor:
    return batch.valid & (batch.rewards >= threshold)


def _group_accuracy(batch: AdvantageBatch, correct: Tensor) -> tuple[Tensor, Tensor]:
    """float64 [G] fraction of correct included rollouts, and bool [G] groups with any."""
    count = group_sum(batch, torch.ones_like(batch.rewards))
    hits = group_sum(batch, correct.to(torch.float64))
    return hits / count.clamp(min=1.0), count > 0


def _rollout_total(advantages: Advantages, batch: AdvantageBatch, magnitude: bool) -> Tensor:
    """float64 [R]: a_i (or |a_i|) per rollout; the sum over mask-1 tokens when token-level."""
    if advantages.rollout is not None:
        return advantages.rollout.abs() if magnitude else advantages.rollout
    per_token = advantages.per_token(batch)
    if magnitude:
        per_token = per_token.abs()
    return torch.zeros(batch.size, dtype=torch.float64).index_add_(
        0, batch.token_rollout, per_token)


def _restore_group_sum(batch: AdvantageBatch, members: Tensor, totals: Tensor,
                       weights: Tensor) -> Tensor:
    """Per-rollout factor: ``weights`` on ``members``, rescaled per group so that
    sum(totals * factor) over the members equals sum(totals); 1 elsewhere. A group whose
    weighted sum is 0, or of the other sign, keeps factor 1 (no rescale could help)."""
    before = group_sum(batch, torch.where(members, totals, torch.zeros_like(totals)))
    after = group_sum(batch, torch.where(members, totals * weights, torch.zeros_like(totals)))
    ratio = before / torch.where(after != 0, after, torch.ones_like(after))
    usable = (after != 0) & (ratio > 0)
    scale = torch.where(usable, ratio, torch.ones_like(ratio))[batch.group]
    keep = usable[batch.group] & members
    return torch.where(keep, weights * scale, torch.ones_like(weights))


def _codes(labels: list[str]) -> Tensor:
    """int64 [R]: each label's index in the sorted distinct labels (code-point order)."""
    index = {label: k for k, label in enumerate(sorted(set(labels)))}
    return torch.tensor([index[label] for label in labels], dtype=torch.int64)


# ---- difficulty (accuracy-aware) ----------------------------------------------------------


class DifficultyParams(ThresholdParams):
    alpha: float = Field(1.0, ge=0.0, le=2.0)
    """Strength: f(d) = 1 + alpha (d - 0.5) runs from 1 - alpha/2 (all correct) to
    1 + alpha/2 (none correct); at most 2 so the factor never turns negative."""


@register("difficulty", kind="reweight", params=DifficultyParams,
          formula="A_i' = A_i (1 + alpha (d_g - 0.5)), "
                  "d_g = 1 - mean_{i in g} [r_i >= threshold]",
          source="accuracy-aware difficulty weighting (docs/estimators.md)")
def difficulty(batch: AdvantageBatch, advantages: Advantages, params: DifficultyParams,
               pins: Pins) -> Advantages:
    """Scale each group's advantages by a linear function of its difficulty d = 1 - accuracy
    (accuracy over included rollouts): a group at 50% keeps its advantages, harder groups
    are amplified and easier ones damped, symmetrically. Linear rather than a power of d so
    that alpha = 0 is the identity and no group is silenced. A group with no included
    rollout keeps factor 1 (its advantages are 0 anyway)."""
    accuracy, seen = _group_accuracy(batch, _correct(batch, params.threshold))
    factor = 1.0 + params.alpha * ((1.0 - accuracy) - 0.5)
    factor = torch.where(seen, factor, torch.ones_like(factor))
    return advantages.scaled(factor[batch.group], batch)


# ---- ha_dw (History-Aware Adaptive Difficulty Weighting) ----------------------------------


class HaDwParams(ThresholdParams):
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    """EMA momentum of the anchor: anchor' = momentum * anchor + (1 - momentum) * accuracy."""
    beta: float = Field(1.0, ge=0.0, le=20.0)
    """Weight sharpness: w_g = exp(beta (anchor - acc_g)), between exp(-beta) and exp(beta)."""


HA_DW_KEY = "ha_dw"


@register("ha_dw", kind="reweight", params=HaDwParams, stateful=True,
          formula="w_g = exp(beta (anchor - acc_g)); anchor <- momentum anchor + "
                  "(1 - momentum) acc_batch",
          source="HA-DW (History-Aware Adaptive Difficulty Weighting)")
def ha_dw(batch: AdvantageBatch, advantages: Advantages, params: HaDwParams,
          pins: Pins) -> Advantages:
    """Correct the group-relative estimator's difficulty bias against a per-run anchor: a
    group whose accuracy is below the anchor (harder than the run's recent batches) is
    weighted up, an easier one down, w_g = exp(beta (anchor - acc_g)). The anchor is an EMA
    of batch accuracy (correct included rollouts over included rollouts) kept in the run
    state under "ha_dw" as {"anchor", "batches"}. Weights use the anchor from before this
    batch; the first batch of a run initialises the anchor to its own accuracy. A batch
    with no included rollout leaves the anchor alone. Reports anchor_before, anchor_after,
    batch_accuracy and batches."""
    if batch.run is None:  # validation demands a run_id; this is a caller without a store
        raise RuntimeError("ha_dw keeps per-run state: pass a RunStore with the request "
                           "(pipeline.advantages(req, runs))")
    correct = _correct(batch, params.threshold)
    accuracy, seen = _group_accuracy(batch, correct)
    state = batch.run.get(HA_DW_KEY)
    included = int(batch.valid.sum())
    batches = int(state["batches"]) if state else 0
    if included == 0:
        anchor = state["anchor"] if state else None
        return replace(advantages, report={"anchor_before": anchor, "anchor_after": anchor,
                                           "batch_accuracy": None, "batches": batches})
    batch_accuracy = float(correct.sum()) / included
    before = float(state["anchor"]) if state else batch_accuracy
    after = (params.momentum * before + (1.0 - params.momentum) * batch_accuracy
             if state else batch_accuracy)
    weight = torch.exp(params.beta * (before - accuracy))
    weight = torch.where(seen, weight, torch.ones_like(weight))
    batch.run.put(HA_DW_KEY, {"anchor": after, "batches": batches + 1})
    out = advantages.scaled(weight[batch.group], batch)
    out.report = {"anchor_before": before, "anchor_after": after,
                  "batch_accuracy": batch_accuracy, "batches": batches + 1}
    return out


# ---- uniqueness ---------------------------------------------------------------------------


class UniquenessParams(ThresholdParams):
    alpha: float = Field(0.5, ge=0.0, le=10.0)
    """Exponent of the inverse cluster size: 0 leaves advantages alone, 1 divides by it."""


@register("uniqueness", kind="reweight", params=UniquenessParams, inputs=("cluster",),
          formula="A_i' = A_i (1/m_i)^alpha * s_g for correct i; s_g keeps sum_correct |A| "
                  "of the group",
          source="Uniqueness-Aware Reinforcement Learning")
def uniqueness(batch: AdvantageBatch, advantages: Advantages, params: UniquenessParams,
               pins: Pins) -> Advantages:
    """Reward rare strategies: a correct rollout's advantage is scaled by (1/m)^alpha, m the
    number of the group's correct included rollouts in its strategy cluster. The group's
    correct advantages are then rescaled by one factor so that the sum of their |A| is what
    it was: credit moves from crowded clusters to rare ones without changing how much the
    correct rollouts get in total. Incorrect and excluded rollouts are untouched."""
    correct = _correct(batch, params.threshold)
    cluster = _codes([r.cluster for r in batch.rollouts])
    _, cell = torch.unique(batch.group * (int(cluster.max()) + 1) + cluster, return_inverse=True)
    size = torch.zeros(int(cell.max()) + 1, dtype=torch.float64).index_add_(
        0, cell, correct.to(torch.float64))[cell]
    weight = torch.where(correct, size.clamp(min=1.0).pow(-params.alpha),
                         torch.ones_like(size))
    totals = _rollout_total(advantages, batch, magnitude=True)
    return advantages.scaled(_restore_group_sum(batch, correct, totals, weight), batch)


# ---- gagar (quality-aware redistribution) -------------------------------------------------


class GagarParams(ThresholdParams):
    decay: float = Field(0.8, gt=0.0, le=1.0)
    """Weight of quality rank k among the passing rollouts: decay^k (rank 0 is the best)."""


@register("gagar", kind="reweight", params=GagarParams, inputs=("quality",),
          formula="w_i = decay^rank_i over passing i of a mixed group; A_i' = A_i w_i "
                  "sum_pass A / sum_pass A w",
          source="GAGAR (quality-aware credit redistribution for code agent RL)")
def gagar(batch: AdvantageBatch, advantages: Advantages, params: GagarParams,
          pins: Pins) -> Advantages:
    """In a mixed group (at least one passing and one failing included rollout), rank the
    passing rollouts by quality, best first (tied qualities share the better rank), weight
    rank k by decay^k, and rescale the passing advantages so their sum is what it was: the
    credit of passing shifts toward higher quality. Failing rollouts and groups that are
    not mixed are untouched; so is a group whose weighted sum is 0 or flips sign."""
    passing = _correct(batch, params.threshold)
    failing = batch.valid & ~passing
    mixed = ((group_sum(batch, passing.to(torch.float64)) > 0)
             & (group_sum(batch, failing.to(torch.float64)) > 0))[batch.group]
    members = passing & mixed
    quality = torch.tensor([r.quality for r in batch.rollouts], dtype=torch.float64)
    rank_of, _, _ = group_ranks(batch.group, -quality, members, batch.num_groups)
    weight = torch.where(members, params.decay ** rank_of.to(torch.float64),
                         torch.ones_like(quality))
    totals = _rollout_total(advantages, batch, magnitude=False)
    return advantages.scaled(_restore_group_sum(batch, members, totals, weight), batch)


# ---- glpo (vote-guided) -------------------------------------------------------------------


class GlpoParams(EstimatorParams):
    gamma: float = Field(1.0, ge=0.0, le=1e3)
    """Gain on the vote margin: A_i' = A_i (1 + gamma |r_i - v_g|)."""


@register("glpo", kind="reweight", params=GlpoParams, inputs=("answer",),
          formula="A_i' = A_i (1 + gamma |r_i - v_g|), v_g = mean reward of the rollouts "
                  "giving the group's majority answer",
          source="GLPO (Group-Level Relative Policy Optimization, VAA-CSEC)")
def glpo(batch: AdvantageBatch, advantages: Advantages, params: GlpoParams,
         pins: Pins) -> Advantages:
    """Reallocate advantages by the margin between each rollout's reward and the group's
    vote-aggregated reward v_g, the mean reward of the rollouts that give the majority
    answer (the answer self-consistency decoding would return). Our reading of the GLPO
    abstract: |A| grows by gamma |r_i - v_g|, so rollouts that disagree with what the vote
    would score (a right minority answer, a wrong one against a right majority) get more
    credit, those the vote already accounts for keep theirs, and no sign flips. The majority
    is the most frequent answer among included rollouts; ties go to the smallest answer in
    code-point order. Excluded rollouts do not vote."""
    answer = _codes([r.answer for r in batch.rollouts])
    span = int(answer.max()) + 1
    cell, inverse = torch.unique(batch.group * span + answer, return_inverse=True)
    votes = torch.zeros(cell.numel(), dtype=torch.int64).index_add_(
        0, inverse, batch.valid.to(torch.int64))
    cell_group, cell_answer = cell // span, cell % span
    # the most votes first, then the smallest answer: one amax over an encoded score
    score = torch.where(votes > 0, votes * span + (span - 1 - cell_answer), -1)
    best = torch.full((batch.num_groups,), -1, dtype=torch.int64).scatter_reduce(
        0, cell_group, score, "amax")
    majority = span - 1 - best % span
    voters = batch.valid & (answer == majority[batch.group])
    count = group_sum(batch, voters.to(torch.float64))
    vote_reward = group_sum(batch, torch.where(voters, batch.rewards,
                                               torch.zeros_like(batch.rewards)))
    vote_reward = vote_reward / count.clamp(min=1.0)
    margin = (batch.rewards - vote_reward[batch.group]).abs()
    factor = torch.where(batch.valid, 1.0 + params.gamma * margin, torch.ones_like(margin))
    return advantages.scaled(factor, batch)


# ---- modulate (hindsight / teacher signals) -----------------------------------------------


class ModulateParams(EstimatorParams):
    beta: float = Field(0.5, ge=0.0, lt=1.0)
    """Modulation depth: |A| is scaled by 1 + beta tanh(z), within (1 - beta, 1 + beta);
    below 1 so the factor stays positive and no sign flips."""
    source: Literal["token", "turn"] = "token"
    """Where h comes from: "token" reads rollout.signal (one value per token), "turn" reads
    turns[j].signal (one value per turn, applied to the turn's tokens)."""


def _signal_input_errors(batch: AdvantageBatch, source: str) -> list[dict[str, Any]]:
    """The 422 validation cannot give: the entry's input depends on its ``source`` param."""

    for gi, group in enumerate(batch.groups):
        for ri, rollout in enumerate(group.rollouts):
            loc: tuple[str | int, ...] = ("body", "groups", gi, "rollouts", ri)
            if source == "token" and rollout.signal is None:
                return [error(loc + ("signal",), "reweight 'modulate' needs signal on every "
                              "rollout (source 'token')", "missing")]
            if source == "turn":
                if rollout.turns is None:
                    return [error(loc + ("turns",), "reweight 'modulate' needs turns on every "
                                  "rollout (source 'turn')", "missing")]
                for j, turn in enumerate(rollout.turns):
                    if turn.signal is None:
                        return [error(loc + ("turns", j, "signal"), "reweight 'modulate' "
                                      "needs signal on every turn (source 'turn')", "missing")]
    return []


def _zscore(values: Tensor, group: Tensor, use: Tensor, num_groups: int) -> Tensor:
    """(h - mean_g) / std_g over the ``use``d entries of each group (population std); 0 where
    a group's values are all equal (decided exactly by min == max) and where not used."""
    weight = use.to(torch.float64)
    h = torch.where(use, values, torch.zeros_like(values))
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, weight)
    mean = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, h)
    mean = mean / count.clamp(min=1.0)
    centred = torch.where(use, values - mean[group], torch.zeros_like(values))
    var = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, centred * centred)
    std = (var / count.clamp(min=1.0)).sqrt()
    inf = torch.full((num_groups,), float("inf"), dtype=torch.float64)
    lo = inf.scatter_reduce(0, group[use], values[use], "amin")
    hi = (-inf).scatter_reduce(0, group[use], values[use], "amax")
    # a spread so small that its variance underflows (values a few ulps apart) has std 0:
    # counted as constant (z = 0), never 0/0
    spread = (lo < hi)[group] & use & (std[group] > 0)
    return torch.where(spread, centred / torch.where(spread, std[group], 1.0),
                       torch.zeros_like(values))


def _token_z(batch: AdvantageBatch) -> Tensor:
    signal = torch.tensor(list(chain.from_iterable(r.signal for r in batch.rollouts)),
                          dtype=torch.float64)
    use = batch.token_mask & batch.valid[batch.token_rollout]
    return _zscore(signal, batch.group[batch.token_rollout], use, batch.num_groups)


def _turn_z(batch: AdvantageBatch) -> Tensor:
    owner, start, end, signal = [], [], [], []
    for i, rollout in enumerate(batch.rollouts):  # turns are pydantic objects
        for turn in rollout.turns:
            owner.append(i)
            start.append(turn.start)
            end.append(turn.end)
            signal.append(turn.signal)
    owner_t = torch.tensor(owner, dtype=torch.int64)
    h = torch.tensor(signal, dtype=torch.float64)
    z = _zscore(h, batch.group[owner_t], batch.valid[owner_t], batch.num_groups)
    # each token's turn by an integer cumsum of +id at the start and -id at the end (exact)
    marks = torch.zeros(batch.total_tokens + 1, dtype=torch.int64)
    ids = torch.arange(1, owner_t.numel() + 1)
    base = batch.offsets[owner_t]
    marks.index_add_(0, base + torch.tensor(start, dtype=torch.int64), ids)
    marks.index_add_(0, base + torch.tensor(end, dtype=torch.int64), -ids)
    turn_of = torch.cumsum(marks, 0)[:-1]
    inside = turn_of > 0
    padded = torch.cat([torch.zeros(1, dtype=torch.float64), z])
    return torch.where(inside, padded[turn_of], torch.zeros_like(padded[turn_of]))


@register("modulate", kind="reweight", params=ModulateParams, inputs=(),
          formula="A_{i,t}' = A_{i,t} (1 + beta tanh(z_{i,t})), z = h z-scored over the "
                  "group's siblings",
          source="TurnSight (turn-level hindsight self-distillation); hindsight/teacher "
                 "modulation")
def modulate(batch: AdvantageBatch, advantages: Advantages, params: ModulateParams,
             pins: Pins) -> Advantages:
    """Modulate advantages by an external signal h (hindsight or teacher) while keeping their
    direction. Needs rollout.signal (source "token") or turns with a signal on every turn
    (source "turn"); a missing one is a 422 naming the field. h is z-scored across sibling
    rollouts: over the mask-1 tokens of the group's included rollouts (token) or over their
    turns, one value per turn (turn), with the population std; a group whose h is constant
    gets z = 0. Each token's |A| is scaled by 1 + beta tanh(z) in (1 - beta, 1 + beta), a
    positive factor, so the sign never flips. Tokens outside every turn keep their A.
    Returns token-level advantages."""
    errors = _signal_input_errors(batch, params.source)
    if errors:
        raise RequestInvalid(errors)
    z = _token_z(batch) if params.source == "token" else _turn_z(batch)
    base = (advantages.token if advantages.token is not None
            else torch.repeat_interleave(advantages.rollout, batch.num_tokens))
    factor = 1.0 + params.beta * torch.tanh(z)
    return replace(advantages, rollout=None, token=base * factor + 0.0)
