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
    ("\\tanh(100)", "1"),  # issue 28 row 14: 1 - 2e^{-200}, 87 orders down inside tanh
    ("\\cos(e^{-100})", "1"),  # 1 - e^{-200}/2
    ("2^{e^{-200}}", "1"),  # 1 + e^{-200} ln 2
    ("1", "\\tanh(100)"),  # either side
    ("1-2e^{-200}", "\\tanh(100)"),  # the next term of the series is still a difference
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
    ("\\frac{e^{200}-1}{e^{200}+1}", "\\tanh(100)"),
    ("\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}", "\\frac{1}{2}"),
    ("\\cosh^2 5-\\sinh^2 5", "1"),
    ("0.5", "\\frac{1}{2}"),
    ("\\frac{\\sqrt{2}}{2}", "\\sin(\\pi/4)"),
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


def test_a_difference_hidden_inside_a_function_is_searched_to_the_digit_cap():
    """The proof of difference does not stop at the digits the answer wrote: ``tanh(100)``
    wrote nothing below its leading digit, yet differs from 1 at the 87th."""
    assert agree(sympy.tanh(100), sympy.Integer(1)) is False
    assert agree(sympy.cos(sympy.exp(-100)), sympy.Integer(1)) is False
    assert agree(sympy.Integer(2) ** sympy.exp(-200), sympy.Integer(1)) is False
    assert agree(sympy.sin(1) ** 2 + sympy.cos(1) ** 2, sympy.Integer(1)) is True
    verdict = check("\\boxed{\\tanh(100)}", "1")
    assert (verdict.reward, verdict.detail["decided_by"]) == (0.0, "different"), verdict.detail


def test_exactness_decisions_are_kept():
    assert check("\\boxed{\\frac{1}{2004!}}", "\\frac{1}{2006!}").reward == 0.0
    assert check("\\boxed{\\pm 2021}", "2021").reward == 0.0
    assert check("\\boxed{1+\\frac{1}{e}}", "1-\\frac{1}{e}").reward == 0.0
    assert check("\\boxed{\\frac{\\pi}{2004!}}", "\\frac{2005\\cdot 2006\\pi}{2006!}").reward == 1.0


# ------------------------------------------------------------------ class 3: several boxes


@pytest.mark.parametrize(("completion", "reference", "reward"), [
    ("The roots are \\boxed{2} and \\boxed{3}.", "2, 3", 1.0),
    ("The roots are \\boxed{3} and \\boxed{2}.", "\\{2,3\\}", 1.0),
    ("The roots are \\boxed{2} and \\boxed{4}.", "\\{2,3\\}", 0.0),
    ("\\boxed{(1,2)}, \\boxed{(2,1)}", "\\{(1,2),(2,1)\\}", 1.0),
    ("\\boxed{(1,2)}, \\boxed{(1,3)}", "\\{(1,2),(2,1)\\}", 0.0),
    ("\\boxed{k=45} and \\boxed{n=2}", "k=45, n=2", 1.0),
    ("\\boxed{k=45} and \\boxed{n=3}", "k=45, n=2", 0.0),
    ("$p=\\boxed{3}$, $q=\\boxed{2}$", "(p,q)=(3,2)", 1.0),
    ("$p=\\boxed{2}$, $q=\\boxed{3}$", "(3,2)", 0.0),  # a tuple reference is ordered
    ("\\boxed{2} and \\boxed{3}", "3", 1.0),  # a single-part reference: the last box
    ("\\boxed{3} at first, then \\boxed{2}", "3", 0.0),
    ("\\boxed{1} is wrong; the solutions are \\boxed{2, 3}", "2, 3", 1.0),  # a whole last box
])
def test_several_boxes_are_read_together_against_a_reference_of_several_parts(
        completion, reference, reward):
    assert check(completion, reference).reward == reward


def test_boxes_together_is_the_reported_rule_and_only_in_the_answer_part():
    out = check("\\boxed{2} and \\boxed{3}", "2, 3")
    assert (out.detail["rule"], out.detail["extracted"]) == ("boxes_together", "2, 3")
    out = check("<think>\\boxed{5}</think> So \\boxed{2} and \\boxed{3}.", "\\{2, 3\\}")
    assert (out.detail["rule"], out.detail["extracted"]) == ("boxes_together", "\\{2, 3\\}")
    assert check("\\boxed{2} and \\boxed{3}", "2, 3", {"extract": "boxed"}).reward == 1.0


# ------------------------------------------------------------------ class 4: labels


@pytest.mark.parametrize(("completion", "reference", "reward"), [
    ("\\boxed{(3,2)}", "(p,q)=(3,2)", 1.0),
    ("\\boxed{(2,3)}", "(p,q)=(3,2)", 0.0),
    ("\\boxed{(p,q)=(3,2)}", "(p,q)=(3,2)", 1.0),
    ("\\boxed{4, 5}", "AB=4, CD=5", 1.0),
    ("\\boxed{5, 4}", "AB=4, CD=5", 0.0),  # distinct labels: the values answer in order
    ("\\boxed{CD=5, AB=4}", "AB=4, CD=5", 1.0),
    ("\\boxed{AB=5, CD=4}", "AB=4, CD=5", 0.0),
    ("\\boxed{1}", "|AB|=1", 1.0),
    ("\\boxed{\\overline{AB}=1}", "|AB|=1", 1.0),
    ("\\boxed{CD=1}", "|AB|=1", 0.0),  # another label: another quantity
    ("\\boxed{1}", "f(x)=1", 1.0),
    ("\\boxed{x^2+1}", "f(x) = x^2+1", 1.0),
    ("\\boxed{f(x) = 1 + x^2}", "f(x) = x^2+1", 1.0),
    ("\\boxed{11:21}", "V_1:V_2=11:21", 1.0),
    ("\\boxed{21:11}", "V_1:V_2=11:21", 0.0),
    ("\\boxed{7:32}", "S=7:32", 1.0),
    ("\\boxed{\\frac{1}{\\sqrt6}}", "\\frac{NO}{BO}=\\frac{1}{\\sqrt6}", 1.0),
    ("\\boxed{\\frac{\\sqrt6}{6}}", "\\frac{NO}{BO}=\\frac{1}{\\sqrt6}", 1.0),
    ("\\boxed{30^\\circ}", "\\angle ABC = 30^\\circ", 1.0),
    ("\\boxed{x = 5+5+1 = 11}", "11", 1.0),
    ("\\boxed{x = 5+5+1 = 12}", "11", 0.0),
    ("\\boxed{2\\cdot 3 + 5 = 11 = 11}", "11", 1.0),
    ("\\boxed{f(y) = y}", "f(y) = y", 1.0),
    ("\\boxed{f(x+y) = f(x) + f(y)}", "f(x+y) = f(x) + f(y)", 1.0),
    ("\\boxed{g(x)^2 = 1}", "g(x)^2 = 1", 1.0),  # identical, though no point evaluates g
    ("\\boxed{f(y) = 2y}", "f(y) = y", 0.0),
    ("\\boxed{x(x+1) = 6}", "6", 0.0),  # a product, not a function: an equation, no value
    ("\\boxed{a(b+c) = 12}", "12", 0.0),
    ("\\boxed{\\varphi(n) = 4}", "4", 1.0),
    ("\\boxed{2^{10} = 1024}", "1024", 1.0),  # a closed form stated with its value
    ("\\boxed{2^{10} = 1000}", "1024", 0.0),
    ("\\boxed{\\frac{1}{2}\\cdot 4 = 2}", "2", 1.0),
    ("\\boxed{\\begin{vmatrix}1&2\\\\3&4\\end{vmatrix} = -2}", "-2", 1.0),
    ("\\boxed{\\det A = -2}", "-2", 1.0),
    ("\\boxed{x+y = 5}", "5", 0.0),  # variables on the left: an equation
])
def test_labelled_answers_and_chains(completion, reference, reward):
    assert check(completion, reference).reward == reward


def test_strict_mode_wants_the_label():
    assert check("\\boxed{4}", "AB=4", {"mode": "strict"}).reward == 0.0
    assert check("\\boxed{AB = 4}", "AB=4", {"mode": "strict"}).reward == 1.0


# ------------------------------------------------------------------ class 8: matrices


_M = "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"


@pytest.mark.parametrize(("completion", "reference", "reward"), [
    ("\\boxed{\\left[\\begin{array}{cc}1&2\\\\3&4\\end{array}\\right]}", _M, 1.0),
    ("\\boxed{\\left[\\begin{array}{cc}1&2\\\\3&5\\end{array}\\right]}", _M, 0.0),
    ("\\boxed{\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}}", _M, 1.0),
    ("\\boxed{\\begin{Bmatrix}1&2\\\\3&4\\end{Bmatrix}}", _M, 1.0),
    ("\\boxed{\\begin{vmatrix}1&2\\\\3&4\\end{vmatrix}}", "-2", 1.0),
    ("\\boxed{\\begin{vmatrix}1&2\\\\3&4\\end{vmatrix}}", "2", 0.0),
    ("\\boxed{\\begin{vmatrix}a&b\\\\c&d\\end{vmatrix}}", "ad-bc", 1.0),
    ("\\boxed{-2}", "\\begin{vmatrix}1&2\\\\3&4\\end{vmatrix}", 1.0),
    (f"\\boxed{{{_M} + \\begin{{pmatrix}}5&6\\\\7&8\\end{{pmatrix}}}}",
     "\\begin{pmatrix}6&8\\\\10&12\\end{pmatrix}", 1.0),
    (f"\\boxed{{{_M} + \\begin{{pmatrix}}5&6\\\\7&8\\end{{pmatrix}}}}",
     "\\begin{pmatrix}6&8\\\\10&13\\end{pmatrix}", 0.0),
    (f"\\boxed{{2{_M}}}", "\\begin{pmatrix}2&4\\\\6&8\\end{pmatrix}", 1.0),
    (f"\\boxed{{{_M}^{{-1}}}}", "\\begin{pmatrix}-2&1\\\\3/2&-1/2\\end{pmatrix}", 1.0),
    (f"\\boxed{{{_M}^{{1000}}}}", "\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}", 0.0),
])
def test_matrices_arrays_determinants_and_arithmetic(completion, reference, reward):
    assert check(completion, reference).reward == reward


# ------------------------------------------------------------------ class 9: written forms


@pytest.mark.parametrize(("completion", "reference", "reward"), [
    ("\\boxed{12:00}", "1:00", 0.0),
    ("\\boxed{12:00}", "12:00", 1.0),
    ("\\boxed{3:0}", "5:0", 0.0),
    ("\\boxed{2:4}", "1:2", 1.0),  # no zero part: still a ratio
    ("AZYUK2A", "2", 0.0),
])
def test_clock_times_and_zero_ratios_compare_as_written(completion, reference, reward):
    assert check(completion, reference).reward == reward


# ------------------------------------------------------------------ parameters


def test_a_comma_that_cannot_group_thousands_is_a_decimal_against_one_number():
    """Issue 31: ``2,74`` against one number is 2.74; against a list it stays a list;
    ``1,000`` groups thousands; ``decimal_comma`` true reads every one-comma number as a
    decimal."""
    assert check("\\boxed{2,74}", "2.74").reward == 1.0
    assert check("\\boxed{2.74}", "2,74").reward == 1.0
    assert check("\\boxed{0,111}", "0.111").reward == 1.0
    assert check("\\boxed{2,74}", "2, 74").reward == 1.0  # a list against a list
    assert check("\\boxed{2,74}", "274").reward == 0.0
    assert check("\\boxed{1,000}", "1").reward == 0.0
    assert check("\\boxed{1,000}", "1000").reward == 1.0
    assert check("\\boxed{2,74}", "2.74", {"decimal_comma": True}).reward == 1.0
    assert check("\\boxed{2{,}74}", "2,74", {"decimal_comma": True}).reward == 1.0
    assert check("\\boxed{2,74}", "274", {"decimal_comma": True}).reward == 0.0
    assert check("\\boxed{2, 74}", "2, 74").reward == 1.0  # a list by default
    assert check("\\boxed{1, 5}", "1, 5", {"decimal_comma": True}).reward == 1.0  # both sides
    from pydantic import ValidationError
    with pytest.raises(ValidationError):
        MathVerifier.Params.model_validate({"decimal_comma": "yes please"})


def test_a_rounded_third_needs_the_rounding_parameter():
    assert check("\\boxed{0.33}", "\\frac13").reward == 0.0
    assert check("\\boxed{0.33}", "\\frac13", {"min_rounding_digits": 2}).reward == 1.0
