"""The ``extraction`` parameter of the math verifier (issue 31): strict, standard, lenient.

``standard`` (the default, for RL) reads every ``auto`` rule but refuses a last number that a
hedging policy could farm: one stated among candidates, or followed by a sentence of words.
Every verdict names the reading it used (``detail.extraction``).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rewardd.verifiers import Sample, run_verifier
from rewardd.verifiers.math import MathParams, MathVerifier

MATH = MathVerifier()


def _check(completion: str, answer: str, params: dict | None = None):
    outcome = run_verifier(MATH, Sample(completion), {"answer": answer}, params or {})
    assert outcome.ok, outcome.detail
    return outcome


@pytest.mark.parametrize(("completion", "answer", "strict", "standard", "lenient"), [
    ("\\boxed{8}", "8", 1.0, 1.0, 1.0),
    ("So the answer is 8.", "8", 1.0, 1.0, 1.0),
    ("Final Answer: 8", "8", 1.0, 1.0, 1.0),
    ("Janet has 18 dollars left.", "18", 0.0, 1.0, 1.0),
    ("The last term is $a_5 = 8$", "8", 0.0, 1.0, 1.0),
    # the garbage completion of a real TRL run (decided_by last_number before issue 31)
    ("7 0 6 n What 9 sw 10 The 16 8 W", "8", 0.0, 0.0, 1.0),
    ("candidates 3 or 4 remain", "4", 0.0, 0.0, 1.0),
    ("We add them up to 42. Let me double check the arithmetic later", "42", 0.0, 0.0, 1.0),
])
def test_each_reading(completion, answer, strict, standard, lenient):
    for level, reward in (("strict", strict), ("standard", standard), ("lenient", lenient)):
        outcome = _check(completion, answer, {"extraction": level})
        assert (outcome.reward, outcome.detail["extraction"]) == (reward, level), (
            level, outcome.detail)


def test_standard_is_the_default_and_every_verdict_names_its_reading():
    assert MathParams().extraction == "standard"
    assert _check("\\boxed{1}", "1").detail["extraction"] == "standard"
    assert _check("(C)", "(C)").detail["extraction"] == "standard"  # multiple choice too
    assert _check("\\boxed{1}", "1", {"extract": "boxed"}).detail["extraction"] == "boxed"
    assert _check("1", "1", {"extract": "none"}).detail["extraction"] == "none"


def test_old_requests_stay_valid_and_a_wrong_level_is_refused():
    assert _check("it is 5", "5", {"extract": "auto", "mode": "lenient"}).reward == 1.0
    with pytest.raises(ValidationError):
        MathParams.model_validate({"extraction": "loose"})


def test_words_in_a_math_span_answer_a_text_reference_only():
    """``$odd$`` is no number and no expression: against ``\\text{odd}`` the words are the
    answer (compared case-insensitively); against a number they are still no answer."""
    assert _check("The sum is $odd$", "\\text{odd}").detail["rule"] == "text_span"
    assert _check("The sum is $odd$", "\\text{odd}").reward == 1.0
    assert _check("$Even$", "$\\text{even}$").reward == 1.0
    assert _check("The sum is $odd$", "\\text{even}").reward == 0.0
    assert _check("The sum is $odd$", "3").detail["rule"] == "no_answer"
    assert _check("The sum is $odd$", "\\text{odd}", {"extraction": "strict"}).reward == 0.0


@pytest.mark.parametrize(("completion", "answer", "reward"), [
    ("We get $d = 90/n$. Therefore, there are 12 distinct sequences.", "12", 1.0),
    ("We get $d = 90/n$. Therefore, the error increases by 100%.", "100\\%", 1.0),
    ("So $t = 8$. Final Answer: Jane started 3 hours ago.", "3", 1.0),
    ("Final Answer: The largest $n$ is 34.", "34", 1.0),
    ("So $2 \\cdot 100 = \\boxed{200}$. Final Answer: The final answer is $10,455$.", "10455", 1.0),
    ("\\boxed{3} is what a careless reader gets; in fact the answer is 4.", "3", 1.0),
    ("We get $d = 90/n$. Therefore, 12 or 13 sequences remain.", "12", 0.0),  # two numbers
])
def test_a_concluding_sentence_with_one_number_answers(completion, answer, reward):
    assert _check(completion, answer).reward == reward
