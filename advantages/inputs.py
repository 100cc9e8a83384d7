"""Build the flat advantage batch from validated rollout groups and their reward table."""

from __future__ import annotations

from typing import Sequence

import torch

from rewardd.advantages.batch import AdvantageBatch, RunState
from rewardd.advantages.checks import resolved_num_tokens
from rewardd.advantages.table import Column, Combined, FlatBatch, component_matrix


def _per_token(flat: FlatBatch, field: str, num_tokens: list[int], fill: float,
               dtype: torch.dtype) -> torch.Tensor | None:
    """Concatenate a per-token field over the batch; None when no rollout sent it."""
    if not any(getattr(r, field) is not None for r in flat.rollouts):
        return None
    values: list[float] = []
    for rollout, n in zip(flat.rollouts, num_tokens):
        sent = getattr(rollout, field)
        values.extend(sent if sent is not None else [fill] * n)
    return torch.tensor(values, dtype=dtype)


def build_batch(flat: FlatBatch, combined: Combined, columns: Sequence[Column],
                run: RunState | None = None) -> AdvantageBatch:
    num_tokens = [resolved_num_tokens(r) or 0 for r in flat.rollouts]
    values, present = component_matrix(columns)
    k = len(columns)
    mask = _per_token(flat, "mask", num_tokens, 1, torch.bool)
    return AdvantageBatch(
        rewards=torch.tensor([r if r is not None else 0.0 for r in combined.reward],
                             dtype=torch.float64),
        group=torch.tensor(flat.group_of, dtype=torch.int64),
        valid=torch.tensor([r is not None for r in combined.reward], dtype=torch.bool),
        num_tokens=torch.tensor(num_tokens, dtype=torch.int64),
        num_groups=len(flat.groups),
        components=torch.tensor(values, dtype=torch.float64).reshape(len(flat.rollouts), k),
        component_valid=torch.tensor(present, dtype=torch.bool).reshape(len(flat.rollouts), k),
        component_names=tuple(c.name for c in columns),
        weights=torch.tensor([c.weight for c in columns], dtype=torch.float64),
        mask=mask,
        token_rewards=_per_token(flat, "token_rewards", num_tokens, 0.0, torch.float64),
        values=_per_token(flat, "values", num_tokens, 0.0, torch.float64),
        kl=_per_token(flat, "kl", num_tokens, 0.0, torch.float64),
        token_ids=_per_token(flat, "token_ids", num_tokens, -1, torch.int64),
        rollouts=flat.rollouts, groups=flat.groups, run=run)
