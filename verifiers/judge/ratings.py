"""Ratings from recorded comparisons: Bradley-Terry, win rate and Elo; and rank agreement.

Each function maps (players, matches, seed) to one score per player, higher is better; the
tournament (:mod:`rewardd.verifiers.judge.tournament`) fits the one its caller names.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from rewardd.verifiers.judge.games import Match, Verdict

BT_PRIOR = 1.0
"""Bradley-Terry regularisation: every rollout plays this many virtual games against an
average rollout (strength 0), half won and half lost. It keeps an undefeated
rollout finite and the fit unique when the comparison graph is not connected."""

ELO_K = 4.0
ELO_SHUFFLES = 16
"""Sequential Elo with Arena-Hard's K = 4 depends on the order of the games; the score is
the mean over this many seeded orders."""


Scoring = Callable[[int, Sequence[Match], int], np.ndarray]

SCORE_DIGITS = 9
"""Scores are compared for ranking at this many decimals: rollouts the data cannot tell
apart get fitted scores that differ only in their last bits, and must share a rank."""


def rank_key(score: float) -> float:
    """``score`` as it is compared for ranking (to :data:`SCORE_DIGITS` decimals)."""
    return round(float(score), SCORE_DIGITS)


def _decided(matches: Iterable[Match]) -> list[tuple[int, int, Verdict]]:
    return [(m.a, m.b, m.verdict) for m in matches if m.verdict is not None]


def bt_scores(players: int, matches: Sequence[Match], seed: int = 0,
              prior: float = BT_PRIOR) -> np.ndarray:
    """Bradley-Terry log-strengths, maximum a posteriori, by Newton's method.

    Model: P(i beats j) = 1 / (1 + exp(theta_j - theta_i)). Each verdict is one game that i
    wins by its graded :attr:`Verdict.score` (1, 0.75, 0.5 for a tie, ...) and j by the
    rest. Maximised:
    sum_ij wins_ij log P(i beats j) + prior * sum_i [log s(theta_i) + log s(-theta_i)] / 2,
    with s the logistic function: the prior term is :data:`BT_PRIOR` virtual games, half won,
    against a rollout of strength 0 (the centre of the scale). The objective is strictly
    concave (for prior > 0), so damped Newton steps converge to its one maximum in a few
    iterations. ``seed`` is unused.
    """
    wins = np.zeros((players, players))
    for a, b, verdict in _decided(matches):
        wins[a, b] += verdict.score
        wins[b, a] += 1.0 - verdict.score
    games = wins + wins.T
    theta = np.zeros(players)

    def objective(t: np.ndarray) -> float:
        diff = t[:, None] - t[None, :]
        return float(-(wins * np.logaddexp(0.0, -diff)).sum()
                     - prior * 0.5 * (np.logaddexp(0.0, -t) + np.logaddexp(0.0, t)).sum())

    current = objective(theta)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))
        s = 1.0 / (1.0 + np.exp(-theta))
        grad = (wins - games * p).sum(axis=1) + prior * (0.5 - s)
        curvature = games * p * (1.0 - p)
        hessian = curvature - np.diag(curvature.sum(axis=1) + prior * s * (1.0 - s))
        step = np.linalg.solve(hessian, -grad)
        scale = 1.0
        while True:  # halve the step until the objective does not fall (concave: terminates)
            candidate = theta + scale * step
            value = objective(candidate)
            if value >= current - 1e-12 or scale < 1e-6:
                break
            scale /= 2
        theta, current = candidate, value
        if np.abs(scale * step).max() < 1e-10:
            break
    return theta


def win_rate_scores(players: int, matches: Sequence[Match], seed: int = 0) -> np.ndarray:
    """(wins + ties / 2) / games, each comparison one game whatever its strength; 0.5 for a
    rollout without a decided game. ``seed`` is unused."""
    points, games = np.zeros(players), np.zeros(players)
    for a, b, verdict in _decided(matches):
        points[a] += verdict.outcome
        points[b] += 1.0 - verdict.outcome
        games[a] += 1
        games[b] += 1
    return np.divide(points, games, out=np.full(players, 0.5), where=games > 0)


def elo_scores(players: int, matches: Sequence[Match], seed: int = 0) -> np.ndarray:
    """Sequential Elo from 1000 with K = :data:`ELO_K` (Arena-Hard), each verdict one game
    with its graded :attr:`Verdict.score`, averaged over :data:`ELO_SHUFFLES` orders drawn
    from ``seed`` (Elo depends on the order the games are played in)."""
    games = _decided(matches)
    rng = np.random.default_rng(seed)
    total = np.zeros(players)
    for _ in range(ELO_SHUFFLES):
        rating = np.full(players, 1000.0)
        for k in rng.permutation(len(games)):
            a, b, verdict = games[k]
            expected = 1.0 / (1.0 + 10.0 ** ((rating[b] - rating[a]) / 400.0))
            delta = ELO_K * (verdict.score - expected)
            rating[a] += delta
            rating[b] -= delta
        total += rating
    return total / ELO_SHUFFLES


SCORINGS: dict[str, Scoring] = {"bt": bt_scores, "win_rate": win_rate_scores, "elo": elo_scores}


def average_ranks(values: Sequence[Any]) -> list[float]:
    """0-based ranks, ascending; equal values share the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2
        start = end + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation, ties by average ranks. 0.0 when either side is constant
    (a ranking that orders nothing agrees with nothing)."""
    if len(a) != len(b):
        raise ValueError(f"spearman of {len(a)} and {len(b)} values")
    ra, rb = np.array(average_ranks(a)), np.array(average_ranks(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denominator) if denominator > 0 else 0.0
