"""Prefix-tree credit (TEMPO): the group's responses as one prefix tree of token ids.

Prefix-to-Tree turns a group's responses into a tree whose nodes are shared prefixes; the
value of a node is the mean outcome of the responses below it. Where responses diverge, the
difference between child and parent values is token-level credit that needs no critic.

Only shared prefixes matter: a response alone below a node can never branch again. The
tree is walked one depth at a time across every group at once, and each response leaves the
walk where it stops sharing its prefix, so the work is O(total tokens) (at most; in practice
the summed depth of shared prefixes) and the Python loop runs once per depth of the deepest
shared prefix.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.groups import group_stats
from rewardd.advantages.outcome import GrpoParams, building_block, grpo
from rewardd.advantages.profiles import Pins
from rewardd.advantages.registry import register


def _dense_ids(values: Tensor) -> Tensor:
    return torch.unique(values, return_inverse=True)[1]


def branch_differences(batch: AdvantageBatch, rollouts: Tensor, zero_spread: Tensor
                       ) -> tuple[Tensor, Tensor]:
    """(flat token index [B], V(child) - V(node) [B]) at every branching token of ``rollouts``.

    Walks the tree one depth at a time, vectorised across all groups: at depth t the
    (node, token t) pairs of the rollouts still sharing their node with another rollout get
    dense child ids (``torch.unique``), whose counts and reward sums give V. A rollout alone
    in its node can never branch again and leaves the walk, so the total work is the sum of
    the rollouts' shared depths, at most the number of tokens; the loop runs once per depth
    of the deepest shared prefix."""
    rewards = batch.rewards
    active = rollouts[batch.num_tokens[rollouts] > 0]
    node = batch.group[active]  # the root of each group: the prefix of length 0
    node_count = node_value = torch.zeros(0, dtype=torch.float64)
    found_tokens: list[Tensor] = []
    found_td: list[Tensor] = []
    depth = 0
    while active.numel():
        token = batch.token_ids[batch.offsets[active] + depth]
        child = _dense_ids(node * active.numel() + _dense_ids(token))
        count = torch.bincount(child).to(torch.float64)
        value = torch.bincount(child, weights=rewards[active]) / count
        child_count, child_value = count[child], value[child]
        if depth > 0:  # the root never branches: a_i already compares with V(root)
            branch = (child_count < node_count) & ~zero_spread[batch.group[active]]
            found_tokens.append(batch.offsets[active[branch]] + depth)
            found_td.append(child_value[branch] - node_value[branch])
        shared = (child_count >= 2) & (batch.num_tokens[active] > depth + 1)
        active, node = active[shared], child[shared]
        node_count, node_value = child_count[shared], child_value[shared]
        depth += 1
    if not found_tokens:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.float64)
    return torch.cat(found_tokens), torch.cat(found_td)


class TempoParams(GrpoParams):
    beta: float = Field(1.0, ge=0.0)
    """Weight of the tree's temporal-difference term."""


@register("tempo", formula="A_{i,t} = a_i(GRPO) + beta * [node_{i,t} branches] * "
          "(V(prefix_{i,t+1}) - V(prefix_{i,t})), V = mean outcome of the rollouts below",
          source="TEMPO (Tree-Estimated Mean Prefix Value, Prefix-to-Tree)",
          params=TempoParams, inputs=("token_ids",))
def tempo(batch: AdvantageBatch, params: TempoParams, pins: Pins) -> Advantages:
    """GRPO plus branch-gated temporal differences from the group's prefix tree.

    The node at token t of rollout i is its prefix of length t (tokens 0..t-1), the state
    before emitting token t. V(node) is the mean reward of the group's included rollouts
    that have this prefix (a rollout that ends at the node counts: it is below it). The node
    branches when the rollouts sharing it do not all continue with the same token (a rollout
    ending there is a continuation of its own); exactly then V(child) differs from V(node) in
    the set it averages, and the token gets beta * (V(prefix of length t+1) - V(node)). The
    root (length 0) never branches: a_i is already the root-level comparison, so groups
    without shared prefixes get exactly GRPO. Non-branching tokens get exactly a_i, and so do
    all tokens of a zero-spread group (0). The tree is built from token ids including masked
    (observation) tokens; excluded rollouts take no part in it and get 0. V is in reward
    units, a_i in GRPO's normalised units: beta sets their balance."""
    if batch.token_ids is None:
        raise ValueError("tempo needs token_ids")
    a = grpo(batch, GrpoParams(eps=params.eps), building_block(pins))
    out = a[batch.token_rollout]
    stats = group_stats(batch, ddof=pins.std_ddof)
    token, td = branch_differences(batch, batch.valid.nonzero().squeeze(1), stats.zero_spread)
    out[token] = out[token] + params.beta * td
    return Advantages(token=out + 0.0, report={"branch_tokens": int(token.numel())})
