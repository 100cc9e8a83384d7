"""The pure tournament layer of the arena verifier: verdicts, pairings, scorings, bookkeeping."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rewardd.verifiers.judge.games import Match, Verdict, merge_orders
from rewardd.verifiers.judge.ratings import SCORINGS, bt_scores, elo_scores, spearman, win_rate_scores
from rewardd.verifiers.judge.tournament import (DEFAULT_OPTIONS, DEFAULT_SCHEME, SCHEMES,
                                        _pair_avoiding_rematches, default_options,
                                        run_tournament)

A2, A1, TIE, B1, B2 = (Verdict.A_MUCH_BETTER, Verdict.A_BETTER, Verdict.TIE, Verdict.B_BETTER,
                       Verdict.B_MUCH_BETTER)


class Recorder:
    """A judge from a function of (first, second), recording every round it is asked."""

    def __init__(self, decide):
        self.decide, self.rounds = decide, []

    def __call__(self, pairs):
        self.rounds.append(list(pairs))
        return [self.decide(a, b) for a, b in pairs]

    @property
    def asked(self):
        return [pair for round_ in self.rounds for pair in round_]


def perfect(quality):
    """Never wrong, no position bias: ``>>`` for a gap over 1, ``>`` below."""
    def decide(a, b):
        gap = quality[a] - quality[b]
        return (A2 if gap > 1 else A1) if gap > 0 else (B2 if gap < -1 else B1)
    return Recorder(decide)


def pairs_of(result):
    return [frozenset((m.a, m.b)) for m in result.matches]


# --- verdicts ------------------------------------------------------------------------------

def test_verdict_parse_accepts_the_five_labels_with_whitespace_and_reversed_forms():
    assert [Verdict.parse(v) for v in ("A>>B", "A>B", "A=B", "B>A", "B>>A")] == [
        A2, A1, TIE, B1, B2]
    assert Verdict.parse(" A >> B ") is A2
    assert [Verdict.parse(v) for v in ("B<<A", "B<A", "B=A", "A<B", "A<<B")] == [
        A2, A1, TIE, B1, B2]


@pytest.mark.parametrize("label", ["", "A>>>B", "A>B>", "[[A>B]]", "a>b", "A>C", "tie"])
def test_verdict_parse_rejects_anything_else(label):
    with pytest.raises(ValueError):
        Verdict.parse(label)


def test_flipped_exchanges_the_places_and_keeps_the_strength():
    assert [v.flipped() for v in (A2, A1, TIE, B1, B2)] == [B2, B1, TIE, A1, A2]
    assert all(v.flipped().flipped() is v for v in Verdict)


def test_verdict_scores_grade_the_strength_and_outcomes_do_not():
    assert [v.score for v in (A2, A1, TIE, B1, B2)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert [v.outcome for v in (A2, A1, TIE, B1, B2)] == [1.0, 1.0, 0.5, 0.0, 0.0]


# --- swapped comparisons -------------------------------------------------------------------

def test_consistent_swapped_pair_keeps_the_weaker_strength():
    # (a, b) -> A>>B; (b, a) -> B>A, i.e. a preferred again, slightly
    assert merge_orders(A2, B1) == (A1, True)
    assert merge_orders(B1, A1) == (B1, True)
    assert merge_orders(TIE, TIE) == (TIE, True)


def test_inconsistent_swapped_pair_is_a_tie():
    # each order prefers whichever answer is shown first
    assert merge_orders(A2, A1) == (TIE, False)
    # a preference in one order, a tie in the other
    assert merge_orders(A1, TIE) == (TIE, False)


def test_swapped_pair_with_one_failed_order_keeps_the_other():
    assert merge_orders(None, A1) == (B1, None)
    assert merge_orders(A2, None) == (A2, None)
    assert merge_orders(None, None) == (None, None)


def test_swap_asks_both_orders_in_the_same_round_and_counts_inconsistent_pairs():
    judge = Recorder(lambda a, b: A1)  # always prefers the first shown
    result = run_tournament(4, judge, scheme="round_robin", swap=True)
    assert len(judge.rounds) == 1 and result.rounds == 1
    assert sorted(judge.asked) == sorted((i, j) for i in range(4) for j in range(4) if i != j)
    assert result.calls == 12 and result.inconsistent == 6 and result.failed == 0
    assert all(m.verdict is TIE and m.orders == 2 and m.consistent is False
               for m in result.matches)
    assert len(set(result.scores)) == 1


def test_swap_keeps_a_consistent_judges_preferences():
    quality = [0.0, 3.0, 1.0, 2.0]
    result = run_tournament(4, perfect(quality), scheme="round_robin", swap=True)
    assert result.inconsistent == 0
    assert spearman(result.scores, quality) == 1.0


# --- scorings ------------------------------------------------------------------------------

def test_bt_two_players_strength_ratio_is_the_win_ratio():
    # 3 games won of 4: p = 3/4, so exp(theta_0 - theta_1) = 3 / 1
    matches = [Match(0, 1, A2, 1), Match(0, 1, A2, 1), Match(1, 0, A2, 1), Match(1, 0, B2, 1)]
    theta = bt_scores(2, matches, prior=1e-9)
    assert theta[0] - theta[1] == pytest.approx(math.log(3), abs=1e-6)


def test_bt_slight_preference_is_three_quarters_of_a_win():
    theta = bt_scores(2, [Match(0, 1, A1, 1)], prior=1e-9)
    assert theta[0] - theta[1] == pytest.approx(math.log(0.75 / 0.25), abs=1e-6)


def test_bt_prior_keeps_an_undefeated_rollout_finite_at_the_hand_derived_value():
    # one A>>B, prior 1: by symmetry theta = (x, -x), and d/dx of the objective is zero at
    # 1 - s(2x) + 1/2 - s(x) = 0 (s the logistic function); solved by bisection here.
    theta = bt_scores(2, [Match(0, 1, A2, 1)], prior=1.0)
    s = lambda t: 1 / (1 + math.exp(-t))  # noqa: E731
    low, high = 0.0, 10.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if 1 - s(2 * mid) + 0.5 - s(mid) > 0 else (low, mid)
    assert theta[0] == pytest.approx(low, abs=1e-8)
    assert theta[1] == pytest.approx(-low, abs=1e-8)
    assert 0 < theta[0] < 2


def test_bt_fit_matches_expected_scores_to_observed_ones():
    matches = [Match(0, 1, A1, 1), Match(1, 2, A2, 1), Match(2, 0, TIE, 1), Match(0, 3, B1, 1),
               Match(3, 1, B2, 1)]
    theta = bt_scores(4, matches, prior=0.5)
    observed, expected = np.zeros(4), np.zeros(4)
    for m in matches:
        p = 1 / (1 + math.exp(theta[m.b] - theta[m.a]))
        observed[m.a] += m.verdict.score
        observed[m.b] += 1 - m.verdict.score
        expected[m.a] += p
        expected[m.b] += 1 - p
    prior_pull = 0.5 * (0.5 - 1 / (1 + np.exp(-theta)))
    assert np.allclose(observed - expected + prior_pull, 0, atol=1e-9)


def test_win_rate_counts_ties_as_half_and_ignores_strength():
    matches = [Match(0, 1, A1, 1), Match(0, 2, TIE, 1), Match(1, 2, B2, 1),
               Match(1, 2, None, 1)]
    assert win_rate_scores(4, matches).tolist() == [0.75, 0.0, 0.75, 0.5]


def test_elo_one_game_moves_both_by_k_times_the_surprise():
    # expected 0.5, result 0.75: 4 * 0.25 = 1 point, in every order
    assert elo_scores(2, [Match(0, 1, A1, 1)], seed=3).tolist() == [1001.0, 999.0]


def test_elo_is_deterministic_for_a_seed():
    matches = [Match(i % 5, (i * 3 + 1) % 5, [A2, A1, B1][i % 3], 1) for i in range(12)
               if i % 5 != (i * 3 + 1) % 5]
    assert elo_scores(5, matches, seed=7).tolist() == elo_scores(5, matches, seed=7).tolist()


# --- schemes -------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [5, 8, 16])
@pytest.mark.parametrize("swap", [False, True])
def test_single_elimination_plays_n_minus_one_matches_with_byes(n, swap):
    judge = perfect(list(np.random.default_rng(n).normal(size=n)))
    result = run_tournament(n, judge, scheme="single_elimination", swap=swap, seed=1)
    assert len(result.matches) == n - 1
    assert result.calls == (n - 1) * (2 if swap else 1)
    assert result.rounds == len(judge.rounds) == math.ceil(math.log2(n))
    size = 1 << (n - 1).bit_length()
    assert len([m for m in result.matches if m.round == 1]) == n - size // 2


def test_anchor_seeded_elimination_first_plays_everyone_against_the_anchor():
    n = 6
    judge = perfect([0.0, 5.0, 1.0, 4.0, 2.0, 3.0, 2.5])
    result = run_tournament(n, judge, scheme="single_elimination", seeding="anchor")
    assert sorted(judge.rounds[0]) == [(i, n) for i in range(n)]
    assert result.calls == n + n - 1
    assert all(n not in pair for round_ in judge.rounds[1:] for pair in round_)
    # seeds 1 and 2 (rollouts 1 and 3) can meet only in the final, where 1 wins
    assert max(range(n), key=lambda i: result.scores[i]) == 1
    assert {m.a for m in result.matches if m.round == 4} | {
        m.b for m in result.matches if m.round == 4} == {1, 3}


def test_elimination_ranks_by_round_reached_then_by_score():
    quality = [0.0, 1.0, 2.0, 3.0]
    result = run_tournament(4, perfect(quality), scheme="single_elimination", seed=5)
    assert sorted(result.scores) == [0.0, 1 / 3, 2 / 3, 1.0]
    assert result.scores[3] == 1.0 and result.scores[2] == pytest.approx(2 / 3)
    losers = [m.b if m.verdict.margin > 0 else m.a for m in result.matches if m.round == 1]
    theta = bt_scores(5, result.matches)
    assert sorted(losers, key=lambda i: result.scores[i]) == sorted(losers,
                                                                   key=lambda i: theta[i])


def test_single_elimination_does_not_rank_apart_what_only_the_seed_told_apart():
    for n in (2, 4):
        result = run_tournament(n, Recorder(lambda a, b: TIE), scheme="single_elimination",
                                seed=3)
        assert result.scores == [0.5] * n


def test_swiss_never_rematches_when_avoidable_and_gives_everyone_rounds_games():
    for seed in range(20):
        judge = Recorder(lambda a, b, s=seed: [A2, A1, TIE, B1, B2][(a * 7 + b * 3 + s) % 5])
        result = run_tournament(8, judge, scheme="swiss", rounds=4, seed=seed)
        assert len(set(pairs_of(result))) == len(result.matches) == 16
        assert result.rounds == len(judge.rounds) == 4
        assert all(sorted(i for pair in round_ for i in pair) == list(range(8))
                   for round_ in judge.rounds)


def test_swiss_with_odd_n_gives_each_bye_to_a_different_rollout():
    judge = Recorder(lambda a, b: A1 if a < b else B1)
    result = run_tournament(7, judge, scheme="swiss", rounds=3, seed=2)
    byes = [set(range(7)) - {i for pair in round_ for i in pair} for round_ in judge.rounds]
    assert all(len(bye) == 1 for bye in byes) and len(set.union(*byes)) == 3
    games = [sum(i in pair for pair in pairs_of(result)) for i in range(7)]
    assert sorted(games) == [2, 2, 2, 3, 3, 3, 3]
    assert len(set(pairs_of(result))) == 9


def test_swiss_default_rounds_is_ceil_log2_n():
    result = run_tournament(10, perfect(list(range(10))), scheme="swiss")
    assert result.rounds == 4 and result.calls == 20


def mixed_judge(seed=0):
    """Verdicts of every strength and some upsets, so that scores are not all equal."""
    return Recorder(lambda a, b: [A2, A1, TIE, B1, B2][(a * 7 + b * 3 + seed) % 5])


def test_swiss_calls_budget_keeps_the_closest_pairs_of_the_round_that_does_not_fit():
    whole = run_tournament(16, mixed_judge(), scheme="swiss", rounds=8, seed=3)
    capped_judge = mixed_judge()
    capped = run_tournament(16, capped_judge, scheme="swiss", calls=60, seed=3)
    assert capped.calls == 60 and capped.rounds == 8
    assert [len(round_) for round_ in capped_judge.rounds] == [8] * 7 + [4]
    assert capped.matches[:56] == whole.matches[:56]  # the same first seven rounds
    before = bt_scores(17, whole.matches[:56])
    gaps = sorted(abs(before[m.a] - before[m.b]) for m in whole.matches[56:])
    kept = sorted(abs(before[m.a] - before[m.b]) for m in capped.matches[56:])
    assert {frozenset((m.a, m.b)) for m in capped.matches[56:]} <= set(pairs_of(whole)[56:])
    assert kept == pytest.approx(gaps[:4])


def test_swiss_calls_count_swapped_orders_and_the_anchor_round():
    swapped = run_tournament(8, mixed_judge(), scheme="swiss", calls=14, swap=True, seed=1)
    assert swapped.calls == 14 and len(swapped.matches) == 7
    anchored = run_tournament(8, mixed_judge(), scheme="swiss", calls=14, seeding="anchor")
    assert anchored.calls == 14 and len(anchored.matches) == 8 + 6
    odd = run_tournament(7, mixed_judge(), scheme="swiss", calls=10, seed=2)
    assert odd.calls == 10 and odd.rounds == 4
    both = run_tournament(8, mixed_judge(), scheme="swiss", calls=100, rounds=2)
    assert both.calls == 8  # the rounds end first


def test_swiss_checks_the_budget_before_the_anchor_round():
    judge = mixed_judge()
    with pytest.raises(ValueError, match="after 16 against the anchor"):
        run_tournament(8, judge, scheme="swiss", seeding="anchor", calls=12, swap=True)
    assert judge.asked == []  # nothing spent on a tournament that cannot be played


def test_swiss_never_asks_the_same_ordered_pair_twice():
    pair = run_tournament(2, mixed_judge(), scheme="swiss", calls=50)
    assert pair.calls == 2 and {(m.a, m.b) for m in pair.matches} == {(0, 1), (1, 0)}
    swapped = run_tournament(2, mixed_judge(), scheme="swiss", calls=50, swap=True)
    assert swapped.calls == 2
    judge = mixed_judge()
    run_tournament(5, judge, scheme="swiss", rounds=12, seed=1)
    assert len(judge.asked) == len(set(judge.asked)) > 10  # rematches in the other order


def test_a_lone_rollout_meets_the_anchor():
    judge = Recorder(lambda a, b: A1 if a < b else B1)  # rollout 0 beats the anchor (1)
    result = run_tournament(1, judge, scheme="anchor")
    assert judge.asked == [(0, 1)] and result.calls == 1
    lone = run_tournament(1, judge, scheme="swiss", seeding="anchor")
    assert lone.calls == 1
    assert run_tournament(1, judge, scheme="swiss").calls == 0


def test_swiss_calls_budget_must_leave_a_comparison():
    with pytest.raises(ValueError, match="calls must be at least 1"):
        run_tournament(4, mixed_judge(), scheme="swiss", calls=0)
    with pytest.raises(ValueError, match="leaves no comparison"):
        run_tournament(4, mixed_judge(), scheme="swiss", calls=1, swap=True)
    with pytest.raises(ValueError, match="leaves no comparison"):
        run_tournament(4, mixed_judge(), scheme="swiss", calls=4, seeding="anchor")


def test_pairing_backtracks_instead_of_rematching():
    # greedy from the top would pair (0, 1) and be left with the rematch (2, 3)
    assert _pair_avoiding_rematches([0, 1, 2, 3], {frozenset((2, 3))}) == [(0, 2), (1, 3)]
    met = {frozenset((2, 3)), frozenset((4, 5))}
    assert _pair_avoiding_rematches(list(range(6)), met) == [(0, 1), (2, 4), (3, 5)]


def test_pairing_rematches_only_when_unavoidable():
    met = {frozenset((i, j)) for i in range(4) for j in range(i + 1, 4)}
    pairs = _pair_avoiding_rematches([0, 1, 2, 3], met)
    assert sorted(i for pair in pairs for i in pair) == [0, 1, 2, 3]


@pytest.mark.parametrize("swap", [False, True])
def test_anchor_scheme_only_pairs_against_the_anchor(swap):
    n = 5
    table = {0: A2, 1: A1, 2: TIE, 3: B1, 4: B2}  # rollout i's verdict against the anchor
    judge = Recorder(lambda a, b: table[a] if b == n else table[b].flipped())
    result = run_tournament(n, judge, scheme="anchor", swap=swap)
    assert all(n in pair for pair in judge.asked)
    assert sorted(i for m in result.matches for i in (m.a, m.b) if i != n) == list(range(n))
    assert result.calls == n * (2 if swap else 1) and result.rounds == 1
    assert result.scores == sorted(result.scores, reverse=True)
    assert len(set(result.scores)) == n


def test_round_robin_one_order_shows_each_rollout_first_in_half_its_games():
    judge = Recorder(lambda a, b: A1)
    result = run_tournament(6, judge, scheme="round_robin")
    firsts = [sum(a == i for a, _ in judge.asked) for i in range(6)]
    assert sorted(firsts) == [2, 2, 2, 3, 3, 3]
    assert result.calls == 15 and len(set(pairs_of(result))) == 15


@pytest.mark.parametrize("scheme,options", [
    ("round_robin", {}), ("single_elimination", {}), ("single_elimination", {"seeding": "anchor"}),
    ("swiss", {}), ("swiss", {"seeding": "anchor"}), ("anchor", {})])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("scoring", sorted(SCORINGS))
def test_a_judge_that_always_fails_gives_failed_calls_and_equal_scores(scheme, options, swap,
                                                                      scoring):
    result = run_tournament(6, lambda pairs: [None] * len(pairs), scheme=scheme, swap=swap,
                            scoring=scoring, **options)
    assert result.calls > 0 and result.failed == result.calls
    assert all(m.verdict is None for m in result.matches)
    assert len(set(result.scores)) == 1


def test_a_perfect_judge_ranks_exactly_with_round_robin_and_swiss_and_crowns_the_best():
    quality = list(np.random.default_rng(0).normal(size=16))
    best, worst = int(np.argmax(quality)), int(np.argmin(quality))
    rr = run_tournament(16, perfect(quality), scheme="round_robin")
    assert spearman(rr.scores, quality) == 1.0
    swiss = run_tournament(16, perfect(quality), scheme="swiss", rounds=15, seed=4)
    assert spearman(swiss.scores, quality) == 1.0
    short = run_tournament(16, perfect(quality), scheme="swiss", seed=4)
    assert int(np.argmax(short.scores)) == best and spearman(short.scores, quality) > 0.9
    for seeding in ("random", "anchor"):
        knockout = run_tournament(16, perfect([*quality, 0.0]), scheme="single_elimination",
                                  seeding=seeding, seed=4)
        assert int(np.argmax(knockout.scores)) == best and knockout.scores[best] == 1.0
        assert knockout.scores[worst] < 0.5


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_same_seed_same_pairs_and_scores(scheme):
    noisy = lambda a, b: [A2, A1, TIE, B1, B2][(a * 5 + b * 2) % 5]  # noqa: E731
    judges = [Recorder(noisy) for _ in range(3)]
    results = [run_tournament(10, judge, scheme=scheme, seed=seed)
               for judge, seed in zip(judges, (3, 3, 4))]
    assert judges[0].rounds == judges[1].rounds
    assert results[0].scores == results[1].scores
    if scheme in ("swiss", "single_elimination"):  # the seed draws their pairings
        assert judges[0].rounds != judges[2].rounds


def test_result_is_plain_data_for_the_detail():
    result = run_tournament(3, lambda pairs: [A1, None, B2][:len(pairs)], scheme="round_robin")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["calls"] == 3 and data["failed"] == 1
    assert [m["verdict"] for m in data["matches"]] == ["A>B", None, "B>>A"]


def test_groups_of_zero_or_one_need_no_judge():
    for n in (0, 1):
        result = run_tournament(n, lambda pairs: pytest.fail("judge called"), scheme="swiss")
        assert result.scores == [0.0] * n and result.calls == 0


def test_bad_arguments_are_value_errors_naming_the_problem():
    judge = Recorder(lambda a, b: A1)
    with pytest.raises(ValueError, match="unknown scheme"):
        run_tournament(4, judge, scheme="double_elimination")
    with pytest.raises(ValueError, match="unknown scoring"):
        run_tournament(4, judge, scoring="trueskill")
    with pytest.raises(ValueError, match="no option rounds"):
        run_tournament(4, judge, scheme="round_robin", rounds=3)
    with pytest.raises(ValueError, match="seeding"):
        run_tournament(4, judge, scheme="swiss", seeding="pointwise")
    with pytest.raises(ValueError, match="answered 1 of"):
        run_tournament(4, lambda pairs: [A1], scheme="round_robin")


def test_default_spends_a_quarter_of_round_robin_in_both_orders():
    assert DEFAULT_SCHEME in SCHEMES
    assert default_options(16) == DEFAULT_OPTIONS
    for n in (2, 3, 4, 8, 9, 16, 32):
        result = run_tournament(n, perfect(list(range(n))), scheme=DEFAULT_SCHEME,
                                **default_options(n))
        assert result.calls == max(math.ceil(n / 2), n * (n - 1) // 4)
        assert len(set(pairs_of(result))) == len(result.matches)
        assert {i for m in result.matches for i in (m.a, m.b)} == set(range(n))  # all judged
    swapped = run_tournament(8, perfect(list(range(8))), scheme=DEFAULT_SCHEME,
                             **default_options(8, swap=True))
    assert swapped.calls == 28 and len(swapped.matches) == 14


# --- spearman ------------------------------------------------------------------------------

def test_spearman_hand_values_with_ties_by_average_ranks():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # ranks [0, 1.5, 1.5, 3] and [0, 1, 2, 3]: 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(3 / math.sqrt(10))
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])
