"""critique: verdicts in Critique-Coder's and boxed formats and a custom pattern, agreement with
the reference label, the documented unparseable rule, typed reference failures, params."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import FailureKind, Sample, run_verifier
from rewardd.verifiers.critique import CritiqueParams

CRITIQUE_WRONG = """The solution sorts the array and returns `a[n // 2]` as the median.

1. For odd n this is the middle element, which is correct.
2. For even n the median is the mean of the two middle elements, but the code returns the
   upper one: for [1, 2, 3, 4] it returns 3 instead of 2.5.

Conclusion: wrong"""

CRITIQUE_RIGHT_BOLD = """Let me check the loop bounds: `range(1, n + 1)` covers every term,
and the accumulator starts at 0, so the sum is right for n = 0 as well.

**Conclusion: Right**"""


def critique(completion: str, label: Any, **params: Any) -> Any:
    return run_verifier(REGISTRY["critique"], Sample(completion), {"label": label}, params)


@pytest.mark.parametrize("completion,verdict", [
    (CRITIQUE_WRONG, False),
    (CRITIQUE_RIGHT_BOLD, True),
    ("The proof holds.\n\nConclusion: correct.", True),
    ("**Conclusion:** incorrect", False),
    ("Final judgement: \\boxed{True}", True),
    ("\\boxed{\\text{False}}", False),
    ("<think>Conclusion: right? Let me look again... no.</think>\nConclusion: wrong", False),
])
def test_verdict_formats_are_read(completion: str, verdict: bool) -> None:
    out = critique(completion, verdict)
    assert out.ok and out.reward == 1.0 and out.detail["verdict"] is verdict
    assert critique(completion, not verdict).reward == 0.0


@pytest.mark.parametrize("label,truth", [(True, True), (False, False), ("right", True),
                                         ("Wrong", False), ("correct", True),
                                         ("incorrect", False), ("yes", True), ("no", False)])
def test_labels_in_every_spelling(label: Any, truth: bool) -> None:
    out = critique("Conclusion: right", label)
    assert out.reward == (1.0 if truth else 0.0) and out.detail["label"] is truth


def test_no_verdict_is_the_documented_unparseable_reward_not_a_failure() -> None:
    out = critique("The solution looks mostly fine to me.", True)
    assert out.ok and out.reward == 0.0 and out.detail["rule"] == "no_verdict"
    penalised = critique("The solution looks mostly fine to me.", True, reward_unparseable=-1)
    assert penalised.reward == -1.0


def test_contradicting_verdicts_are_unparseable_never_the_benefit_of_the_doubt() -> None:
    hedge = "Conclusion: right\n\nOn second thought, \\boxed{False}"
    for label in (True, False):
        out = critique(hedge, label)
        assert out.reward == 0.0 and out.detail["rule"] == "contradicting"
    agreeing = "Conclusion: wrong\n\\boxed{false}"
    assert critique(agreeing, False).reward == 1.0


def test_a_verdict_inside_the_reasoning_does_not_count() -> None:
    out = critique("<think>Conclusion: right</think>I am not sure.", True)
    assert out.reward == 0.0 and out.detail["rule"] == "no_verdict"


def test_custom_pattern_and_rewards() -> None:
    params = {"formats": [], "pattern": r"VERDICT\s*=\s*(?P<verdict>\w+)",
              "reward_agree": 2, "reward_disagree": -1}
    assert critique("VERDICT = yes", True, **params).reward == 2.0
    assert critique("VERDICT = no", True, **params).reward == -1.0
    # the built-in formats are off: a Conclusion line is not read
    assert critique("Conclusion: right", True, **params).detail["rule"] == "no_verdict"
    # a word outside the vocabulary is no verdict
    assert critique("VERDICT = maybe", True, **params).detail["rule"] == "no_verdict"
    strict = critique("verdict = yes", True, **params, ignore_case=False)
    assert strict.detail["rule"] == "no_verdict"


@pytest.mark.parametrize("reference,field", [
    ({}, "reference.label: Field required"),
    ({"label": "maybe"}, "reference.label: 'maybe' is not a label"),
    ({"label": 1.5}, "reference.label"),
])
def test_bad_labels_are_invalid_reference(reference: dict[str, Any], field: str) -> None:
    out = run_verifier(REGISTRY["critique"], Sample("Conclusion: right"), reference, {})
    assert out.error is FailureKind.invalid_reference and field in out.detail["message"]


@pytest.mark.parametrize("params,loc", [
    ({"pattern": "(?P<other>x)"}, ("pattern",)),
    ({"pattern": "("}, ("pattern",)),
    ({"formats": ["latex"]}, ("formats", 0)),
    ({"formats": []}, ()),
    ({"reward_agree": float("inf")}, ("reward_agree",)),
])
def test_bad_params_name_the_field(params: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        CritiqueParams.model_validate(params)
    assert info.value.errors()[0]["loc"] == loc
