"""The vocabulary of pairwise judging: a verdict, a recorded comparison, two orders merged.

Shared by the tournament (who meets whom) and the ratings (what the games say); the five
verdict labels are the Arena-Hard / MT-Bench scale a pairwise judge answers on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

SLIGHT = 0.75
"""The game result of a slight preference (``A>B``) for Bradley-Terry and Elo: halfway between
a tie (0.5) and a win (``A>>B``, 1). Each verdict is one game with that fractional result.
Arena-Hard instead counts ``>>`` as three won games; scoring the same comparisons both ways
on the simulated judge of ``tests/benchmarks/bench_arena.py`` (N = 16, 400 groups), the
graded result ranked better with every design tried: Swiss 7 rounds 0.906 vs 0.897
Spearman, round robin 0.946 vs 0.936."""

class Verdict(enum.Enum):
    """A pairwise judge's answer on the five-step Arena-Hard scale; ``A`` is the first shown."""

    A_MUCH_BETTER = "A>>B"
    A_BETTER = "A>B"
    TIE = "A=B"
    B_BETTER = "B>A"
    B_MUCH_BETTER = "B>>A"

    @classmethod
    def parse(cls, label: str) -> Verdict:
        """The verdict of a label, whitespace ignored. Accepted: the five values, and the same
        relations written the other way round (``B<A``, ``B<<A``, ``B=A``, ``A<B``, ``A<<B``).
        Anything else is a ValueError: a label is never guessed."""
        try:
            return _LABELS["".join(label.split())]
        except KeyError:
            raise ValueError(f"not a pairwise verdict label: {label!r}") from None

    @property
    def margin(self) -> int:
        """+2 (``A>>B``) ... -2 (``B>>A``): the preference for A, with its strength."""
        return _MARGINS[self]

    @property
    def outcome(self) -> float:
        """A's plain result: 1 for a preference, 0.5 for a tie, 0 against, whatever strength."""
        return 0.5 + 0.5 * (self.margin > 0) - 0.5 * (self.margin < 0)

    @property
    def score(self) -> float:
        """A's graded result: 1, :data:`SLIGHT`, 0.5, 1 - :data:`SLIGHT`, 0."""
        return {2: 1.0, 1: SLIGHT, 0: 0.5, -1: 1.0 - SLIGHT, -2: 0.0}[self.margin]

    def flipped(self) -> Verdict:
        """The same judgement with the two answers' places exchanged (``A>B`` -> ``B>A``)."""
        return _BY_MARGIN[-self.margin]


_MARGINS = {Verdict.A_MUCH_BETTER: 2, Verdict.A_BETTER: 1, Verdict.TIE: 0,
            Verdict.B_BETTER: -1, Verdict.B_MUCH_BETTER: -2}
_BY_MARGIN = {margin: verdict for verdict, margin in _MARGINS.items()}
_LABELS = {**{v.value: v for v in Verdict}, "B<A": Verdict.A_BETTER,
           "B<<A": Verdict.A_MUCH_BETTER, "B=A": Verdict.TIE, "A<B": Verdict.B_BETTER,
           "A<<B": Verdict.B_MUCH_BETTER}

JudgeRound = Callable[[list[tuple[int, int]]], Sequence[Verdict | None]]
"""Judges a whole round: one verdict per ordered pair, in order; None where the judge failed."""


@dataclass(frozen=True, slots=True)
class Match:
    """One recorded comparison of rollout ``a`` with rollout ``b``; the verdict is seen from
    ``a`` (A is ``a``). ``orders`` is 2 for a swapped comparison: asked as (a, b) and (b, a)."""

    a: int
    b: int
    verdict: Verdict | None
    """None: the judge failed in every order asked; the comparison is missing."""
    round: int
    orders: int = 1
    consistent: bool | None = None
    """For a swapped comparison answered in both orders: whether both preferred the same
    rollout (or both said tie). None when there was only one answer."""

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "round": self.round, "orders": self.orders,
                "verdict": self.verdict.value if self.verdict else None,
                "consistent": self.consistent}


def merge_orders(first: Verdict | None,
                 second: Verdict | None) -> tuple[Verdict | None, bool | None]:
    """One verdict from asking (a, b) -> ``first`` and (b, a) -> ``second``, seen from ``a``.

    Both orders preferring the same rollout (or both a tie): consistent, the weaker of the two
    strengths is kept. Otherwise (opposite preferences, or a tie against a preference): the
    verdict depended on the position, and counts as a tie. A failed order leaves the other.
    """
    if second is not None:
        second = second.flipped()
    if first is None or second is None:
        return (first if first is not None else second), None
    if np.sign(first.margin) == np.sign(second.margin):
        return min(first, second, key=lambda v: abs(v.margin)), True
    return Verdict.TIE, False
