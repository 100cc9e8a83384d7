"""The labelled math set (tests/data/math_cases.jsonl): every case must get its label.

The set was written for this project from the conventions in verifiers/math/__init__.py
before the verifier was run on it; tests/benchmarks/bench_math.py scores math-verify on the
same file. A case that fails here is a verifier bug or a mislabelled case, never a flake.
math_heldout.jsonl holds cases written after the verifier passed the main set, as a check
that the rules generalise rather than fit the set.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rewardd.verifiers import Sample, run_verifier
from rewardd.verifiers.math import MathVerifier

CASES_PATH = Path(__file__).resolve().parents[1] / "data" / "math_cases.jsonl"
CASES = [json.loads(line) for line in CASES_PATH.read_text().splitlines() if line.strip()]
HELDOUT_PATH = CASES_PATH.with_name("math_heldout.jsonl")
HELDOUT = [json.loads(line) for line in HELDOUT_PATH.read_text().splitlines() if line.strip()]
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


@pytest.mark.parametrize("case", CASES + HELDOUT, ids=[c["id"] for c in CASES + HELDOUT])
def test_case(case):
    outcome = run_verifier(MATH, Sample(case["prediction"]), {"answer": case["reference"]},
                           case.get("params", {}))
    assert outcome.ok, outcome.detail
    assert outcome.reward == (1.0 if case["expected"] else 0.0), (case.get("note"),
                                                                  outcome.detail)


def test_adversarial_cases_through_the_embedded_executor_keep_their_labels_and_limits():
    """The production path: each adversarial case as a one-sample call on real workers, with
    a 5 s limit per check. None may hang, crash or time out, and each gets its label."""
    import asyncio
    import time

    from rewardd.workers.embedded import EmbeddedExecutor
    from rewardd.workers.executor import VerifyCall

    adversarial = [c for c in CASES if c["class"] == "adversarial"]
    calls = [VerifyCall("math", (Sample(c["prediction"]),), {"answer": c["reference"]},
                        c.get("params", {}), 5.0) for c in adversarial]
    executor = EmbeddedExecutor(2)
    try:
        assert asyncio.run(executor.ready(wait_s=120.0))
        started = time.perf_counter()
        results = asyncio.run(executor.run(calls))
        elapsed = time.perf_counter() - started
    finally:
        executor.close()
    for case, result in zip(adversarial, results):
        [item] = result.items
        assert item.outcome.ok, (case["id"], item.outcome.detail)
        assert item.outcome.reward == float(case["expected"]), case["id"]
        assert item.elapsed_s < 5.0, case["id"]
    assert elapsed < 5.0 * len(calls) / 2  # loose: no call came near its limit


def test_a_slow_check_is_interrupted_at_its_limit():
    """100 nested fractions take the LaTeX grammar about a second: with a 0.2 s limit the
    check becomes a typed timeout well before that, and the worker keeps serving."""
    import asyncio
    import time

    from rewardd.verifiers import FailureKind
    from rewardd.workers.embedded import EmbeddedExecutor
    from rewardd.workers.executor import VerifyCall

    nested = next(c for c in CASES if c["id"] == "adv-023")
    slow = VerifyCall("math", (Sample(nested["prediction"]),), {"answer": "2"}, {}, 0.2)
    fast = VerifyCall("math", (Sample("\\boxed{2}"),), {"answer": "2"}, {}, 0.2)
    executor = EmbeddedExecutor(1)
    try:
        assert asyncio.run(executor.ready(wait_s=120.0))
        started = time.perf_counter()
        [result] = asyncio.run(executor.run([slow]))
        elapsed = time.perf_counter() - started
        [after] = asyncio.run(executor.run([fast]))
    finally:
        executor.close()
    assert result.items[0].outcome.error is FailureKind.timeout
    assert elapsed < 0.2 + 0.5  # limit plus IPC slack, far below the 1 s parse
    assert after.items[0].outcome.reward == 1.0
