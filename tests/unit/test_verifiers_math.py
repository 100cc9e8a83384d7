"""The math verifier: extraction order, equivalence rules, failures, thread safety.

The labelled set in tests/data/math_cases.jsonl is checked in test_math_cases.py; this file
pins the extraction rules, the detail fields and the parameters."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError

from rewardd.verifiers import FailureKind, Outcome, Sample, get_verifier, run_verifier
from rewardd.verifiers.math import MathVerifier
from rewardd.verifiers.math.extract import clean_answer, extract_answer

MATH = MathVerifier()


def check(completion: str, answer: object, params: dict | None = None) -> Outcome:
    reference = {} if answer is None else {"answer": answer}
    return run_verifier(MATH, Sample(completion), reference, params or {})


CASES = [
    # (id, completion, reference answer, params, reward, rule, extracted)
    ("boxed_decimal_vs_frac", "so \\boxed{0.5}", "\\frac{1}{2}", {}, 1.0, "boxed", "0.5"),
    ("boxed_nested_braces", "thus \\boxed{\\frac{1}{2}}.", "0.5", {}, 1.0, "boxed",
     "\\frac{1}{2}"),
    ("fbox", "result: \\fbox{7}", "7", {}, 1.0, "boxed", "7"),
    ("last_boxed_wins", "\\boxed{3} no wait \\boxed{4}", "4", {}, 1.0, "boxed", "4"),
    ("boxed_beats_answer_is", "The answer is 5. \\boxed{6}", "6", {}, 1.0, "boxed", "6"),
    ("boxed_dfrac_reference", "\\boxed{9/7}", "\\dfrac{9}{7}", {}, 1.0, "boxed", "9/7"),
    ("boxed_wrong", "\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", {}, 0.0, "boxed", "\\frac{1}{3}"),
    ("answer_is_integer", "The answer is 42.", "42", {}, 1.0, "final_answer_is", "42"),
    ("final_answer_is_dollars", "So the final answer is $\\frac{3}{4}$. Done.", "0.75", {},
     1.0, "final_answer_is", "\\frac{3}{4}"),
    ("answer_is_case_insensitive", "THE ANSWER IS 12", "12", {}, 1.0, "final_answer_is",
     "12"),
    ("answer_is_keeps_decimal_point", "the answer is 3.25.", "13/4", {}, 1.0,
     "final_answer_is", "3.25"),
    ("answer_is_colon", "The final answer is: 8\nthanks", "8", {}, 1.0, "final_answer_is",
     "8"),
    ("answer_is_equation", "The final answer is $x = 3$.", "3", {}, 1.0, "final_answer_is",
     "x = 3"),
    ("answer_line_fraction", "work...\nAnswer: 3/4", "\\dfrac{3}{4}", {}, 1.0, "answer_line",
     "3/4"),
    ("answer_line_bold", "work\n**Answer:** $\\frac{2}{3}$", "2/3", {}, 1.0, "answer_line",
     "\\frac{2}{3}"),
    ("answer_line_wrong", "Answer: 5", "6", {}, 0.0, "answer_line", "5"),
    ("dollar_sqrt", "we get $\\sqrt{2}/2$", "\\frac{\\sqrt{2}}{2}", {}, 1.0, "dollar",
     "\\sqrt{2}/2"),
    ("last_dollar_span_wins", "with $x=1$ we get $2\\pi$", "2\\pi", {}, 1.0, "dollar",
     "2\\pi"),
    ("display_dollars", "Hence\n$$\\frac{10}{4}$$", "2.5", {}, 1.0, "dollar",
     "\\frac{10}{4}"),
    ("last_number", "I computed 3 then 17 apples", "17", {}, 1.0, "last_number", "17"),
    ("last_number_negative", "it drops to -4 degrees", "-4", {}, 1.0, "last_number", "-4"),
    ("last_number_thousands", "a total of 1,234 apples", "1234", {}, 1.0, "last_number",
     "1234"),
    ("last_number_decimal", "roughly 0.333333 each", "\\frac{1}{3}", {}, 1.0, "last_number",
     "0.333333"),
    ("last_number_wrong", "maybe 9", "10", {}, 0.0, "last_number", "9"),
    ("polynomial_expanded_vs_factored", "$x^2+2x+1$", "(x+1)^2", {}, 1.0, "dollar",
     "x^2+2x+1"),
    ("pi_symbolic", "\\boxed{\\pi}", "\\pi", {}, 1.0, "boxed", "\\pi"),
    ("set_answer", "\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", {}, 1.0, "boxed", "\\{1, 2\\}"),
    ("wrong_variable", "\\boxed{y+1}", "x+1", {}, 0.0, "boxed", "y+1"),
    ("wrong_variable_strict", "\\boxed{y+1}", "x+1", {"mode": "strict"}, 0.0, "boxed", "y+1"),
    ("assignment_lenient", "\\boxed{x=3}", "3", {}, 1.0, "boxed", "x=3"),
    ("assignment_strict", "\\boxed{x=3}", "3", {"mode": "strict"}, 0.0, "boxed", "x=3"),
    ("bare_equation", "3x+4y+14=0", "3x+4y+14=0", {}, 1.0, "bare", "3x+4y+14=0"),
    ("choice_letter", "I pick (B) because...", "(B)", {}, 1.0, "no_answer", None),
    ("choice_letter_boxed", "\\boxed{\\text{(D)}}", "D", {}, 1.0, "boxed", "\\text{(D)}"),
    ("choice_value_not_letter", "\\boxed{42}", "C", {}, 0.0, "boxed", "42"),
    ("boxed_all", "\\boxed{3} and \\boxed{-1}", "-1, 3", {"boxed": "all"}, 1.0, "boxed_all",
     "3, -1"),
    ("reference_with_dollars", "\\boxed{5}", "$5$", {}, 1.0, "boxed", "5"),
    ("no_answer", "I am not sure.", "3", {}, 0.0, "no_answer", None),
    ("empty_completion", "", "3", {}, 0.0, "no_answer", None),
    ("extract_boxed_only_ignores_other_rules", "The answer is 3.", "3", {"extract": "boxed"},
     0.0, "no_answer", None),
    ("extract_boxed_only_finds_box", "\\boxed{3}", "3", {"extract": "boxed"}, 1.0, "boxed",
     "3"),
    ("extract_none_whole_polynomial", "x^2+2x+1", "(x+1)^2", {"extract": "none"}, 1.0,
     "whole", "x^2+2x+1"),
    ("extract_none_whole_latex", "  \\frac{1}{2}  ", "0.5", {"extract": "none"}, 1.0, "whole",
     "\\frac{1}{2}"),
    ("extract_none_empty", "   ", "1", {"extract": "none"}, 0.0, "no_answer", None),
]


@pytest.mark.parametrize(("completion", "answer", "params", "reward", "rule", "extracted"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_math_case_table(completion, answer, params, reward, rule, extracted):
    out = check(completion, answer, params)
    assert out.ok is True, out.detail
    assert out.reward == reward, out.detail
    assert out.detail["rule"] == rule
    assert out.detail["extracted"] == extracted
    assert out.detail["decided_by"] is not None or out.detail["rule"] == "no_answer"


def test_math_is_registered_as_math():
    assert isinstance(get_verifier("math"), MathVerifier)


def test_math_detail_has_parsed_forms():
    out = check("\\boxed{0.5}", "\\frac{1}{2}")
    assert out.detail == {"extracted": "0.5", "rule": "boxed", "parsed_prediction": "1/2",
                          "parsed_reference": "1/2", "decided_by": "exact",
                          "extraction": "standard"}


@pytest.mark.parametrize(("completion", "answer", "params", "decided_by"), [
    ("\\boxed{3.142}", "\\pi", {}, "rounding"),
    ("\\boxed{2.5000000001}", "2.5", {}, "tolerance"),
    ("\\boxed{\\ln 8}", "3\\ln 2", {}, "numeric"),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", {}, "identity"),
    ("\\boxed{2x-y+1=0}", "y=2x+1", {}, "relation"),
    ("\\boxed{x=5}", "5", {}, "assignment"),
    ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", {}, "set"),
    ("\\boxed{[0,1)}", "[0,1)", {}, "interval"),
    ("\\boxed{2^{2^{2^{2^{2^{2}}}}}}", "2^{2^{2^{2^{2^{2}}}}}", {}, "size_guard"),
])
def test_math_detail_names_the_deciding_rule(completion, answer, params, decided_by):
    out = check(completion, answer, params)
    assert (out.reward, out.detail["decided_by"]) == (1.0, decided_by), out.detail


def test_math_no_answer_is_reward_zero_not_failure():
    out = check("no idea", "3")
    assert out.ok is True
    assert out.error is None
    assert out.reward == 0.0
    assert out.detail["parsed_prediction"] is None
    assert out.detail["parsed_reference"] == "3"


def test_math_unparseable_prediction_is_reward_zero_with_rule():
    out = check("\\boxed{)(}", "1")
    assert out.ok is True
    assert out.reward == 0.0
    assert out.detail["rule"] == "unparseable_prediction"
    assert out.detail["extraction_rule"] == "boxed"
    assert out.detail["extracted"] == ")("
    assert out.detail["parsed_prediction"] is None


@pytest.mark.parametrize("reference", [None, "", "   ", True, ["1"]],
                         ids=["missing", "empty", "blank", "bool", "list"])
def test_math_missing_or_non_string_reference_is_invalid_reference(reference):
    out = check("\\boxed{1}", reference)
    assert out.ok is False
    assert out.reward is None
    assert out.error is FailureKind.invalid_reference


@pytest.mark.parametrize(("reference", "completion"), [(42, "\\boxed{42}"), (0.5, "\\boxed{1/2}")])
def test_math_numeric_json_reference_is_accepted(reference, completion):
    out = check(completion, reference)
    assert out.ok is True
    assert out.reward == 1.0


def test_math_unparseable_reference_is_invalid_reference():
    out = check("\\boxed{1}", "\\frac{1}{")
    assert out.ok is False
    assert out.error is FailureKind.invalid_reference
    assert "could not parse the reference" in out.detail["message"]


def test_math_long_parsed_forms_are_truncated_to_200_chars():
    big = "+".join(f"x_{{{i}}}" for i in range(40))
    out = check(f"\\boxed{{{big}}}", big)
    assert out.reward == 1.0
    assert len(out.detail["parsed_reference"]) == 203
    assert out.detail["parsed_reference"].endswith("...")
    assert len(out.detail["extracted"]) == 200


def test_math_params_reject_unknown_and_bad_values():
    with pytest.raises(ValidationError):
        MathVerifier.Params.model_validate({"extract": "last"})
    with pytest.raises(ValidationError):
        MathVerifier.Params.model_validate({"timeout": 3})
    with pytest.raises(ValidationError):
        MathVerifier.Params.model_validate({"min_rounding_digits": 0})
    with pytest.raises(ValidationError):
        MathVerifier.Params.model_validate({"mode": "loose"})


def test_math_min_rounding_digits_controls_rounding_acceptance():
    assert check("\\boxed{0.33}", "\\frac{1}{3}").reward == 0.0
    assert check("\\boxed{0.33}", "\\frac{1}{3}", {"min_rounding_digits": 2}).reward == 1.0
    assert check("\\boxed{0.3333}", "\\frac{1}{3}").reward == 1.0
    assert check("\\boxed{0.3333}", "\\frac{1}{3}", {"mode": "strict"}).reward == 0.0


@pytest.mark.parametrize(("percent", "fifty_is_half", "fifty_is_fifty"),
                         [("either", True, True), ("fraction", True, False),
                          ("number", False, True)])
def test_math_percent_modes(percent, fifty_is_half, fifty_is_fifty):
    params = {"percent": percent}
    assert check("\\boxed{50\\%}", "0.5", params).reward == float(fifty_is_half)
    assert check("\\boxed{50\\%}", "50", params).reward == float(fifty_is_fifty)


def test_math_rel_tol_is_relative_not_absolute():
    assert check("\\boxed{1.0000001e-20}", "1e-20").reward == 0.0
    assert check("\\boxed{1.0000001e-20}", "1e-20", {"rel_tol": 1e-6}).reward == 1.0
    assert check("\\boxed{0.0001}", "0.0002", {"rel_tol": 1e-6}).reward == 0.0


def test_math_verdicts_are_cached_per_process_and_clearable():
    from rewardd.verifiers.math import clear_caches
    from rewardd.verifiers.math.verifier import _parsed, _verdict

    clear_caches()
    for _ in range(16):
        assert check("so \\boxed{\\frac{2}{4}}", "\\sqrt{1/4}").reward == 1.0
    assert _verdict.cache_info().misses == 1
    assert _verdict.cache_info().hits == 15
    assert _parsed.cache_info().misses == 2  # the reference and the one distinct answer
    clear_caches()
    assert _verdict.cache_info().currsize == 0


def test_math_works_in_a_non_main_thread():
    results: list[Outcome] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(check("so \\boxed{\\frac{\\sqrt{2}}{2}}", "\\sqrt{2}/2"))
            results.append(check("The answer is 41.", "42"))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert errors == []
    assert [(r.ok, r.reward) for r in results] == [(True, 1.0), (True, 0.0)]
    assert results[0].detail["rule"] == "boxed"


@pytest.mark.parametrize(("text", "cleaned"), [
    ("  42. ", "42"),
    ("$\\frac{1}{2}$.", "\\frac{1}{2}"),
    ("**$7$**", "7"),
    ("\\(x+1\\)", "x+1"),
    ("$$3$$", "3"),
    ("$a$ and $b$", "$a$ and $b$"),
])
def test_clean_answer_strips_wrappers(text, cleaned):
    assert clean_answer(text) == cleaned


def test_extract_answer_unclosed_box_falls_through_to_next_rule():
    found = extract_answer("\\boxed{3 and the answer is 4")
    assert (found.answer, found.rule) == ("4", "final_answer_is")


def test_extract_answer_ignores_escaped_dollars():
    found = extract_answer("it costs \\$5 and \\$6")
    assert (found.answer, found.rule) == ("6", "last_number")


@pytest.mark.parametrize("completion, answer", [
    ("10 20", "30"), ("\\boxed{1 2}", "3"), ("\\boxed{1\\,2}", "3"), ("\\boxed{x = 2 3}", "5"),
    ("\\boxed{(1 2)}", "3")])
def test_math_numbers_side_by_side_are_not_a_sum(completion: str, answer: str) -> None:
    """latex2sympy2_extended reads ``1 2`` as the mixed number 1 + 2; a completion "10 20"
    must not earn the reward of an answer 30 (found through TRL's GRPOTrainer)."""
    assert check(completion, answer).reward == 0.0


@pytest.mark.parametrize("completion, answer", [
    ("\\boxed{1\\,000}", "1000"), ("\\boxed{1 000}", "1000"), ("\\boxed{3 1/2}", "7/2"),
    ("\\boxed{3 \\frac{1}{2}}", "7/2"), ("\\boxed{2 \\pi}", "2\\pi"), ("\\boxed{1 + 2}", "3")])
def test_math_thousands_mixed_numbers_and_products_still_parse(completion: str,
                                                               answer: str) -> None:
    assert check(completion, answer).reward == 1.0
