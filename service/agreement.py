"""How two rewards of the same rollouts agree: Spearman's rank correlation and the mean gap.

Used by audit components (a batch's ``summary.audit``) and by the sentinel (per step, over
the run). Written here rather than taken from SciPy: ``scipy.stats.spearmanr`` is the one
function needed of a 40 MB dependency the service does not otherwise have, and the
definition is short: Pearson's correlation of the two samples' ranks, ties given their
average rank (as ``spearmanr`` and ``pandas.Series.corr(method="spearman")`` do; the unit
tests check it against hand-computed values and their invariances).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

def is_reward(value: Any) -> bool:
    """Whether an answer's reward field holds a finite number (not null, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


MIN_PAIRS = 3
"""Fewer pairs give no correlation (two points always correlate perfectly)."""


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties averaged (``[10, 20, 20, 30]`` -> ``[1, 2.5, 2.5, 4]``)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        average = (start + end) / 2 + 1
        for k in range(start, end + 1):
            out[order[k]] = average
        start = end + 1
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's correlation; None under :data:`MIN_PAIRS` pairs or when a side is constant."""
    n = len(xs)
    if n < MIN_PAIRS or n != len(ys):
        return None
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties: average ranks); None as :func:`pearson`."""
    if len(xs) < MIN_PAIRS:
        return None
    return pearson(ranks(xs), ranks(ys))


@dataclass(frozen=True, slots=True)
class Agreement:
    """Training reward against audit reward over the rollouts both scored."""

    compared: int
    agreement: float | None
    """Spearman's rank correlation."""
    mean_gap: float | None
    """Mean of training minus audit: positive when training rewards more than the audit."""
    training_mean: float | None
    audit_mean: float | None

    @classmethod
    def of(cls, pairs: Sequence[tuple[float, float]]) -> Agreement:
        """``pairs``: ``(training reward, audit reward)`` per rollout."""
        if not pairs:
            return cls(0, None, None, None, None)
        training = [t for t, _ in pairs]
        audit = [a for _, a in pairs]
        n = len(pairs)
        return cls(n, spearman(training, audit),
                   math.fsum(t - a for t, a in pairs) / n,
                   math.fsum(training) / n, math.fsum(audit) / n)


def combined(parts: Sequence[Agreement]) -> Agreement:
    """Several steps' agreements as one: their means and gap weighted by pairs compared
    (exactly the pooled ones), their rank correlations averaged with the same weights (a
    rank correlation does not pool; the mean of the steps' is what the sentinel compares)."""
    kept = [p for p in parts if p.compared]
    total = sum(p.compared for p in kept)
    if not total:
        return Agreement(0, None, None, None, None)
    ranked = [p for p in kept if p.agreement is not None]
    weight = sum(p.compared for p in ranked)

    def mean(read: Any) -> float:
        return math.fsum(read(p) * p.compared for p in kept) / total

    return Agreement(total,
                     math.fsum(p.agreement * p.compared for p in ranked) / weight  # type: ignore[operator]
                     if weight else None,
                     mean(lambda p: p.mean_gap), mean(lambda p: p.training_mean),
                     mean(lambda p: p.audit_mean))


__all__ = ["Agreement", "combined", "is_reward", "MIN_PAIRS", "pearson", "ranks", "spearman"]
