"""Step-level credit for agents: steps of a group that start from the same state are compared.

GiGPO groups steps by an identical anchor-state key; BiPACE's grouping (BiGPO) replaces key
equality by cosine similarity of state embeddings, which leaves fewer singleton step groups.
Both share the rest: discounted step returns, a step-group mean as baseline, and the
episode-level GRPO advantage underneath.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.outcome import GrpoParams, building_block, grpo
from rewardd.advantages.profiles import Pins
from rewardd.advantages.errors import invalid
from rewardd.advantages.registry import register
from rewardd.advantages.routing import (Spans, discounted_suffix_sum, relative, spans_of,
                                        spread_to_tokens)


class GigpoParams(GrpoParams):
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount of later steps' rewards in a step's return."""
    omega: float = Field(1.0, ge=0.0)
    """Weight of the step term: A = A_episode + omega * A_step."""
    step_norm: Literal["mean", "mean_std"] = "mean"
    """Step term: ``mean`` R - mean of the step group (docs/estimators.md); ``mean_std`` also
    divides by the step group's std + eps (GiGPO's std-normalised variant)."""
    outcome_at_last_step: bool = True
    """Add the rollout's (outcome) reward to its last step's reward, as GiGPO's sparse
    episode reward arrives at the final step; step rewards (missing: 0) count as sent. Turn
    off when the step rewards already include the outcome."""


def step_credit(batch: AdvantageBatch, steps: Spans, keys: Tensor, params: GigpoParams,
                pins: Pins) -> Advantages:
    """A = A_episode + omega * A_step on each step's tokens, A_episode elsewhere; ``keys``
    [S] names each step's step group (equal keys: one group)."""
    episode = grpo(batch, GrpoParams(eps=params.eps), building_block(pins))
    rewards = torch.tensor([s.reward if s.reward is not None else 0.0 for s in steps.items],
                           dtype=torch.float64)
    if params.outcome_at_last_step and steps.size:
        last = steps.remaining == 0
        rewards = rewards + torch.where(last, batch.masked_rewards[steps.rollout],
                                        torch.zeros_like(rewards))
    returns = discounted_suffix_sum(rewards, steps.remaining, params.gamma)
    included = batch.valid[steps.rollout]
    base = "dr_grpo" if params.step_norm == "mean" else "grpo"
    step = relative(returns, keys, included, pins, base, params.eps)
    step_term, _ = spread_to_tokens(batch, steps, params.omega * step)
    return Advantages(token=episode[batch.token_rollout] + step_term + 0.0,
                      report=_step_groups_report(keys[included]))


def _step_groups_report(keys: Tensor) -> dict[str, float | int]:
    """How many step groups have two or more included steps, and the share of included
    steps left alone in theirs (those get no step-level signal)."""
    if keys.numel() == 0:
        return {"step_groups": 0, "singleton_rate": 0.0}
    _, counts = torch.unique(keys, return_counts=True)
    return {"step_groups": int((counts >= 2).sum()),
            "singleton_rate": float((counts == 1).sum()) / keys.numel()}


@register("gigpo", formula="A_{i,t} = A_episode_i + omega * (R_s - mean_{s' ~ s} R_s') on the "
          "tokens of step s; s' ~ s: the group's steps with the same anchor-state key",
          source="GiGPO (Group-in-Group Policy Optimization, anchor-state step groups)",
          params=GigpoParams, inputs=("steps",))
def gigpo(batch: AdvantageBatch, params: GigpoParams, pins: Pins) -> Advantages:
    """Two levels of group-relative credit. A_episode is GRPO of the rollout rewards
    (profile rules). Steps of the group's included rollouts with an identical anchor-state
    ``key`` form a step group; a step's discounted return R_s = sum_{k>=s} gamma^(k-s) r_k
    over its rollout's later steps is compared with its step group's mean. A step group of
    one (or a step without a key) gets step term 0. Tokens outside every step get
    A_episode. Reports the number of step groups and the singleton rate."""
    steps = spans_of(batch, "steps")
    group = batch.group[steps.rollout].tolist()
    ids: dict[tuple[int, str], int] = {}
    keys = [ids.setdefault((g, s.key), len(ids)) if s.key is not None else -1 - k
            for k, (g, s) in enumerate(zip(group, steps.items))]
    return step_credit(batch, steps, torch.tensor(keys, dtype=torch.int64), params, pins)


class BipaceParams(GigpoParams):
    threshold: float = Field(0.9, ge=-1.0, le=1.0)
    """Cosine similarity above which a step joins a cluster leader's step group."""


def leader_clusters(embeddings: Tensor, group: Tensor, include: Tensor, threshold: float
                    ) -> Tensor:
    """int64 [S]: a cluster id per step. Within each group, steps in order (rollout order,
    then step order) join the first earlier leader whose cosine similarity is above
    ``threshold``, else become a leader; every member is thus similar to its leader (no
    chaining). Steps not included are singletons. Vectorised across groups, one round per
    step slot: O(S_g^2 d) per group."""
    s = group.numel()
    if s == 0:
        return torch.zeros(0, dtype=torch.int64)
    unit = torch.nn.functional.normalize(embeddings, dim=1)
    order = torch.argsort(group, stable=True)
    g = group[order]
    counts = torch.bincount(g)
    slot = torch.arange(s) - (torch.cumsum(counts, 0) - counts)[g]
    width = int(counts.max())
    padded = torch.zeros(int(g.max()) + 1, width, unit.shape[1], dtype=torch.float64)
    padded[g, slot] = unit[order]
    present = torch.zeros(padded.shape[:2], dtype=torch.bool)
    present[g, slot] = include[order]
    leader = torch.zeros_like(present)
    cluster = torch.arange(width).repeat(padded.shape[0], 1)
    for k in range(width):  # leaders depend on earlier assignments: sequential per slot
        similar = torch.bmm(padded, padded[:, k, :, None]).squeeze(2) > threshold
        candidates = leader & similar
        joined = candidates.any(1)
        cluster[:, k] = torch.where(joined, candidates.to(torch.int8).argmax(1), k)
        leader[:, k] = present[:, k] & ~joined
    ids = torch.empty(s, dtype=torch.int64)
    ids[order] = torch.where(present[g, slot], g * width + cluster[g, slot], -1 - order)
    return ids


@register("bipace", formula="gigpo with step groups = leader clusters of cos(e_s, e_leader) > "
          "threshold within the group",
          source="BiPACE (BiGPO: steps clustered by cosine similarity of hidden states)",
          params=BipaceParams, inputs=("steps", "embeddings"))
def bipace(batch: AdvantageBatch, params: BipaceParams, pins: Pins) -> Advantages:
    """gigpo with step groups formed by state similarity instead of key equality: steps of a
    group whose embeddings have cosine similarity above ``threshold`` with a cluster leader
    share its step group (greedy leader clustering, see ``leader_clusters``), which lowers
    the singleton rate left by exact keys. Only BiPACE's grouping side; its action-conditioned
    peer baselines (PACE) are not part of this entry. All step embeddings of the batch must
    have one dimension."""
    steps = spans_of(batch, "steps")
    dims = {len(s.embedding) for s in steps.items if s.embedding is not None}
    if len(dims) > 1:
        raise invalid(("body", "groups"), "estimator 'bipace' needs step embeddings of one "
                      f"dimension; got dimensions {sorted(dims)}")
    dim = dims.pop() if dims else 1
    rows = [s.embedding if s.embedding is not None else [0.0] * dim for s in steps.items]
    embeddings = torch.tensor(rows, dtype=torch.float64).reshape(steps.size, dim)
    has = torch.tensor([s.embedding is not None for s in steps.items], dtype=torch.bool)
    keys = leader_clusters(embeddings, batch.group[steps.rollout],
                           batch.valid[steps.rollout] & has, params.threshold)
    return step_credit(batch, steps, keys, params, pins)
