"""Benchmark: how well each arena tournament ranks a group, and how many judge calls it costs.

Simulated groups of N = 8 and 16 rollouts with known true quality q ~ Normal(0, 1), ranked
by every scheme of :mod:`rewardd.verifiers.judge.tournament` through a simulated judge; reported: the
mean number of judge calls and the mean Spearman correlation of the scores with q.

The judge model (fixed before the schemes were searched, and not moved after):
* Pairwise, (a, b) asked with a shown first: latent z = (q_a - q_b) / TAU + xi_ab + beta,
  xi_ab ~ Logistic(0, 1), so P(the judge prefers the first shown) = sigmoid((q_a - q_b) / TAU
  + beta). xi_ab = -xi_ba is drawn once per pair and shared by both orders: a temperature-0
  judge has one view of a pair, and the order only adds its position bias beta. (Independent
  noise per order could not give a 13% flip rate with any useful noise level: a judge that is
  wrong on a fifth of the pairs would then disagree with itself on about a third of swaps.)
  The same ordered pair asked twice gets the same answer (a cached reply).
* Verdict from z: |z| <= TIE_BAND a tie, z beyond +-STRONG a ``>>``, else ``>``.
* TAU = 0.5: decided verdicts order a random pair right 86% of the time, close to the 85%
  agreement of GPT-4 with human experts on non-tied MT-Bench votes (Zheng et al., 2023);
  round robin in both orders then ranks a group of 16 at 0.95, as in the issue's toy run.
  TIE_BAND and STRONG make about 12% of verdicts ties and 30% strong. beta is calibrated
  (bisection on simulated pairs) so that 12.9% of swapped comparisons are inconsistent (the
  two orders prefer different rollouts, or one prefers and the other says tie: what
  ``TournamentResult.inconsistent`` counts), the GPT-4 figure quoted in the arena issue;
  the rate measured through the tournaments is printed. ``--tau`` reruns the table for
  another judge (a sensitivity check: at 0.4, decided verdicts 89% right, the default
  reaches 0.935 at N = 16; at 0.75, 81% right, 0.838), ``--verdicts binary`` for a judge that
  only ever says ``A>B`` or ``B>A`` (with ``--tau 0.33``: 87% right, 13.0% flips, round robin
  in both orders 0.960, the default 0.918).
* Pointwise baseline: the judge scores each rollout alone on a 1-10 scale,
  clip(round(5.5 + 2 (q + e)), 1, 10), e ~ Normal(0, TAU pi / sqrt(6)): the difference of two
  such scores is as noisy as one pairwise verdict, before the rounding to 10 levels.
* The anchor (the caller's reference or greedy answer) has quality 0, an average rollout.

The ``ceiling`` and ``bound`` rows are not schemes: they score pairs by least squares on the
judge's hidden continuous preference, which no judge reveals. ``ceiling``: the default's
pairs, about the most any scoring of those comparisons could get; ``bound``: as many random
pairs (a random near-regular comparison graph) as the default's budget.

Run: `.venv/bin/python tests/benchmarks/bench_arena.py [--groups 400] [--seed 0] [--tau 0.5]
[--verdicts graded|binary]` (about 40 s on one core).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.verifiers.judge.games import Match, Verdict  # noqa: E402
from rewardd.verifiers.judge.ratings import spearman  # noqa: E402
from rewardd.verifiers.judge.tournament import (DEFAULT_SCHEME, default_options,  # noqa: E402
                                        run_tournament)

TAU = 0.5
TIE_BAND = 0.5
STRONG = 3.5
FLIP_TARGET = 0.129
SIZES = (8, 16)
TARGET_RHO = 0.92

# (label, scheme, options); "pointwise" is the one-call-per-rollout baseline, not a tournament.
# Budgets named by what they cost: "log2" ceil(log2 N) rounds (the Swiss default without a
# budget), "budget" (N - 1) // 2 rounds, "quarter" N(N-1)/4 calls (rounded down: a quarter of
# round robin in both orders, the budget; the default).
SCHEMES: list[tuple[str, str, dict[str, Any]]] = [
    ("pointwise 1-10", "pointwise", {}),
    ("anchor", "anchor", {}),
    ("anchor, swap", "anchor", {"swap": True}),
    ("single elim., random seeds", "single_elimination", {}),
    ("single elim., random seeds, swap", "single_elimination", {"swap": True}),
    ("single elim., anchor-seeded", "single_elimination", {"seeding": "anchor"}),
    ("single elim., anchor-seeded, swap", "single_elimination",
     {"seeding": "anchor", "swap": True}),
    ("swiss, log2 N rounds", "swiss", {}),
    ("swiss, log2 N rounds, swap", "swiss", {"swap": True}),
    ("swiss, N(N-1)/4 calls, swap", "swiss", {"calls": "quarter", "swap": True}),
    ("swiss, (N-1)//2 rounds", "swiss", {"rounds": "budget"}),
    ("swiss, N(N-1)/4 calls", "swiss", {"calls": "quarter"}),
    ("swiss, N(N-1)/4 calls, win rate", "swiss", {"calls": "quarter", "scoring": "win_rate"}),
    ("swiss, N(N-1)/4 calls, elo", "swiss", {"calls": "quarter", "scoring": "elo"}),
    ("swiss, anchor-seeded, N(N-1)/4 calls", "swiss", {"calls": "quarter", "seeding": "anchor"}),
    ("ceiling: the default's pairs scored from the judge's hidden z", "swiss",
     {"calls": "quarter", "latent": True}),
    ("bound: N(N-1)/4 random pairs scored from the judge's hidden z", "random_latent", {}),
    ("round robin, one order", "round_robin", {}),
    ("round robin, one order, win rate", "round_robin", {"scoring": "win_rate"}),
    ("round robin, one order, elo", "round_robin", {"scoring": "elo"}),
    ("round robin, both orders", "round_robin", {"swap": True}),
]
NOT_SCHEMES = ("ceiling", "bound")
"""Rows that score with what no judge reveals (its hidden continuous preference): limits for
the schemes, not candidates for the target."""


class SimulatedJudge:
    """The pairwise judge model of the module docstring, for one group (anchor at index n)."""

    def __init__(self, quality: np.ndarray, beta: float, rng: np.random.Generator) -> None:
        self.quality, self.beta = quality, beta
        upper = np.triu(rng.logistic(size=(len(quality), len(quality))), 1)
        self.noise = upper - upper.T

    def latent(self, a: int, b: int) -> float:
        return (self.quality[a] - self.quality[b]) / TAU + self.noise[a, b] + self.beta

    def __call__(self, pairs: list[tuple[int, int]]) -> list[Verdict | None]:
        return [verdict_of(self.latent(a, b)) for a, b in pairs]


def verdict_of(z: float) -> Verdict:
    if abs(z) <= TIE_BAND:
        return Verdict.TIE
    if z > 0:
        return Verdict.A_MUCH_BETTER if z > STRONG else Verdict.A_BETTER
    return Verdict.B_MUCH_BETTER if z < -STRONG else Verdict.B_BETTER


def _classes(z: np.ndarray) -> np.ndarray:
    return np.where(np.abs(z) <= TIE_BAND, 0, np.sign(z))


def flip_rate(beta: float, pairs: int = 200_000, seed: int = 12345) -> float:
    """Share of random pairs whose two orders give inconsistent verdicts under ``beta``."""
    rng = np.random.default_rng(seed)
    view = rng.normal(size=pairs) * math.sqrt(2) / TAU + rng.logistic(size=pairs)
    return float(np.mean(_classes(view + beta) != _classes(view - beta)))


def calibrate_beta(target: float = FLIP_TARGET) -> float:
    low, high = 0.0, 5.0
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if flip_rate(mid) < target else (low, mid)
    return (low + high) / 2


def pointwise_scores(quality: np.ndarray, rng: np.random.Generator) -> list[float]:
    noisy = quality + rng.normal(scale=TAU * math.pi / math.sqrt(6), size=len(quality))
    return [float(s) for s in np.clip(np.round(5.5 + 2 * noisy), 1, 10)]


def latent_scores(judge: SimulatedJudge, matches: list[Match], n: int) -> list[float]:
    """A ceiling, not a scheme: least squares on the judge's hidden latent preference
    (position bias removed) instead of its five-step label, for the same pairs."""
    rows = np.zeros((len(matches) + 1, n + 1))
    target = np.zeros(len(matches) + 1)
    for k, m in enumerate(matches):
        rows[k, m.a], rows[k, m.b] = 1.0, -1.0
        target[k] = judge.latent(m.a, m.b) - judge.beta
    rows[-1, :n] = 1.0  # fixes the free offset
    return [float(x) for x in np.linalg.lstsq(rows, target, rcond=None)[0][:n]]


def random_pairs(n: int, count: int, rng: np.random.Generator) -> list[Match]:
    """``count`` distinct pairs drawn round by round as random perfect matchings (a random
    near-regular comparison graph: about the best fixed design for least squares)."""
    pairs: list[Match] = []
    seen: set[frozenset[int]] = set()
    while len(pairs) < count:
        order = rng.permutation(n)
        for k in range(0, n - 1, 2):
            a, b = int(order[k]), int(order[k + 1])
            if frozenset((a, b)) not in seen and len(pairs) < count:
                seen.add(frozenset((a, b)))
                pairs.append(Match(a, b, None, 0))
    return pairs


def resolve(options: dict[str, Any], n: int) -> dict[str, Any]:
    """Budgets named relative to N (the budget scales with N), as numbers."""
    named_rounds = {"log2": None, "budget": max(1, (n - 1) // 2)}
    options = dict(options)
    if isinstance(options.get("rounds"), str):
        options["rounds"] = named_rounds[options["rounds"]]
    if options.get("calls") == "quarter":
        options["calls"] = default_options(n, options.get("swap", False))["calls"]
    return options


Row = tuple[float, float, float]


def evaluate(groups: int, seed: int, beta: float,
             schemes: list[tuple[str, str, dict[str, Any]]]) -> dict[tuple[str, int], Row]:
    """{(label, N): (mean calls, mean Spearman, standard error of the mean)}."""
    rows: dict[tuple[str, int], Row] = {}
    for n in SIZES:
        calls: dict[str, list[int]] = {label: [] for label, _, _ in schemes}
        rhos: dict[str, list[float]] = {label: [] for label, _, _ in schemes}
        for g in range(groups):
            rng = np.random.default_rng([seed, n, g])
            quality = np.append(rng.normal(size=n), 0.0)
            judge = SimulatedJudge(quality, beta, rng)
            for label, scheme, options in schemes:
                if scheme == "pointwise":
                    scores, used = pointwise_scores(quality[:n], rng), n
                elif scheme == "random_latent":
                    used = default_options(n)["calls"]
                    pairs = random_pairs(n, used, np.random.default_rng([seed, n, g, 1]))
                    scores = latent_scores(judge, pairs, n)
                else:
                    options = resolve(options, n)
                    latent = options.pop("latent", False)
                    result = run_tournament(n, judge, scheme=scheme, seed=seed * 100_003 + g,
                                            **options)
                    scores, used = result.scores, result.calls
                    if latent:
                        scores = latent_scores(judge, result.matches, n)
                calls[label].append(used)
                rhos[label].append(spearman(scores, quality[:n]))
        for label, _, _ in schemes:
            r = np.array(rhos[label])
            rows[label, n] = (float(np.mean(calls[label])), float(r.mean()),
                              float(r.std(ddof=1) / math.sqrt(len(r))))
    return rows


def judge_profile(groups: int, seed: int, beta: float) -> dict[str, float]:
    """The judge as the tournaments see it (round robin in both orders, N = 16): the share of
    swapped comparisons that were inconsistent, and of single verdicts that were ties, strong,
    and (when decided) right about the true order."""
    inconsistent = swapped = ties = strong = right = decided = 0
    for g in range(groups):
        rng = np.random.default_rng([seed, 999, g])
        quality = np.append(rng.normal(size=16), 0.0)
        judge = SimulatedJudge(quality, beta, rng)

        def recording(pairs: list[tuple[int, int]]) -> list[Verdict | None]:
            nonlocal ties, strong, right, decided
            verdicts = judge(pairs)
            for (a, b), v in zip(pairs, verdicts):
                ties += v.margin == 0
                strong += abs(v.margin) == 2
                decided += v.margin != 0
                right += v.margin * (quality[a] - quality[b]) > 0
            return verdicts

        result = run_tournament(16, recording, scheme="round_robin", swap=True)
        inconsistent += result.inconsistent
        swapped += len(result.matches)
    asked = 2 * swapped
    return {"flip": inconsistent / swapped, "ties": ties / asked, "strong": strong / asked,
            "right": right / decided}


def main() -> None:
    global TAU, TIE_BAND, STRONG
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=400, help="simulated groups per N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tau", type=float, default=TAU,
                        help="judge noise scale (a sensitivity check; the table is for 0.5)")
    parser.add_argument("--verdicts", choices=("graded", "binary"), default="graded",
                        help="binary: a judge that only says A>B or B>A (a sensitivity check)")
    args = parser.parse_args()
    TAU = args.tau
    if args.verdicts == "binary":
        TIE_BAND, STRONG = 0.0, math.inf
    started = time.perf_counter()
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}\n")
    beta = calibrate_beta()
    profile = judge_profile(200, args.seed, beta)
    print(f"judge: {args.verdicts} verdicts, tau {TAU}, position bias beta {beta:.3f}; "
          f"measured on swap: {profile['flip']:.1%} of verdicts flip (target {FLIP_TARGET:.1%}); "
          f"{profile['ties']:.0%} ties, {profile['strong']:.0%} strong, decided verdicts "
          f"{profile['right']:.0%} right. {args.groups} groups per N, seed {args.seed}.\n")
    rows = evaluate(args.groups, args.seed, beta, SCHEMES)
    default_label = next(label for label, scheme, options in SCHEMES
                         if scheme == DEFAULT_SCHEME and not label.startswith(NOT_SCHEMES)
                         and all({"scoring": "bt", "swap": False, **resolve(options, n)}
                                 == default_options(n) for n in SIZES))
    print("| scheme | " + " | ".join(f"N={n} calls | N={n} Spearman" for n in SIZES) + " |")
    print("|---|" + "---:|---:|" * len(SIZES))
    for label, _, _ in SCHEMES:
        cells = [f"{rows[label, n][0]:.1f} | {rows[label, n][1]:.3f} ± {rows[label, n][2]:.3f}"
                 for n in SIZES]
        marker = " **(default)**" if label == default_label else ""
        print(f"| {label}{marker} | " + " | ".join(cells) + " |")
    n = max(SIZES)
    budget = rows["round robin, both orders", n][0] / 4
    best_rho, best = max((rows[label, n][1], label) for label, _, _ in SCHEMES
                         if rows[label, n][0] <= budget and not label.startswith(NOT_SCHEMES))
    verdict = "MET" if best_rho >= TARGET_RHO else "NOT MET"
    print(f"\ntarget (N={n}: Spearman >= {TARGET_RHO} within {budget:.0f} calls, a quarter of "
          f"round robin both orders): {verdict}; best within the budget: {best} "
          f"({rows[best, n][0]:.0f} calls, {best_rho:.3f}); round robin one order "
          f"{rows['round robin, one order', n][1]:.3f}, both orders "
          f"{rows['round robin, both orders', n][1]:.3f}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
