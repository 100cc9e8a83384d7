"""exact_match, regex and length verifiers, called through run_verifier so params validate."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rewardd.verifiers import FailureKind, Sample, get_verifier, run_verifier
from rewardd.verifiers.text import (ExactMatchVerifier, LengthVerifier, RegexVerifier, find_last_boxed)

EXACT = ExactMatchVerifier()
REGEX = RegexVerifier()
LENGTH = LengthVerifier()


def test_text_verifiers_are_registered_under_their_names():
    assert isinstance(get_verifier("exact_match"), ExactMatchVerifier)
    assert isinstance(get_verifier("regex"), RegexVerifier)
    assert isinstance(get_verifier("length"), LengthVerifier)


# ----------------------------------------------------------------------------- exact_match


def test_exact_match_ignores_case_and_whitespace_by_default():
    out = run_verifier(EXACT, Sample("  Paris\n  France "), {"answer": "paris france"}, {})
    assert out.ok is True
    assert out.reward == 1.0
    assert out.detail["compared"] == "paris france"
    assert out.detail["matched"] is True


def test_exact_match_case_sensitive_rejects_different_case():
    out = run_verifier(EXACT, Sample("Paris"), {"answer": "paris"}, {"case_sensitive": True})
    assert out.reward == 0.0
    assert out.detail["compared"] == "Paris"
    assert out.detail["expected"] == ["paris"]


def test_exact_match_without_whitespace_normalisation_keeps_inner_runs_but_strips():
    params = {"normalize_whitespace": False}
    assert run_verifier(EXACT, Sample(" a  b "), {"answer": "a b"}, params).reward == 0.0
    assert run_verifier(EXACT, Sample(" a  b "), {"answer": "a  b"}, params).reward == 1.0


def test_exact_match_without_strip_or_normalisation_compares_raw_text():
    params = {"normalize_whitespace": False, "strip": False}
    assert run_verifier(EXACT, Sample(" yes"), {"answer": "yes"}, params).reward == 0.0
    assert run_verifier(EXACT, Sample(" yes"), {"answer": " yes"}, params).reward == 1.0


def test_exact_match_accepts_any_of_the_answers_list():
    ref = {"answers": ["NYC", "New York City"]}
    assert run_verifier(EXACT, Sample("new york city"), ref, {}).reward == 1.0
    assert run_verifier(EXACT, Sample("nyc"), ref, {}).reward == 1.0
    assert run_verifier(EXACT, Sample("Boston"), ref, {}).reward == 0.0


def test_exact_match_combines_answer_and_answers():
    ref = {"answer": "a", "answers": ["b"]}
    assert run_verifier(EXACT, Sample("b"), ref, {}).reward == 1.0
    assert run_verifier(EXACT, Sample("a"), ref, {}).detail["expected"] == ["a", "b"]


def test_exact_match_boxed_extraction_compares_last_boxed_content():
    sample = Sample("first \\boxed{1} then \\boxed{{x}+1}")
    out = run_verifier(EXACT, sample, {"answer": "{x}+1"}, {"extract": "boxed"})
    assert out.reward == 1.0
    assert out.detail["compared"] == "{x}+1"


def test_exact_match_last_line_extraction_skips_trailing_blank_lines():
    sample = Sample("reasoning...\nmore\nFinal\n\n  \n")
    out = run_verifier(EXACT, sample, {"answer": "final"}, {"extract": "last_line"})
    assert out.reward == 1.0


def test_exact_match_boxed_extraction_without_box_compares_empty_string():
    out = run_verifier(EXACT, Sample("no box"), {"answer": "no box"}, {"extract": "boxed"})
    assert out.reward == 0.0
    assert out.detail["compared"] == ""


def test_exact_match_missing_answer_is_invalid_reference():
    out = run_verifier(EXACT, Sample("x"), {}, {})
    assert out.ok is False
    assert out.error is FailureKind.invalid_reference
    assert out.reward is None


def test_exact_match_non_string_answers_is_invalid_reference():
    out = run_verifier(EXACT, Sample("x"), {"answers": ["a", 3]}, {})
    assert out.error is FailureKind.invalid_reference


def test_exact_match_unknown_param_is_error_from_validation():
    out = run_verifier(EXACT, Sample("x"), {"answer": "x"}, {"casesensitive": True})
    assert out.ok is False
    assert out.error is FailureKind.error
    assert out.detail["exception"] == "ValidationError"


def test_find_last_boxed_handles_nesting_fbox_and_unclosed():
    assert find_last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert find_last_boxed("\\boxed{1} \\fbox{2}") == "2"
    assert find_last_boxed("\\boxed{1} \\boxed{2") == "1"
    assert find_last_boxed("nothing") is None


# ----------------------------------------------------------------------------- regex


def test_regex_search_finds_pattern_anywhere_and_reports_span_and_groups():
    out = run_verifier(REGEX, Sample("the code is 4521 ok"), {}, {"pattern": r"code is (\d+)"})
    assert out.ok is True
    assert out.reward == 1.0
    assert out.detail["span"] == [4, 16]
    assert out.detail["match"] == "code is 4521"
    assert out.detail["groups"] == ["4521"]


def test_regex_match_mode_anchors_at_start_only():
    params = {"pattern": r"\d+", "mode": "match"}
    assert run_verifier(REGEX, Sample("12 apples"), {}, params).reward == 1.0
    assert run_verifier(REGEX, Sample("apples 12"), {}, params).reward == 0.0


def test_regex_fullmatch_mode_requires_whole_completion():
    params = {"pattern": r"\d+", "mode": "fullmatch"}
    assert run_verifier(REGEX, Sample("123"), {}, params).reward == 1.0
    assert run_verifier(REGEX, Sample("123 "), {}, params).reward == 0.0


def test_regex_ignorecase_flag():
    assert run_verifier(REGEX, Sample("YES"), {}, {"pattern": "yes"}).reward == 0.0
    out = run_verifier(REGEX, Sample("YES"), {}, {"pattern": "yes", "flags": ["IGNORECASE"]})
    assert out.reward == 1.0


def test_regex_multiline_and_dotall_flags():
    text = "line one\nanswer: B\nend"
    assert run_verifier(REGEX, Sample(text), {}, {"pattern": "^answer", "mode": "search"}
                        ).reward == 0.0
    assert run_verifier(REGEX, Sample(text), {}, {"pattern": "^answer",
                                                  "flags": ["MULTILINE"]}).reward == 1.0
    assert run_verifier(REGEX, Sample(text), {}, {"pattern": "one.answer"}).reward == 0.0
    assert run_verifier(REGEX, Sample(text), {}, {"pattern": "one.answer",
                                                  "flags": ["DOTALL"]}).reward == 1.0


def test_regex_custom_rewards_for_match_and_no_match():
    params = {"pattern": "bad word", "reward_match": -1.0, "reward_no_match": 0.5}
    assert run_verifier(REGEX, Sample("a bad word"), {}, params).reward == -1.0
    out = run_verifier(REGEX, Sample("fine"), {}, params)
    assert out.reward == 0.5
    assert out.detail == {"matched": False, "span": None, "match": None, "groups": []}


def test_regex_truncates_long_match_text_to_200_chars():
    out = run_verifier(REGEX, Sample("a" * 500), {}, {"pattern": "(a+)"})
    assert out.detail["match"] == "a" * 200 + "..."
    assert out.detail["groups"] == ["a" * 200 + "..."]
    assert out.detail["span"] == [0, 500]


def test_regex_unmatched_optional_group_is_none():
    out = run_verifier(REGEX, Sample("x"), {}, {"pattern": "(x)(y)?"})
    assert out.detail["groups"] == ["x", None]


def test_regex_invalid_pattern_is_a_params_validation_error():
    with pytest.raises(ValidationError) as info:
        RegexVerifier.Params.model_validate({"pattern": "(unclosed"})
    assert info.value.errors()[0]["loc"] == ("pattern",)


def test_regex_pattern_over_10000_characters_is_refused_before_it_is_compiled() -> None:
    longest = "a" * 10_000
    assert RegexVerifier.Params.model_validate({"pattern": longest}).pattern == longest
    with pytest.raises(ValidationError) as info:
        RegexVerifier.Params.model_validate({"pattern": "(" + "a" * 10_000 + ")"})
    error = info.value.errors()[0]
    assert error["loc"] == ("pattern",) and error["type"] == "string_too_long"
    assert error["ctx"] == {"max_length": 10_000}  # the length rule runs before the compile


def test_regex_missing_pattern_and_unknown_flag_are_validation_errors():
    with pytest.raises(ValidationError):
        RegexVerifier.Params.model_validate({})
    with pytest.raises(ValidationError):
        RegexVerifier.Params.model_validate({"pattern": "a", "flags": ["VERBOSE"]})


# ----------------------------------------------------------------------------- length


@pytest.mark.parametrize(("num_tokens", "reward"), [
    (50, 0.0),
    (80, 0.0),      # exactly at budget = max_length - buffer
    (81, -0.05),    # -(81 - 80) / 20
    (90, -0.5),     # -(90 - 80) / 20
    (100, -1.0),    # at max_length: the full penalty
    (130, -1.0),    # beyond: clipped at -penalty_factor
])
def test_length_tokens_soft_penalty_through_buffer(num_tokens, reward):
    out = run_verifier(LENGTH, Sample("x", num_tokens=num_tokens), {},
                       {"max_length": 100, "buffer": 20})
    assert out.ok is True
    assert out.reward == pytest.approx(reward)
    assert out.detail == {"length": num_tokens, "unit": "tokens", "budget": 80,
                          "max_length": 100}


def test_length_penalty_factor_scales_and_clips():
    params = {"max_length": 100, "buffer": 20, "penalty_factor": 0.5}
    assert run_verifier(LENGTH, Sample("x", num_tokens=90), {}, params).reward == -0.25
    assert run_verifier(LENGTH, Sample("x", num_tokens=500), {}, params).reward == -0.5


def test_length_zero_buffer_is_a_hard_cliff():
    params = {"max_length": 10}
    assert run_verifier(LENGTH, Sample("x", num_tokens=10), {}, params).reward == 0.0
    assert run_verifier(LENGTH, Sample("x", num_tokens=11), {}, params).reward == -1.0


def test_length_chars_unit_counts_completion_characters():
    params = {"unit": "chars", "max_length": 10, "buffer": 4}
    out = run_verifier(LENGTH, Sample("abcdefgh"), {}, params)  # 8 chars, budget 6
    assert out.reward == -0.5
    assert out.detail["length"] == 8
    assert out.detail["unit"] == "chars"
    assert run_verifier(LENGTH, Sample("abcdef", num_tokens=999), {}, params).reward == 0.0


def test_length_tokens_without_num_tokens_is_invalid_reference():
    out = run_verifier(LENGTH, Sample("abc"), {}, {"max_length": 100})
    assert out.ok is False
    assert out.error is FailureKind.invalid_reference
    assert out.detail["message"] == ("length verifier with unit='tokens' needs num_tokens "
                                     "on the rollout")


@pytest.mark.parametrize("params", [
    {},
    {"max_length": 0},
    {"max_length": 10, "buffer": -1},
    {"max_length": 10, "buffer": 10},
    {"max_length": 10, "penalty_factor": -1.0},
    {"max_length": 10, "unit": "words"},
])
def test_length_bad_params_are_validation_errors(params):
    with pytest.raises(ValidationError):
        LengthVerifier.Params.model_validate(params)
