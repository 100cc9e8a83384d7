"""math-verify's own regression pairs (tests/data/math_verify_suite.jsonl, issue 31).

The set is data read from math-verify's test tables (``tests/support/math_verify_suite.py``
rebuilds it; each case names its source file, test and row). Every case must get its label:
no false positive, every positive.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rewardd.verifiers import Sample, run_verifier
from rewardd.verifiers.math import MathVerifier

PATH = Path(__file__).resolve().parents[1] / "data" / "math_verify_suite.jsonl"
CASES = [json.loads(line) for line in PATH.read_text().splitlines() if line.strip()]
MATH = MathVerifier()


def test_every_case_names_its_source_and_the_set_is_whole():
    assert len(CASES) >= 250
    assert len({c["id"] for c in CASES}) == len(CASES)
    assert all(c["source"].startswith("huggingface/Math-Verify@") and "::test_" in c["source"]
               for c in CASES)
    assert len({(c["prediction"], c["reference"]) for c in CASES}) == len(CASES)
    assert Counter(c["expected"] for c in CASES)[False] >= 30


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case):
    outcome = run_verifier(MATH, Sample(case["prediction"]), {"answer": case["reference"]},
                           case.get("params", {}))
    right = outcome.ok and outcome.reward == (1.0 if case["expected"] else 0.0)
    assert right, (case["source"], outcome.reward, outcome.detail)


@pytest.mark.parametrize(("prediction", "reference", "expected"), [
    ("$e^{i\\pi} = -1$", "-1", True),
    ("$e^{i\\pi} = 1$", "-1", False),
    ("$\\lim_{x\\to 0}\\frac{\\sin x}{x} = 1$", "1", True),
    ("$x + 1 = 5$", "5", False),  # an equation to solve, not a value stated
    ("185\\", "185", True),
    ("Area equals \\boxed{10^4} square units", "answer is 10000", True),
    ("\\boxed{3.25}", "answer is 0.25 + 3", True),
    ("<|im_start|>Answer: \\boxed{42}<|im_end|>", "42", True),
    ("<|im_start|>user\nWhat is \\boxed{42}?<|im_end|>", "42", False),
])
def test_the_issue_examples_outside_the_tables(prediction, reference, expected):
    """Issue 31's examples that math-verify's current test tables do not hold."""
    outcome = run_verifier(MATH, Sample(prediction), {"answer": reference}, {})
    assert outcome.ok and outcome.reward == (1.0 if expected else 0.0), outcome.detail
