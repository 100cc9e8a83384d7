"""MathVerifier: extract the final answer, parse both sides, ask math-verify if they agree.

math-verify / latex2sympy2_extended do the parsing and comparison; see
:mod:`verifiers.math.extract` for the extraction order we add and
:mod:`verifiers.math.equivalence` for why math-verify's timeouts are off.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import Field

from verifiers.base import InvalidReference, Outcome, Sample, Verifier, VerifierParams
from verifiers.math.equivalence import describe, equivalent, parse_answer
from verifiers.math.extract import clean_answer, extract_answer


class MathParams(VerifierParams):
    extract: Literal["auto", "boxed", "none"] = "auto"
    """``auto``: boxed, then "the answer is", "Answer:" line, last ``$..$``, last number.
    ``boxed``: only the last ``\\boxed{}``/``\\fbox{}``. ``none``: the whole completion."""
    strict: bool = True
    """math-verify ``strict``: variable names matter and sets do not equal tuples.
    With ``False``, variables are matched by position and sets may equal tuples."""
    float_rounding: int = Field(default=6, ge=0, le=20)
    """Decimal places floats are rounded to before comparing (math-verify default 6), so
    ``0.333333`` equals ``1/3``."""
    numeric_precision: int = Field(default=15, ge=1, le=100)
    """Significant digits for numeric evaluation of symbolic differences (math-verify default)."""


class MathVerifier(Verifier):
    """1.0 when the extracted final answer equals the reference answer, else 0.0.

    Outcomes: a missing or unparseable reference is ``invalid_reference`` (the dataset's
    fault). No answer in the completion, or an answer that does not parse, is a reward of 0.0
    with ``detail.rule`` saying which (the model's fault, not a verifier failure).
    """

    name = "math"
    description = ("1.0 if the final answer (last \\boxed{}, 'the answer is', 'Answer:' line, "
                   "last $...$, or last number) is mathematically equivalent to the reference "
                   "answer according to math-verify; else 0.0.")
    reference_fields = {"answer": "str or number: the expected answer, LaTeX (\\frac{1}{2}) "
                                  "or plain (0.5)"}
    Params = MathParams

    @staticmethod
    def _reference(reference: Mapping[str, Any]) -> tuple[str, list[Any]]:
        answer = reference.get("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)  # datasets often store numeric answers as JSON numbers
        if not isinstance(answer, str) or not clean_answer(answer):
            raise InvalidReference("math verifier needs a non-empty string 'answer' in the "
                                   "reference")
        parsed = parse_answer(clean_answer(answer))
        if not parsed:
            raise InvalidReference(f"math verifier could not parse the reference answer "
                                   f"{answer[:200]!r}")
        return answer, parsed

    def warm_up(self) -> None:
        # The first parse builds latex2sympy's grammar (about a second); do it once, pre-fork.
        self.verify(Sample(completion="\\boxed{\\frac{1}{2}}"), {"answer": "0.5"}, MathParams())

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: MathParams) -> Outcome:
        _, parsed_reference = self._reference(reference)
        found = extract_answer(sample.completion, params.extract)
        detail: dict[str, Any] = {
            "extracted": None if found.answer is None else found.answer[:200],
            "rule": found.rule,
            "parsed_prediction": None,
            "parsed_reference": describe(parsed_reference),
            "decided_by": "math_verify",
        }
        if found.answer is None:
            return Outcome.success(0.0, **detail)
        parsed_prediction = parse_answer(found.answer)
        if not parsed_prediction:
            detail["rule"] = "unparseable_prediction"
            detail["extraction_rule"] = found.rule
            return Outcome.success(0.0, **detail)
        detail["parsed_prediction"] = describe(parsed_prediction)
        same = equivalent(parsed_reference, parsed_prediction, strict=params.strict,
                          float_rounding=params.float_rounding,
                          numeric_precision=params.numeric_precision)
        return Outcome.success(1.0 if same else 0.0, **detail)
