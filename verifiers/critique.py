"""``critique``: the completion judges a given solution; the reward is agreement with the label.

Critique-Coder and critique fine-tuning train a model to say whether a solution is right. The
group's reference carries the truth, ``{"label": true}`` (the solution is correct; ``"right"``,
``"wrong"``, ``"correct"``, ``"incorrect"``, ``"yes"``, ``"no"`` are read too), and the
completion's verdict is read from, by default, both formats:

* ``conclusion``: ``Conclusion: right`` / ``Conclusion: wrong`` (also correct/incorrect,
  true/false, yes/no; Markdown bold around it allowed), as Critique-Coder prompts for;
* ``boxed``: ``\\boxed{True}`` / ``\\boxed{False}`` (or any of the words above);

or from a request's own ``pattern``, a regular expression with a named group ``verdict``
whose text is one of the words above.

Only the answer part counts (after the last ``</think>``). Every verdict found there must
agree: a completion that says both ``Conclusion: right`` and ``\\boxed{False}`` has hedged,
and gets the unparseable reward like one that says nothing, never the benefit of the doubt.

A completion without a readable verdict is a **format failure of the model, not a failure of
the verifier**: it gets ``reward_unparseable`` (default 0.0, set it negative for a format
penalty) with ``detail.rule`` saying why (``no_verdict`` or ``contradicting``), as the math
verifier gives 0 for a completion without an answer. The cell is a typed failure only when the
verifier cannot judge at all: a missing or unreadable label is ``invalid_reference``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Mapping

from pydantic import Field, field_validator, model_validator

from rewardd.verifiers.base import Outcome, RewardValue, Sample, Verifier, VerifierParams
from rewardd.verifiers.judge.templates import check_pattern
from rewardd.verifiers.references import ReferenceModel, ReferenceShaped
from rewardd.verifiers.structured_parse import answer_part
from rewardd.verifiers.text import truncate

POSITIVE = frozenset({"right", "correct", "true", "yes"})
NEGATIVE = frozenset({"wrong", "incorrect", "false", "no"})
_WORD = r"(?P<verdict>right|wrong|correct|incorrect|true|false|yes|no)"
FORMATS: dict[str, re.Pattern[str]] = {
    "conclusion": re.compile(r"\bconclusion\s*\**\s*[:：]\s*\**\s*" + _WORD + r"\b",
                             re.IGNORECASE),
    "boxed": re.compile(r"\\boxed\s*\{\s*(?:\\text\{\s*)?" + _WORD + r"\s*\}?\s*\}",
                        re.IGNORECASE),
}


def as_label(value: str | bool) -> bool | None:
    """True (correct), False (wrong), or None for a word that is neither."""
    if isinstance(value, bool):
        return value
    word = value.strip().strip("*.").lower()
    return True if word in POSITIVE else False if word in NEGATIVE else None


class CritiqueReference(ReferenceModel):
    label: bool | str
    """Whether the solution being critiqued is correct."""

    @field_validator("label")
    @classmethod
    def _known(cls, value: bool | str) -> bool:
        label = as_label(value)
        if label is None:
            raise ValueError(f"{value!r} is not a label: true/false, right/wrong, "
                             "correct/incorrect or yes/no")
        return label


class CritiqueParams(VerifierParams):
    formats: list[Literal["conclusion", "boxed"]] = Field(
        default_factory=lambda: ["conclusion", "boxed"])
    """Built-in verdict formats to read; empty with a ``pattern`` to read only that."""
    pattern: str | None = Field(None, max_length=1000)
    """Own verdict format: a regular expression with a named group ``verdict`` (one of
    right/wrong, correct/incorrect, true/false, yes/no, any case)."""
    ignore_case: bool = True
    """Compile ``pattern`` case-insensitively."""
    reward_agree: RewardValue = 1.0
    """Reward of a verdict that matches the label."""
    reward_disagree: RewardValue = 0.0
    """Reward of a verdict against the label."""
    reward_unparseable: RewardValue = 0.0
    """Reward of a completion with no verdict, or with verdicts that contradict each other."""

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return check_pattern(value, "verdict")

    @field_validator("formats")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _something_to_read(self) -> CritiqueParams:
        if not self.formats and self.pattern is None:
            raise ValueError("formats is empty and there is no pattern: no verdict could "
                             "ever be read")
        return self

    def patterns(self) -> dict[str, re.Pattern[str]]:
        found = {name: FORMATS[name] for name in self.formats}
        if self.pattern is not None:
            found["pattern"] = re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)
        return found


def read_verdicts(text: str, patterns: Mapping[str, re.Pattern[str]]
                  ) -> list[tuple[str, bool | None, str]]:
    """(format, verdict or None for an unknown word, matched text) of every verdict."""
    return [(name, as_label(m.group("verdict") or ""), m.group(0))
            for name, pattern in patterns.items() for m in pattern.finditer(text)
            if m.group("verdict") is not None]


class CritiqueVerifier(ReferenceShaped, Verifier):
    name = "critique"
    deterministic = True
    description = ("The completion judges a given solution (Conclusion: right/wrong, "
                   "\\boxed{True}/\\boxed{False}, or a custom pattern); reward_agree when its "
                   "verdict matches reference.label, reward_disagree otherwise, "
                   "reward_unparseable without one verdict.")
    reference_fields: ClassVar[dict[str, str]] = {
        "label": "bool (or right/wrong, correct/incorrect, true/false, yes/no): whether the "
                 "critiqued solution is correct"}
    Params = CritiqueParams
    Reference = CritiqueReference

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: CritiqueParams) -> Outcome:
        label = self.reference(reference).label
        found = read_verdicts(answer_part(sample.completion), params.patterns())
        detail: dict[str, Any] = {"label": label,
                                  "matches": [truncate(text, 80) for _, _, text in found[:10]]}
        verdicts = {verdict for _, verdict, _ in found}
        if not found or None in verdicts:
            return Outcome.success(params.reward_unparseable, verdict=None, rule="no_verdict",
                                   **detail)
        if len(verdicts) > 1:
            return Outcome.success(params.reward_unparseable, verdict=None,
                                   rule="contradicting", **detail)
        verdict = verdicts.pop()
        agree = verdict == label
        return Outcome.success(params.reward_agree if agree else params.reward_disagree,
                               verdict=verdict, rule=found[-1][0], agree=agree, **detail)
