"""Per-token advantages in the three wire formats: dense, run-length (rle) and scalar.

Everything is computed on one flat token tensor for the whole batch, then split per rollout,
so the cost is O(total tokens) in vectorised torch and O(rollouts) in Python.

Exactness: the rle of a rollout decodes to its dense array bit for bit. Runs are cut where
the float64 bit pattern changes (compared as int64), and masked tokens are +0.0 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """Where each rollout's tokens lie in the flat token tensor, and the response mask."""

    num_tokens: Tensor  # int64 [R]
    mask: Tensor | None  # bool [sum num_tokens], None when no rollout sent a mask

    @property
    def total(self) -> int:
        return int(self.num_tokens.sum())


def broadcast(rollout_adv: Tensor, layout: TokenLayout) -> Tensor:
    """A_{i,t} = a_i * m_{i,t}, with masked tokens exactly +0.0."""
    dense = torch.repeat_interleave(rollout_adv, layout.num_tokens)
    if layout.mask is not None:
        dense = torch.where(layout.mask, dense, torch.zeros_like(dense))
    return dense


def encode_dense(dense: Tensor, layout: TokenLayout) -> list[np.ndarray]:
    """One float64 array per rollout (views into one buffer; serialised without copies)."""
    array = dense.numpy()
    cuts = np.cumsum(layout.num_tokens.numpy())[:-1]
    return np.split(array, cuts)


def encode_rle(dense: Tensor, layout: TokenLayout) -> list[dict[str, list[list[Any]]]]:
    """``{"rle": [[value, length], ...]}`` per rollout, runs of bit-identical values."""
    n = dense.numel()
    rollouts = layout.num_tokens.numel()
    if n == 0:
        return [{"rle": []} for _ in range(rollouts)]
    bits = dense.view(torch.int64)
    starts_of_rollouts = torch.cumsum(layout.num_tokens, 0) - layout.num_tokens
    boundary = torch.ones(n, dtype=torch.bool)
    boundary[1:] = bits[1:] != bits[:-1]
    nonempty = layout.num_tokens > 0
    boundary[starts_of_rollouts[nonempty]] = True
    run_starts = boundary.nonzero().squeeze(1)
    run_lengths = torch.diff(run_starts, append=torch.tensor([n]))
    run_values = dense[run_starts]
    run_owner = torch.repeat_interleave(torch.arange(rollouts), layout.num_tokens)[run_starts]
    runs_per_rollout = torch.bincount(run_owner, minlength=rollouts).tolist()
    values, lengths = run_values.tolist(), run_lengths.tolist()
    out, k = [], 0
    for count in runs_per_rollout:
        out.append({"rle": [[values[j], lengths[j]] for j in range(k, k + count)]})
        k += count
    return out


def encode_rle_constant(rollout_adv: Tensor, layout: TokenLayout) -> list[dict[str, Any]]:
    """Fast path without a mask: each rollout is one run [[a_i, T_i]] (or none if T_i is 0)."""
    return [{"rle": [[a, t]] if t else []}
            for a, t in zip(rollout_adv.tolist(), layout.num_tokens.tolist())]


def decode_rle(rle: list[list[Any]] | list[tuple[float, int]]) -> list[float]:
    """Expand run-length spans back to the dense list (the client-side inverse)."""
    out: list[float] = []
    for value, length in rle:
        out.extend([float(value)] * int(length))
    return out


def encode(rollout_adv: Tensor, layout: TokenLayout | None, output: str) -> list[Any] | None:
    """Advantages of every rollout in the requested format; None for ``output='none'``."""
    if output == "none":
        return None
    if output == "scalar":
        return rollout_adv.tolist()
    assert layout is not None, "dense and rle need num_tokens (checked at validation)"
    if output == "rle" and layout.mask is None:
        return encode_rle_constant(rollout_adv, layout)
    dense = broadcast(rollout_adv, layout)
    if output == "dense":
        return encode_dense(dense, layout)
    return encode_rle(dense, layout)
