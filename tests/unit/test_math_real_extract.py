"""Answer extraction on real model output (issue 17, classes 1, 2, 5, 6, 7).

``tests/data/math_real_extract.jsonl`` holds labelled cases written from the formats of MATH,
GSM8K, NuminaMath and OpenR1/OpenThoughts outputs and real completions (long reasoning,
``<think>``, chat-template debris); each must get its label. The phrasing property: wrapping a
case's prediction in any common final-answer phrasing (the table below) never changes the
verdict, for every labelled case whose prediction states its answer (a box, or one line of
mathematics); a prediction that is prose without a box has already chosen its own phrasing.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from rewardd.verifiers import FailureKind, Sample, run_verifier
from rewardd.verifiers.math import MathVerifier
from rewardd.verifiers.math.completion import split_completion, strip_template
from rewardd.verifiers.math.extract import extract_answer, reference_answer
from rewardd.verifiers.math.prose import is_prose, last_numeric, tidy
from rewardd.verifiers.text import find_last_boxed

DATA = Path(__file__).resolve().parents[1] / "data"


def _load(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


CASES = _load("math_real_extract.jsonl")
MATH = MathVerifier()
CLASSES = {"prose_answer", "trailing_number", "dataset_format", "final_phrasing",
           "solution_reference"}


def _reward(prediction: str, reference: str, params: dict | None = None) -> float:
    outcome = run_verifier(MATH, Sample(prediction), {"answer": reference}, params or {})
    assert outcome.ok, outcome.detail
    return outcome.reward


def test_the_set_covers_its_classes_with_both_labels():
    assert len(CASES) >= 130
    assert len({c["id"] for c in CASES}) == len(CASES)
    counts = Counter((c["class"], c["expected"]) for c in CASES)
    for name in CLASSES:
        assert counts[(name, True)] >= 10 and counts[(name, False)] >= 8, (name, counts)
    assert {c["class"] for c in CASES} == CLASSES


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case):
    reward = _reward(case["prediction"], case["reference"], case.get("params"))
    assert reward == (1.0 if case["expected"] else 0.0), case["note"]


# ------------------------------------------------------------------ the phrasing property

PHRASINGS = (
    "The final answer is {p}.",
    "Final Answer: The final answer is ${p}$. I hope it is correct.",
    "Thus the answer is: \\[ {p} \\]",
    "**Final Answer**\n\\[\n{p}\n\\]",
    "### Final Answer\n{p}",
    "Answer: {p}",
    "**Answer:** {p}",
    "#### {p}",
    "Therefore, the answer is ${p}$.",
    "{p}\n\nI hope it is correct.",
    "<think>\nFirst try: $x = 17$, so maybe \\boxed{17}? Check: 2 + 2 = 4. No.\n</think>\n\n{p}",
    "<think>\nThe answer might be 100.\n</think>\nThe final answer is {p}.",
    "{p}<|im_end|>\n<|im_start|>user\nNow compute $3 + 4$.<|im_end|>\n<|im_start|>assistant\n"
    "The answer is \\boxed{7}.",
    "<|im_start|>assistant\n{p}<|im_end|>",
    "{p}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is \\boxed{99}?",
    "Let's think step by step. We have $a = 7$ and $b = 12$, so $a + b = 19$.\n\n{p}",
)


def _states_its_answer(prediction: str) -> bool:
    """A non-empty box, or one line of mathematics; not already a framed completion (a chat
    template's tokens or a think block would frame the phrasing instead of the answer)."""
    if re.search(r"<\|?|</?think>|\uff5c", prediction):
        return False
    if re.search(r"final answer", prediction, re.IGNORECASE):
        return False  # already phrased: a phrasing around it frames a whole solution
    if len(re.findall(r"(?<!\\)\$", prediction)) % 2:
        return False  # a lone currency sign ($1,000.99): inside a phrasing's $..$ it pairs up
    if (box := find_last_boxed(prediction)) is not None and box.strip():
        return True
    return "\n" not in prediction.strip() and not is_prose(prediction)


_ALL = [case for path in sorted(DATA.glob("math_*.jsonl")) for case in _load(path.name)]
"""Every labelled math set (the main set, the held-back set, this one, and later ones)."""
PROPERTY_CASES = [c for c in _ALL if c["class"] != "adversarial"
                  and _states_its_answer(c["prediction"])]


def test_the_phrasing_table_and_its_cases_are_large_enough():
    assert len(PHRASINGS) >= 15
    assert len(PROPERTY_CASES) >= 600


@pytest.mark.parametrize("phrasing", PHRASINGS, ids=range(len(PHRASINGS)))
def test_wrapping_a_prediction_in_a_phrasing_never_changes_the_verdict(phrasing):
    changed = []
    for case in PROPERTY_CASES:
        params = case.get("params", {})
        plain = _reward(case["prediction"], case["reference"], params)
        wrapped = _reward(phrasing.replace("{p}", case["prediction"]), case["reference"], params)
        if wrapped != plain:
            changed.append((case["id"], plain, wrapped))
    assert not changed, changed


# ------------------------------------------------------------------ the pieces, by hand


def test_a_reference_that_is_a_solution_without_an_answer_is_an_invalid_reference():
    outcome = run_verifier(MATH, Sample("\\boxed{4}"),
                           {"answer": "We count the cases one by one and find nothing works, "
                                      "so no value exists"}, {})
    assert outcome.error is FailureKind.invalid_reference
    assert "no answer in the reference" in outcome.detail["message"]


@pytest.mark.parametrize(("reference", "answer"), [
    ("42", "42"),
    ("no solution", "no solution"),
    ("\\boxed{7}", "\\boxed{7}"),
    ("so the answer is \\boxed{11,\\!111}", "11,\\!111"),
    ("We solve it. Therefore $x \\in [-2, 7]$", "x \\in [-2, 7]"),
    ("Adding, 2 + 3 gives 5 in all and more text here", None),
])
def test_reference_answer(reference, answer):
    assert reference_answer(reference) == answer


@pytest.mark.parametrize(("completion", "answer", "rule"), [
    ("So it is 8.", "8", "closing"),
    ("It equals 1/2", "1/2", "closing"),
    ("The code is AZ2B", None, "no_answer"),
    ("we waited 3 1/2 hours, then 20 more", "20", "last_number"),
    ("the total comes to 2^{10}", "2^{10}", "last_number"),
    ("value near 1,000,000 today", "1000000", "last_number"),
    ("<think>\\boxed{3}</think>Final: $4$", "4", "dollar"),
    ("<think>I get 17 apples.</think>", "17", "closing"),
    ("$4$<|im_end|><|im_start|>user $5$", "4", "dollar"),
    ("#### 1,440", "1,440", "answer_line"),
    ("Step 1: $a = 7$.\n\n19", "19", "bare"),
    ("The answer is $x=2$ or $x=3$.", "x=2, x=3", "final_answer_is"),
    ("The answer is:\n\n$$\\frac{\\pi}{3}$$\n\nsince...", "\\frac{\\pi}{3}", "final_answer_is"),
    ("**Answer: 5**", "5", "answer_line"),
    ("We compute.\n\n---", None, "no_answer"),
    ("<think>\\boxed{5}</think>\nSo 5 of them, in 2 steps.", "5", "boxed"),
    ("<think>I think 7</think>\nSo 5 of them, in 2 steps.", "2", "last_number"),
    ("It costs $5 and $6 more, so $11 total.", "11", "last_number"),
    ("The answer is $3$, $4$, and $5$.", "3, 4, 5", "final_answer_is"),
    ("The cost is $12.", "12", "closing"),
    ("The answer is therefore 17.", "17", "final_answer_is"),
    ("It is 5 and 6.", "5, 6", "closing"),
    ("we get 1,000 apples", "1,000", "closing"),
    ("Both $x = 2$ and $y = 7$ hold, and the sum is 9.", "y = 7", "dollar"),
    ("Since $3^2 = 9$, the largest $n$ is 3.", "3", "closing"),
    ("It is not 8.", None, "no_answer"),
    ("So the answer is 5? Check: the product is 6.", "6", "closing"),
])
def test_extraction_rule_and_answer(completion, answer, rule):
    found = extract_answer(completion)
    assert (found.answer, found.rule) == (answer, rule)


def test_template_debris_and_think_split():
    assert strip_template("<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>user\nx") == "hi"
    parts = split_completion("<think>a $1$</think>\nb")
    assert (parts.answer, parts.reasoning) == ("\nb", "a $1$")
    assert split_completion("no think here").reasoning == ""


@pytest.mark.parametrize(("text", "prose"), [
    ("So it is 8", True), ("x^2 + 1", False), ("\\sin x + \\cos x", False),
    ("5 cm", False), ("x = 1 or x = 2", False), ("\\text{no solution}", False),
    ("sqrt(2) pi", False), ("the value", True),
])
def test_is_prose(text, prose):
    assert is_prose(text) is prose


@pytest.mark.parametrize(("text", "number"), [
    ("it is 3/4", "3/4"), ("AZ2B", None), ("x2 and y3", None), ("to 3\\frac12", "3\\frac12"),
    ("-2.5 then", "-2.5"), ("a 2,74 b", "2,74"), ("a 1,5 b", "1,5"), ("1, 5", "5"), ("\\log_2 8", "8"), ("in 1,000.", "1,000"),
])
def test_last_numeric(text, number):
    assert last_numeric(text) == number


@pytest.mark.parametrize(("phrase", "answer"), [
    ("$\\frac{1}{2}$ dollars", "\\frac{1}{2} dollars"),
    ("$\\frac12$ of the cake", "\\frac12"),
    ("34 students in all", "34"),
    ("yes", "yes"),
    ("x^2+1", "x^2+1"),
])
def test_tidy(phrase, answer):
    assert tidy(phrase) == answer


PATHOLOGICAL = {
    "unclosed \\(": "\\(" * 25_000,
    "unclosed \\[": "\\[ x " * 10_000,
    "spaces then a number": " " * 50_000 + "5",
    "GSM8K marks": "#### \n" * 10_000,
    "answer phrases": "the answer is ? " * 5_000,
    "politeness": "I hope it is correct. " * 3_000,
    "copulas": "x is " * 10_000 + "5",
    "currency": "$5 and $" * 8_000,
    "connectors": "the answer is $1$" + ", " * 20_000 + "x$2$",
}


@pytest.mark.parametrize("text", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_extraction_stays_linear_on_pathological_text(text):
    """Each of these took 4 to 40 s, or never ended, while a rule rescanned the text from
    every delimiter or stripped one layer per pass; linear work is a few tens of ms. CPU time,
    not wall clock: a loaded machine cannot fail it."""
    import time

    started = time.process_time()
    extract_answer(text)
    reference_answer(text + " so the answer")
    assert time.process_time() - started < 2.0
