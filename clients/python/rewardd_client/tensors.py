"""A response's per-token advantages as one padded (B, T) tensor and mask, for the policy loss.

    from rewardd_client.tensors import advantages_tensor, rewards_list
    adv, mask = advantages_tensor(response, backend="torch", dtype=torch.float32)
    loss = -(ratio * adv * mask).sum() / mask.sum()

Reads every output format the server writes (``advantage.output``):

* ``rle``: ``{"rle": [[value, length], ...]}``, runs of bit-identical float64 values;
* ``dense``: one float per token;
* ``scalar``: one float per rollout, spread over its ``num_tokens`` tokens.

Layout: rows follow the response (groups in order, then their rollouts) or the
``rollout_ids`` given; each row holds its rollout's tokens from column 0 (right padding) and
zeros after. ``T`` is the longest ``num_tokens``, or ``max_len`` when given: a longer rollout
is then cut to its first ``max_len`` tokens, a shorter one padded. ``mask[b, t]`` is True
where column ``t`` holds a token of rollout ``b`` (it is not the request's tool-token mask:
the server already made advantages exactly 0 there). Excluded rollouts are rows of zeros
with their tokens still in the mask, as the server sends them.

Exactness: values are decoded in float64 (what the server computes and JSON and msgpack
carry bit for bit), so rle and dense give bit-identical arrays; ``dtype`` then casts once,
with that cast's usual rounding.

numpy and torch are optional imports: asking for a backend that is not installed raises an
ImportError saying what to install. Arrays are built in numpy when it is installed (torch
then shares its memory): one repeat expands every run of the batch, one slice copy fills
each row, so Python touches each rollout, not each token; 512 rollouts of 1,000 tokens take
a few milliseconds (tests/benchmarks/bench_client.py).
"""

from __future__ import annotations

import importlib
from itertools import chain
from typing import Any, Iterable, Literal, Sequence

Backend = Literal["numpy", "torch"]
_BACKENDS = ("numpy", "torch")  # each also the name of the package extra


def _module(backend: str) -> Any:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be 'numpy' or 'torch', not {backend!r}")
    try:
        return importlib.import_module(backend)
    except ImportError as exc:
        raise ImportError(f"rewardd_client.tensors with backend={backend!r} needs {backend}: "
                          f"pip install 'rewardd-client[{backend}]'") from exc


def rollouts(response: dict[str, Any], rollout_ids: Sequence[str] | None = None
             ) -> list[dict[str, Any]]:
    """The response's rollout results in response order (groups, then rollouts), or in the
    order of ``rollout_ids`` (each must be in the response)."""
    flat = [r for group in response["groups"] for r in group["rollouts"]]
    if rollout_ids is None:
        return flat
    by_id = {r["rollout_id"]: r for r in flat}
    missing = [i for i in rollout_ids if i not in by_id]
    if missing:
        raise KeyError(f"rollout_ids not in the response: {missing[:5]}"
                       f"{' ...' if len(missing) > 5 else ''}")
    return [by_id[i] for i in rollout_ids]


def rewards_list(response: dict[str, Any], rollout_ids: Sequence[str] | None = None,
                 component: str | None = None) -> list[float | None]:
    """Each rollout's reward (or one ``component``'s value), None where the rollout was
    excluded or the component failed; in response order or that of ``rollout_ids``."""
    if component is None:
        return [r["reward"] for r in rollouts(response, rollout_ids)]
    return [r["rewards"].get(component) for r in rollouts(response, rollout_ids)]


def _runs(item: dict[str, Any], field: str
          ) -> tuple[Sequence[float], Sequence[int] | None, int]:
    """(values, run lengths or None for one value per token, tokens) of one rollout's
    ``field``, checked against ``num_tokens``."""
    encoded = item.get(field)
    rid, num_tokens = item.get("rollout_id"), item.get("num_tokens")
    if encoded is None:
        raise ValueError(f"rollout {rid!r} has no {field}: ask with advantage.output 'rle', "
                         f"'dense' or 'scalar' (not 'none')")
    if isinstance(encoded, dict):
        pairs = encoded["rle"]
        values = [v for v, _ in pairs]
        lengths = [int(n) for _, n in pairs]
        size = sum(lengths)
    elif isinstance(encoded, list):
        values, lengths, size = encoded, None, len(encoded)
    else:  # scalar
        if num_tokens is None:
            raise ValueError(f"rollout {rid!r} has a scalar {field} and no num_tokens: send "
                             f"num_tokens (or token_ids) with each rollout")
        values, lengths, size = [float(encoded)], [int(num_tokens)], int(num_tokens)
    if num_tokens is not None and size != num_tokens:
        raise ValueError(f"rollout {rid!r}: {field} cover {size} tokens, num_tokens is "
                         f"{num_tokens}")
    return values, lengths, size


def advantages_tensor(response: dict[str, Any], backend: Backend = "numpy", dtype: Any = None,
                      *, max_len: int | None = None, rollout_ids: Sequence[str] | None = None,
                      field: str = "advantages") -> tuple[Any, Any]:
    """``(values, mask)``, both (B, T): the response's per-token ``field`` (``advantages``, or
    ``returns`` for estimators that define them) padded on the right with zeros, and a bool
    mask of the real tokens. ``dtype`` defaults to float64 (the backend's dtype object or
    its name, e.g. ``torch.float32`` or ``"float32"``). See the module docstring for
    ``max_len`` and ``rollout_ids``."""
    target = _module(backend)
    rows = [_runs(item, field) for item in rollouts(response, rollout_ids)]
    sizes = [size for _, _, size in rows]
    width = max(sizes, default=0) if max_len is None else max_len
    if width < 0:
        raise ValueError(f"max_len must be >= 0, not {max_len}")
    xp = _builder(backend)
    flat = xp.values(chain.from_iterable(values for values, _, _ in rows),
                     sum(len(values) for values, _, _ in rows))
    if any(lengths is not None for _, lengths, _ in rows):  # runs to expand
        counts = chain.from_iterable(lengths if lengths is not None else [1] * len(values)
                                     for values, lengths, _ in rows)
        flat = xp.repeat(flat, xp.counts(list(counts)))
    out = xp.zeros(len(rows), width)
    start = 0
    for row, size in enumerate(sizes):
        kept = min(size, width)
        out[row, :kept] = flat[start:start + kept]
        start += size
    mask = xp.arange(width)[None, :] < xp.counts(sizes)[:, None]
    if xp.name != backend:  # built in numpy for torch: share the memory
        out, mask = target.from_numpy(out), target.from_numpy(mask)
    return _cast(out, target, backend, dtype), mask


class _Numpy:
    """Array building in numpy: several times faster than torch at turning Python lists
    into arrays and at small slice copies, so torch results are built here when numpy is
    installed, then shared with torch without a copy."""

    name = "numpy"

    def __init__(self) -> None:
        import numpy

        self.np = numpy
        self.arange, self.repeat = numpy.arange, numpy.repeat

    def values(self, items: Iterable[float], count: int) -> Any:
        return self.np.fromiter(items, dtype=self.np.float64, count=count)

    def counts(self, items: list[int]) -> Any:
        return self.np.asarray(items, dtype=self.np.int64)

    def zeros(self, rows: int, width: int) -> Any:
        return self.np.zeros((rows, width), dtype=self.np.float64)


class _Torch:
    """The same in torch alone, for an environment without numpy."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.arange, self.repeat = torch.arange, torch.repeat_interleave

    def values(self, items: Iterable[float], count: int) -> Any:
        return self.torch.tensor(list(items), dtype=self.torch.float64)

    def counts(self, items: list[int]) -> Any:
        return self.torch.tensor(items, dtype=self.torch.int64)

    def zeros(self, rows: int, width: int) -> Any:
        return self.torch.zeros((rows, width), dtype=self.torch.float64)


def _builder(backend: str) -> _Numpy | _Torch:
    try:
        return _Numpy()
    except ImportError:
        if backend == "numpy":
            raise
        return _Torch()


def _cast(out: Any, xp: Any, backend: str, dtype: Any) -> Any:
    if dtype is None:
        return out
    if isinstance(dtype, str):
        dtype = getattr(xp, dtype)
    return out.to(dtype) if backend == "torch" else out.astype(dtype)
