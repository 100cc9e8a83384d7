"""Issue 17 classes 3, 4, 8 and 9: several boxes read together, labelled answers and chains,
matrices, and the false positives a fixed number of digits let through.

Each test pins one rule with cases that fail when the rule is removed; the labelled cases in
tests/data/math_real_compare.jsonl are run by test_math_cases.py."""

from __future__ import annotations

import pytest
import sympy

from rewardd.verifiers import Outcome, Sample, run_verifier
from rewardd.verifiers.math import MathVerifier
from rewardd.verifiers.math.precision import MAX_DIGITS, agree, spread

MATH = MathVerifier()


def check(completion: str, answer: str, params: dict | None = None) -> Outcome:
    outcome = run_verifier(MATH, Sample(completion), {"answer": answer}, params or {})
    assert outcome.ok, outcome.detail
    return outcome


# ------------------------------------------------------------------ class 9: precision


@pytest.mark.parametrize(("prediction", "reference"), [
    ("e^{100}+1", "e^{100}"),
    ("\\pi^{100}+1", "\\pi^{100}"),
    ("\\ln 2+10^{-45}", "\\ln 2"),
    ("x^2+10^{-30}x", "x^2"),
    ("\\frac{e^{100}+1}{e^{100}}", "1"),
    ("\\ln(e^{100}+1)", "100"),
    ("\\sqrt{2+10^{-60}}", "\\sqrt{2}"),
    ("e^{\\pi\\sqrt{163}}", "640320^3+744"),  # 7.5e-13 apart at 2.6e17: 30 orders down
    ("\\cos(10^{-20})", "1"),  # no sum wrote it: sympy's adaptive evaluation finds it
    ("y = x^2+10^{-30}x", "y = x^2"),
    ("y > x^2+10^{-30}x", "y > x^2"),
])
def test_a_written_difference_is_never_rounded_away(prediction, reference):
    assert check(f"\\boxed{{{prediction}}}", reference).reward == 0.0


@pytest.mark.parametrize(("prediction", "reference"), [
    ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt{6}}"),
    ("e^{50}\\cdot e^{50}+1", "e^{100}+1"),
    ("1", "\\sin^2 1+\\cos^2 1"),
    ("\\sin^2 x+\\cos^2 x", "1"),
    ("(x+10^{-30})^2", "x^2+2\\cdot 10^{-30}x+10^{-60}"),
    ("\\tan\\frac{\\pi}{8}", "\\sqrt2-1"),
    ("2y = 2x^2+2\\cdot10^{-30}x", "y = x^2+10^{-30}x"),
])
def test_true_identities_stay_equal_at_the_scaled_precision(prediction, reference):
    assert check(f"\\boxed{{{prediction}}}", reference).reward == 1.0


def test_spread_counts_the_orders_an_answer_wrote_below_its_leading_digits():
    e = sympy.E
    assert spread((e ** 100 + 1,)) == 44  # log10(e^100) = 43.43
    assert spread((sympy.log(2) + sympy.Rational(1, 10 ** 45),)) == 45  # log10(10^45)
    assert spread((sympy.Integer(262537412640768744),)) == 18  # a units digit is written
    assert spread((sympy.sqrt(2),)) == 1
    assert spread((sympy.pi,)) == 0


def test_agreement_beyond_the_digit_cap_is_not_certified():
    tiny = sympy.Rational(1, 10 ** (MAX_DIGITS + 10))
    assert agree(sympy.pi + tiny, sympy.pi + tiny * 2) is False
    assert agree(sympy.pi, sympy.pi) is True


def test_exactness_decisions_are_kept():
    assert check("\\boxed{\\frac{1}{2004!}}", "\\frac{1}{2006!}").reward == 0.0
    assert check("\\boxed{\\pm 2021}", "2021").reward == 0.0
    assert check("\\boxed{1+\\frac{1}{e}}", "1-\\frac{1}{e}").reward == 0.0
    assert check("\\boxed{\\frac{\\pi}{2004!}}", "\\frac{2005\\cdot 2006\\pi}{2006!}").reward == 1.0
