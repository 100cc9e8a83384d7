"""String verifiers: exact match, regular expression, and a length budget with soft penalty.

These are deliberately simple and deterministic: they read only the completion (and the
reference where one is needed) and never call out to a parser, so they cannot hang.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Mapping

from pydantic import Field, field_validator, model_validator

from rewardd.verifiers.base import (REWARD_BOUND, InvalidReference, Outcome, RewardValue, Sample,
                            Verifier, VerifierParams)

_WS = re.compile(r"\s+")
_TRUNCATE = 200


def truncate(text: str | None, limit: int = _TRUNCATE) -> str | None:
    """Cap a string for ``detail`` so a huge completion cannot bloat every response cell."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "..."


def find_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` with balanced (nested) braces.

    Returns None when there is none, or when the last one is never closed.
    """
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
        # unclosed: try an earlier one
    return None


# --------------------------------------------------------------------------- exact_match


class ExactMatchParams(VerifierParams):
    case_sensitive: bool = False
    """Compare case-sensitively; by default both sides are case-folded."""
    normalize_whitespace: bool = True
    """Collapse runs of whitespace to one space and strip both ends."""
    strip: bool = True
    """Strip leading and trailing whitespace."""
    extract: Literal["none", "boxed", "last_line"] = "none"
    """Optional extraction from the completion before comparing: the last ``\\boxed{}`` or
    the last non-empty line. Nothing extractable compares as the empty string."""


class ExactMatchVerifier(Verifier):
    """Reward 1.0 when the (normalised) completion equals one of the reference answers."""

    name = "exact_match"
    deterministic = True
    description = ("1.0 if the completion equals the reference answer (or one of the answers) "
                   "after optional case folding, whitespace normalisation and extraction; else 0.0.")
    reference_fields = {"answer": "str: the expected answer",
                        "answers": "list[str]: alternatively, several acceptable answers"}
    Params = ExactMatchParams

    @staticmethod
    def _answers(reference: Mapping[str, Any]) -> list[str]:
        answers: list[str] = []
        if isinstance(reference.get("answer"), str):
            answers.append(reference["answer"])
        many = reference.get("answers")
        if many is not None:
            if not isinstance(many, list) or not all(isinstance(a, str) for a in many):
                raise InvalidReference("exact_match reference 'answers' must be a list of strings")
            answers.extend(many)
        if not answers:
            raise InvalidReference("exact_match needs a string 'answer' or a list 'answers' "
                                   "in the reference")
        return answers

    @staticmethod
    def _extract(completion: str, how: str) -> str:
        if how == "boxed":
            return find_last_boxed(completion) or ""
        if how == "last_line":
            lines = [ln for ln in completion.splitlines() if ln.strip()]
            return lines[-1] if lines else ""
        return completion

    @staticmethod
    def _normalise(text: str, p: ExactMatchParams) -> str:
        if p.normalize_whitespace:
            text = _WS.sub(" ", text).strip()
        elif p.strip:
            text = text.strip()
        if not p.case_sensitive:
            text = text.casefold()
        return text

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: ExactMatchParams) -> Outcome:
        answers = self._answers(reference)
        got = self._normalise(self._extract(sample.completion, params.extract), params)
        wanted = [self._normalise(a, params) for a in answers]
        matched = got in wanted
        return Outcome.success(1.0 if matched else 0.0, compared=truncate(got),
                               expected=[truncate(w) for w in wanted], matched=matched)


# --------------------------------------------------------------------------- regex

_FLAG_VALUES = {"IGNORECASE": re.IGNORECASE, "MULTILINE": re.MULTILINE, "DOTALL": re.DOTALL}

MAX_PATTERN_CHARS = 10_000
"""Longest accepted pattern. Format checks are a few hundred characters; the bound is what keeps
one request's compile short (a 5 MB pattern took 13 s of the API's CPU) and ``re``'s cache of
compiled patterns (512 entries, about 16 bytes per pattern character) under about 80 MB: a
soak of distinct 5 MB patterns grew the API by 80 MB per request until it was bounded."""


class RegexParams(VerifierParams):
    pattern: str = Field(max_length=MAX_PATTERN_CHARS)
    """Python ``re`` pattern of at most 10,000 characters; an invalid or longer one is rejected
    at validation time (HTTP 422)."""
    mode: Literal["search", "match", "fullmatch"] = "search"
    """Which ``re`` function to apply to the completion."""
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = Field(default_factory=list)
    reward_match: RewardValue = 1.0
    reward_no_match: RewardValue = 0.0

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from exc
        return value

    def compiled(self) -> re.Pattern[str]:
        flags = 0
        for name in self.flags:
            flags |= _FLAG_VALUES[name]
        return re.compile(self.pattern, flags)


class RegexVerifier(Verifier):
    """Reward ``reward_match`` when the pattern matches the completion, else ``reward_no_match``."""

    name = "regex"
    deterministic = True
    description = ("reward_match if the pattern matches the completion (search, match or "
                   "fullmatch), else reward_no_match. No reference needed.")
    reference_fields: dict[str, str] = {}
    Params = RegexParams

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: RegexParams) -> Outcome:
        regex = params.compiled()
        m = getattr(regex, params.mode)(sample.completion)
        if m is None:
            return Outcome.success(params.reward_no_match, matched=False, span=None,
                                   match=None, groups=[])
        return Outcome.success(params.reward_match, matched=True, span=[m.start(), m.end()],
                               match=truncate(m.group(0)),
                               groups=[truncate(g) for g in m.groups()])


# --------------------------------------------------------------------------- length


class LengthParams(VerifierParams):
    unit: Literal["tokens", "chars"] = "tokens"
    """``tokens`` reads ``num_tokens`` of the rollout; ``chars`` counts completion characters."""
    max_length: int = Field(gt=0)
    """Hard budget: at or above ``max_length`` the full penalty applies."""
    buffer: int = Field(default=0, ge=0)
    """Width of the soft-penalty zone just below ``max_length``; must be < max_length."""
    penalty_factor: float = Field(default=1.0, ge=0, le=REWARD_BOUND)
    """Magnitude (non-negative) of the full penalty."""

    @model_validator(mode="after")
    def _buffer_below_max(self) -> LengthParams:
        if self.buffer >= self.max_length:
            raise ValueError("buffer must be smaller than max_length")
        return self


class LengthVerifier(Verifier):
    """Overlong penalty in the style of DAPO's soft overlong punishment.

    With ``L`` the length and ``budget = max_length - buffer``::

        reward = 0                                        if L <= budget
        reward = max(-(L - budget) / buffer * penalty_factor, -penalty_factor)   otherwise

    When ``buffer == 0`` any ``L > max_length`` gives ``-penalty_factor``. The reward is
    never positive: combine it with a correctness reward.
    """

    name = "length"
    deterministic = True
    description = ("0 within max_length - buffer; a linear penalty through the buffer down to "
                   "-penalty_factor at max_length and beyond (DAPO overlong style).")
    reference_fields: dict[str, str] = {}
    Params = LengthParams

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: LengthParams) -> Outcome:
        if params.unit == "tokens":
            if sample.num_tokens is None:
                raise InvalidReference(
                    "length verifier with unit='tokens' needs num_tokens on the rollout")
            length = sample.num_tokens
        else:
            length = len(sample.completion)
        budget = params.max_length - params.buffer
        if length <= budget:
            reward = 0.0
        elif params.buffer == 0:
            reward = -params.penalty_factor
        else:
            reward = max(-(length - budget) / params.buffer * params.penalty_factor,
                         -params.penalty_factor)
        return Outcome.success(reward, length=length, unit=params.unit, budget=budget,
                               max_length=params.max_length)
