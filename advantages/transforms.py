"""Reward transforms: rewrite rewards before the estimator sees them.

A transform is ``fn(batch, params, pins) -> AdvantageBatch``; it returns
``batch.with_rewards(...)`` and leaves everything else as it was. Transforms act on the scalar
reward (the weighted sum of components) or on the per-token rewards; the component table is
left alone, so a multi-reward aggregate that reads components (gdpo and its kin) does not see
``rank`` or ``overlong``.

Process rewards (``prm_clip``, ``prm_delta``) come from ``rollout.steps[].reward`` and leave
through ``token_rewards``: the contract with the token-level estimators (reinforce_pp) is

    token_rewards'[t] = token_rewards[t] (0 where none were sent)
                        + sum of the transformed rewards of the steps whose last token is t

and ``rewards`` stays as it was. Steps without a reward carry no process reward and are
skipped (a delta is taken between consecutive rewarded steps).

``rubric_dropout`` is not a transform entry. Dropping rubric criteria only means something
before the judge folds the satisfied criteria into a score; by the time rewards reach this
stage they are a scalar or named components, which are not criteria in general, so no
rewrite of them would be rubric dropout. The judge calls
:func:`rewardd.verifiers.dropout.rubric_keep_mask` instead (not imported here: the advantage
library needs nothing of the verifiers): the seeded,
group-shared choice of criteria, stdlib only, where the judge can import it without torch;
evaluation requests pass ``p=0``.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch
from rewardd.advantages.profiles import Pins
from rewardd.advantages.registry import EstimatorParams, register

# ---- ranks within groups (shared with gagar in reweight.py) --------------------------------


def group_ranks(group: Tensor, values: Tensor, include: Tensor, num_groups: int
                ) -> tuple[Tensor, Tensor, Tensor]:
    """Ascending 0-based ranks of ``values`` within each group, over the ``include``d entries.

    Returns ``(min_rank, mean_rank, count)``: ``min_rank`` [R] int64, tied values share the
    lowest rank of their tie (competition ranking: the number of strictly smaller values);
    ``mean_rank`` [R] float64, ties averaged; ``count`` [G] int64 included entries per group.
    Entries not included get rank 0. One stable sort by (group, value), no Python loop.
    """
    r = values.numel()
    count = torch.zeros(num_groups, dtype=torch.int64).index_add_(
        0, group, include.to(torch.int64))
    if r == 0:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.float64), count
    bucket = torch.where(include, group, torch.full_like(group, num_groups))
    order = torch.argsort(values, stable=True)
    order = order[torch.argsort(bucket[order], stable=True)]
    sorted_bucket, sorted_values = bucket[order], values[order]
    size = torch.bincount(bucket, minlength=num_groups + 1)
    position = torch.arange(r) - (torch.cumsum(size, 0) - size)[sorted_bucket]
    starts = torch.ones(r, dtype=torch.bool)
    starts[1:] = ((sorted_bucket[1:] != sorted_bucket[:-1])
                  | (sorted_values[1:] != sorted_values[:-1]))
    tie = torch.cumsum(starts.to(torch.int64), 0) - 1
    first = position[starts][tie]
    length = torch.bincount(tie)[tie]
    min_rank = torch.zeros(r, dtype=torch.int64)
    min_rank[order] = first
    mean_rank = torch.zeros(r, dtype=torch.float64)
    mean_rank[order] = first.to(torch.float64) + (length - 1).to(torch.float64) / 2.0
    zero = torch.zeros_like(min_rank)
    return (torch.where(include, min_rank, zero),
            torch.where(include, mean_rank, torch.zeros_like(mean_rank)), count)


# ---- rank (RLRR) --------------------------------------------------------------------------


@register("rank", kind="transform",
          formula="r'_i = (rank_g(r_i) - 1) / (n_g - 1), ties averaged; n_g = 1 -> 0.5",
          source="RLRR (Reinforcement Learning with Relative Rewards)")
def rank(batch: AdvantageBatch, params: EstimatorParams, pins: Pins) -> AdvantageBatch:
    """Replace each reward by its rank within the group, scaled to [0, 1]: the lowest reward
    gets 0, the highest 1, tied rewards the average of their ranks. Only included rollouts
    are ranked (excluded ones get 0 and stay excluded). A group with one included rollout
    has no order: it gets 0.5, the middle of the scale, which is also what an all-tied group
    gets, so a lone rollout carries no ranking signal."""
    _, mean_rank, count = group_ranks(batch.group, batch.rewards, batch.valid, batch.num_groups)
    n = count[batch.group].to(torch.float64)
    scaled = torch.where(n > 1, mean_rank / (n - 1).clamp(min=1.0),
                         torch.full_like(mean_rank, 0.5))
    return batch.with_rewards(torch.where(batch.valid, scaled, torch.zeros_like(scaled)) + 0.0)


# ---- overlong (DAPO) ----------------------------------------------------------------------


class OverlongParams(EstimatorParams):
    max_length: int = Field(20480, gt=0)
    """L_max: the generation limit in tokens; at or past it the penalty is -factor (DAPO
    used 20480)."""
    buffer: int = Field(4096, gt=0)
    """L_cache: the soft zone before L_max over which the penalty grows linearly from 0 to
    -factor (DAPO used 4096); at most max_length."""
    factor: float = Field(1.0, ge=0.0, le=1e6)
    """Penalty at or past max_length."""

    @model_validator(mode="after")
    def _buffer_fits(self) -> OverlongParams:
        if self.buffer > self.max_length:
            raise ValueError(f"buffer {self.buffer} is larger than max_length {self.max_length}")
        return self


@register("overlong", kind="transform", params=OverlongParams,
          formula="r'_i = r_i + factor * clip(-(L_i - (L_max - buf)) / buf, -1, 0)",
          source="DAPO (soft overlong punishment); verl DAPORewardManager overlong_buffer")
def overlong(batch: AdvantageBatch, params: OverlongParams, pins: Pins) -> AdvantageBatch:
    """Soft overlong punishment: no penalty up to L_max - buf tokens, then a penalty growing
    linearly to -factor at L_max, and -factor beyond (DAPO's rule; verl's
    min(-exceed/buf * factor, 0) never sees L > L_max, so the clip only matters when a
    trainer sends longer responses). L is num_tokens, every response token (tool tokens
    with mask 0 included), as DAPO counts the response length. Excluded rollouts stay as
    they were."""
    length = batch.num_tokens.to(torch.float64)
    exceed = length - float(params.max_length - params.buffer)
    penalty = torch.clamp(-exceed / float(params.buffer), min=-1.0, max=0.0) * params.factor
    rewards = torch.where(batch.valid, batch.rewards + penalty, batch.rewards)
    return batch.with_rewards(rewards + 0.0)


# ---- process rewards: prm_clip, prm_delta --------------------------------------------------


def _rewarded_steps(batch: AdvantageBatch) -> tuple[Tensor, Tensor, Tensor]:
    """Every rewarded step in token order: (rollout [S], flat index of its last token [S],
    reward [S]). Steps are pydantic objects, so reading them is a loop over rollouts."""
    owner: list[int] = []
    last: list[int] = []
    reward: list[float] = []
    for i, rollout in enumerate(batch.rollouts):
        for step in rollout.steps or ():
            if step.reward is not None:
                owner.append(i)
                last.append(step.end - 1)
                reward.append(step.reward)
    owner_t = torch.tensor(owner, dtype=torch.int64)
    last_t = batch.offsets[owner_t] + torch.tensor(last, dtype=torch.int64)
    order = torch.argsort(last_t)  # steps do not overlap: token order is step order
    return owner_t[order], last_t[order], torch.tensor(reward, dtype=torch.float64)[order]


def _with_step_rewards(batch: AdvantageBatch, last: Tensor, step_rewards: Tensor
                       ) -> AdvantageBatch:
    base = (batch.token_rewards.clone() if batch.token_rewards is not None
            else torch.zeros(batch.total_tokens, dtype=torch.float64))
    token_rewards = base.index_add_(0, last, step_rewards) + 0.0
    return batch.with_rewards(batch.rewards, token_rewards=token_rewards)


class PrmClipParams(EstimatorParams):
    eta: float = Field(0.0, ge=-1e6, le=1e6)
    """Clip threshold: step rewards become min(r - eta, 0), so no step earns more than 0."""


@register("prm_clip", kind="transform", params=PrmClipParams, inputs=("steps",),
          formula="r'_s = min(r_s - eta, 0), written to token_rewards at each step's last token",
          source="Clipping (On Designing Effective RL Reward at Training Time for LLM "
                 "Reasoning, Gao et al. 2024)")
def prm_clip(batch: AdvantageBatch, params: PrmClipParams, pins: Pins) -> AdvantageBatch:
    """Process rewards clipped to at most 0, so the accumulated process reward of a
    trajectory is bounded above and repeating steps cannot earn reward. The clipped step
    reward is added to token_rewards at the step's last token (see the module docstring for
    the contract); scalar rewards are unchanged."""
    _, last, reward = _rewarded_steps(batch)
    clipped = torch.clamp(reward - params.eta, max=0.0)
    return _with_step_rewards(batch, last, clipped)


@register("prm_delta", kind="transform", inputs=("steps",),
          formula="r'_s = r_s - r_{s+1}; the last step keeps r_T",
          source="Delta (On Designing Effective RL Reward at Training Time for LLM "
                 "Reasoning, Gao et al. 2024)")
def prm_delta(batch: AdvantageBatch, params: EstimatorParams, pins: Pins) -> AdvantageBatch:
    """Each step's reward minus the next rewarded step's reward of the same rollout; the
    last keeps its own. The return from any step telescopes to r_s, so the accumulated
    process reward stays bounded however many steps a trajectory takes. Written to
    token_rewards at each step's last token (module docstring); scalar rewards unchanged."""
    owner, last, reward = _rewarded_steps(batch)
    delta = reward.clone()
    same = owner[1:] == owner[:-1]
    delta[:-1] = torch.where(same, reward[:-1] - reward[1:], reward[:-1])
    return _with_step_rewards(batch, last, delta)
