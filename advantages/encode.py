"""Per-token advantages in the wire formats: dense, run-length (rle) and scalar.

Everything is computed on one flat token tensor for the whole batch, then split per rollout,
so the cost is O(total tokens) in vectorised torch and O(rollouts) in Python.

Exactness: the rle of a rollout decodes to its dense array bit for bit. Runs are cut where
the float64 bit pattern changes (compared as int64), and masked tokens are +0.0 exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages


class NotConstant(ValueError):
    """``scalar`` output was asked of advantages that vary over a rollout's masked tokens."""


def encode_dense(dense: Tensor, num_tokens: Tensor) -> list[np.ndarray]:
    """One float64 array per rollout (views into one buffer; serialised without copies)."""
    return np.split(dense.numpy(), np.cumsum(num_tokens.numpy())[:-1])


def encode_rle(dense: Tensor, num_tokens: Tensor) -> list[dict[str, list[list[Any]]]]:
    """``{"rle": [[value, length], ...]}`` per rollout, runs of bit-identical values."""
    n = dense.numel()
    rollouts = num_tokens.numel()
    if n == 0:
        return [{"rle": []} for _ in range(rollouts)]
    bits = dense.view(torch.int64)
    starts_of_rollouts = torch.cumsum(num_tokens, 0) - num_tokens
    boundary = torch.ones(n, dtype=torch.bool)
    boundary[1:] = bits[1:] != bits[:-1]
    boundary[starts_of_rollouts[num_tokens > 0]] = True
    run_starts = boundary.nonzero().squeeze(1)
    run_lengths = torch.diff(run_starts, append=torch.tensor([n]))
    run_values = dense[run_starts]
    run_owner = torch.repeat_interleave(torch.arange(rollouts), num_tokens)[run_starts]
    runs_per_rollout = torch.bincount(run_owner, minlength=rollouts).tolist()
    values, lengths = run_values.tolist(), run_lengths.tolist()
    out, k = [], 0
    for count in runs_per_rollout:
        out.append({"rle": [[values[j], lengths[j]] for j in range(k, k + count)]})
        k += count
    return out


def encode_rle_constant(per_rollout: Tensor, num_tokens: Tensor) -> list[dict[str, Any]]:
    """Fast path without a mask: each rollout is one run [[a_i, T_i]] (or none if T_i is 0)."""
    return [{"rle": [[a, t]] if t else []}
            for a, t in zip(per_rollout.tolist(), num_tokens.tolist())]


def decode_rle(rle: list[list[Any]] | list[tuple[float, int]]) -> list[float]:
    """Expand run-length spans back to the dense list (the client-side inverse)."""
    out: list[float] = []
    for value, length in rle:
        out.extend([float(value)] * int(length))
    return out


def scalar_per_rollout(dense: Tensor, batch: AdvantageBatch) -> Tensor:
    """The one value of each rollout's masked tokens (0 with none); NotConstant otherwise."""
    mask = batch.token_mask
    owner = batch.token_rollout[mask]
    values = dense[mask]
    inf = torch.full((batch.size,), float("inf"), dtype=torch.float64)
    lo = inf.scatter_reduce(0, owner, values, "amin")
    hi = (-inf).scatter_reduce(0, owner, values, "amax")
    varying = (lo != hi) & torch.isfinite(lo)
    if bool(varying.any()):
        first = int(varying.nonzero()[0])
        raise NotConstant(f"advantages vary over the tokens of rollout {first}; "
                          "use output 'rle' or 'dense'")
    return torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo)) + 0.0


def encode_tokens(dense: Tensor, batch: AdvantageBatch, output: str) -> list[Any] | None:
    """A per-token tensor (mask applied) in the requested format."""
    if output == "none":
        return None
    if output == "scalar":
        return scalar_per_rollout(dense, batch).tolist()
    if output == "dense":
        return encode_dense(dense, batch.num_tokens)
    return encode_rle(dense, batch.num_tokens)


def encode(advantages: Advantages, batch: AdvantageBatch, output: str) -> list[Any] | None:
    """Advantages of every rollout in the requested format; None for ``output='none'``."""
    if output == "none":
        return None
    if advantages.rollout is not None:
        if output == "scalar":
            return advantages.rollout.tolist()
        if output == "rle" and batch.mask is None:
            return encode_rle_constant(advantages.rollout, batch.num_tokens)
    return encode_tokens(advantages.per_token(batch), batch, output)
