"""What every advantage step reads and returns: flat tensors over the whole batch.

Rollouts of all groups lie in one flat batch of R rows; ``group`` maps each rollout to its
group. Tokens of all rollouts lie in one flat tensor of N = sum(num_tokens) entries,
rollout i's at ``offsets[i]:offsets[i] + num_tokens[i]``. Working on the flat layout with
index tensors (scatter-adds, cumulative sums) keeps every step O(R + N) with no Python loop
over tokens.

Structured, optional inputs (segments, turns, steps, labels) stay as the validated request
rollouts in ``rollouts``; an entry that needs them builds its own index tensors from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:
    from rewardd.advantages.models import Group, Rollout


class RunState(Protocol):
    """One run's persistent state as stateful entries see it (ha_dw anchors, UCB counts): the
    service passes its run store's scope; writes are kept only once the response is complete."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, value: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class AdvantageBatch:
    """Rewards and inputs of a flat batch of rollouts.

    ``valid`` is False for rollouts excluded from their group's baseline (a failed cell with no
    fallback); every entry gives them advantage 0 and leaves them out of every statistic.
    """

    rewards: Tensor  # float64 [R] weighted sum of components; ignored where not valid
    group: Tensor  # int64 [R], 0..num_groups-1
    valid: Tensor  # bool [R]
    num_tokens: Tensor  # int64 [R]
    num_groups: int
    components: Tensor | None = None  # float64 [R, K] component rewards (0 where failed)
    component_valid: Tensor | None = None  # bool [R, K]
    component_names: tuple[str, ...] = ()
    weights: Tensor | None = None  # float64 [K]
    mask: Tensor | None = None  # bool [N]; None means every token counts
    token_rewards: Tensor | None = None  # float64 [N]
    values: Tensor | None = None  # float64 [N]
    kl: Tensor | None = None  # float64 [N] per-token KL terms
    token_ids: Tensor | None = None  # int64 [N]
    rollouts: Sequence[Rollout] = ()
    groups: Sequence[Group] = ()
    run: RunState | None = None

    # ---- derived layout ---------------------------------------------------------------

    @property
    def size(self) -> int:
        return int(self.rewards.numel())

    @cached_property
    def total_tokens(self) -> int:
        return int(self.num_tokens.sum())

    @cached_property
    def uniform_length(self) -> int | None:
        """The common length when every rollout has the same num_tokens, else None."""
        if self.size and bool((self.num_tokens == self.num_tokens[0]).all()):
            return int(self.num_tokens[0])
        return None

    @cached_property
    def offsets(self) -> Tensor:
        """int64 [R]: index of each rollout's first token in the flat token tensor."""
        return torch.cumsum(self.num_tokens, 0) - self.num_tokens

    @cached_property
    def token_rollout(self) -> Tensor:
        """int64 [N]: the rollout each token belongs to."""
        return torch.repeat_interleave(torch.arange(self.size), self.num_tokens)

    @cached_property
    def token_position(self) -> Tensor:
        """int64 [N]: each token's index inside its rollout."""
        return torch.arange(self.total_tokens) - self.offsets[self.token_rollout]

    @cached_property
    def token_mask(self) -> Tensor:
        """bool [N]: the response mask, all True where none was sent."""
        if self.mask is not None:
            return self.mask
        return torch.ones(self.total_tokens, dtype=torch.bool)

    @cached_property
    def mask_counts(self) -> Tensor:
        """int64 [R]: mask-1 tokens of each rollout (num_tokens where no mask was sent)."""
        if self.mask is None:
            return self.num_tokens
        return torch.zeros(self.size, dtype=torch.int64).index_add_(
            0, self.token_rollout, self.mask.to(torch.int64))

    @property
    def masked_rewards(self) -> Tensor:
        return torch.where(self.valid, self.rewards, torch.zeros_like(self.rewards))

    def with_rewards(self, rewards: Tensor, **changes: Any) -> AdvantageBatch:
        """A copy with new scalar rewards (reward transforms return this)."""
        return replace(self, rewards=rewards, **changes)


@dataclass
class Advantages:
    """An estimator's result: per-rollout (outcome estimators) or per-token advantages.

    The mask is applied afterwards by :func:`dense`; entries never need to apply it.
    """

    rollout: Tensor | None = None  # float64 [R], constant over each rollout's tokens
    token: Tensor | None = None  # float64 [N]
    returns: Tensor | None = None  # float64 [N], where the estimator defines returns
    components: dict[str, Tensor] = field(default_factory=dict)  # name -> [R] advantages
    report: dict[str, Any] = field(default_factory=dict)  # entry-specific, JSON-ready

    def __post_init__(self) -> None:
        if (self.rollout is None) == (self.token is None):
            raise ValueError("Advantages needs exactly one of rollout or token")

    @property
    def is_token_level(self) -> bool:
        return self.token is not None

    def per_token(self, batch: AdvantageBatch) -> Tensor:
        """float64 [N]: advantages on every token, the mask applied (masked tokens +0.0).

        One pass over the tokens when there is no mask (the broadcast), two with one; this
        is the hot path of dense and masked rle output, so no temporary of size N is made.
        Per-token results come back as they are when there is no mask (entries return +0.0
        for zeros): treat the result as read-only.
        """
        if self.token is not None:
            if batch.mask is None:
                return self.token
            values = self.token.clone()
        elif batch.uniform_length is not None:  # half the cost of a ragged broadcast
            values = (self.rollout + 0.0).repeat_interleave(batch.uniform_length)
        else:
            values = torch.repeat_interleave(self.rollout + 0.0, batch.num_tokens,
                                             output_size=batch.total_tokens)
        if batch.mask is not None:
            values.masked_fill_(~batch.mask, 0.0)
        return values

    def scaled(self, factor: Tensor, batch: AdvantageBatch) -> Advantages:
        """Multiply by a per-rollout factor [R] (reweighting), keeping the level; +0.0 for 0."""
        if self.rollout is not None:
            return replace(self, rollout=self.rollout * factor + 0.0)
        return replace(self, token=self.token * factor[batch.token_rollout] + 0.0)
