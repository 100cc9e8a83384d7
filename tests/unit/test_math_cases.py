"""The labelled math set (tests/data/math_cases.jsonl): every case must get its label.

The set was written for this project from the conventions in verifiers/math/__init__.py
before the verifier was run on it; tests/benchmarks/bench_math.py scores math-verify on the
same file. A case that fails here is a verifier bug or a mislabelled case, never a flake.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from verifiers import Sample, run_verifier
from verifiers.math import MathVerifier

CASES_PATH = Path(__file__).resolve().parents[1] / "data" / "math_cases.jsonl"
CASES = [json.loads(line) for line in CASES_PATH.read_text().splitlines() if line.strip()]
MATH = MathVerifier()

REQUIRED_CLASSES = {
    "integer", "decimal", "fraction", "mixed_number", "scientific", "thousands", "rounding",
    "percent", "expression", "constants", "equation", "inequality", "set", "interval", "tuple",
    "matrix", "units", "degrees", "text", "multiple_choice", "multiple_answers", "extraction",
    "near_miss", "known_false_positive", "adversarial", "strict_mode",
}


def test_the_set_is_large_and_covers_every_class():
    assert len(CASES) >= 500
    assert len({c["id"] for c in CASES}) == len(CASES)
    counts = Counter(c["class"] for c in CASES)
    assert REQUIRED_CLASSES <= set(counts), REQUIRED_CLASSES - set(counts)
    assert all(counts[name] >= 15 for name in REQUIRED_CLASSES), counts
    assert all(isinstance(c["expected"], bool) for c in CASES)
    assert all(not c["expected"] for c in CASES if c["class"] == "known_false_positive")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case):
    outcome = run_verifier(MATH, Sample(case["prediction"]), {"answer": case["reference"]},
                           case.get("params", {}))
    assert outcome.ok, outcome.detail
    assert outcome.reward == (1.0 if case["expected"] else 0.0), (case.get("note"),
                                                                  outcome.detail)
