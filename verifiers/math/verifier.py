"""MathVerifier: extract the final answer, parse both sides, decide equivalence, say why.

Speed comes from caching, not from cutting corners: a group's N rollouts share one reference,
and RL groups repeat answers, so parsed references, parsed predictions and verdicts are kept
in per-process LRU caches keyed by the exact strings and options. A worker that verifies a
group therefore parses the reference once and each distinct answer once. The caches hold
plain immutable values; an interrupted call (a timeout) caches nothing.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal, Mapping

from pydantic import Field

from rewardd.verifiers.base import InvalidReference, Outcome, Sample, Verifier, VerifierParams
from rewardd.verifiers.math.answer import Node, Unparseable, describe, parse
from rewardd.verifiers.math.compare import Options, PercentMode, equivalent
from rewardd.verifiers.math.answer import NumberLeaf, TextLeaf
from rewardd.verifiers.math.prose import comma_is_decimal
from rewardd.verifiers.math.several import boxes_together, decimal_comma
from rewardd.verifiers.math.extract import (choice_letter, clean_answer, extract_answer, extract_choice,
                                            reference_answer, text_span)

_CACHE_SIZE = 8192
_CHOICE_REFERENCE = re.compile(r"^(?:\\text\{\s*)?\(?\s*([A-E])\s*\)?(?:\s*\})?$")


class MathParams(VerifierParams):
    extract: Literal["auto", "boxed", "none"] = "auto"
    """``auto``: after chat-template debris is cut and in the text after ``</think>`` first:
    last ``\\boxed{}``, then "the answer is", an "Answer:"/"Final Answer" line or ``####``, a
    bare last line of mathematics, a closing "... is 34.", the last ``$..$``, the last
    numeric expression. ``boxed``: only ``\\boxed{}``/``\\fbox{}``. ``none``: the whole
    completion is the answer."""
    extraction: Literal["strict", "standard", "lenient"] = "standard"
    """How much free text ``extract: auto`` reads as an answer (issue 31), reported as
    ``detail.extraction``. ``strict``: a box or an explicit final-answer phrase ("the answer
    is", an "Answer:"/"Final Answer" line, ``####``) only. ``standard`` (default, for RL):
    every ``auto`` rule, but the last number of free text is no answer when the completion
    states several candidates (a number right after another, or after "or": ``16 8``,
    ``3 or 4``) or ends in non-answer text (a sentence
    of words after it): the readings a hedging policy would farm. ``lenient``: the last
    number anywhere (before issue 31, the only reading). ``extract: boxed`` and ``none``
    ignore it and report themselves."""
    boxed: Literal["last", "all"] = "last"
    """``last``: the last box is the answer, except where the reference has several parts
    (``2, 3``, ``\\{(1,2),(2,1)\\}``, ``k=45, n=2``) and the last box one: then the boxes are
    read together, as a set or list (a tuple where the reference is ordered). ``all``: every
    box, as an unordered list of answers, whatever the reference."""
    mode: Literal["lenient", "strict"] = "lenient"
    """``lenient`` also accepts: a decimal that correctly rounds the reference (with at least
    ``min_rounding_digits`` significant digits), ``x = 5`` for ``5``, a bare list for a set,
    an inequality for its interval, degrees for radians, a one-element set for its element.
    ``strict`` accepts none of these."""
    percent: PercentMode | None = None
    """How ``p\\%`` compares with a plain number: ``either`` (p or p/100), ``fraction``
    (p/100 only) or ``number`` (p only). Default: ``either`` in lenient mode, ``fraction`` in
    strict mode."""
    min_rounding_digits: int = Field(default=4, ge=1, le=50)
    """Fewest significant digits a decimal needs to count as a rounding of an exact value
    (``3.142`` for ``\\pi`` yes, ``3.14`` no)."""
    rel_tol: float = Field(default=1e-9, ge=0.0, le=0.1)
    """Relative tolerance between values written with decimals (``2.5000000001`` vs ``2.5``).
    Never applied to integers or exact fractions."""
    max_digits: int = Field(default=20_000, ge=100, le=200_000)
    """Size guard: numbers above this many digits are never computed, only compared as
    written."""
    decimal_comma: bool = False
    """``true``: an answer or reference that is one number with one comma between digits
    (``2,74``, ``-0{,}5``, even ``1,000``) is a decimal, as written in much of Europe.
    ``false`` (default): a comma that cannot group thousands (not followed by exactly three
    digits, or after ``0`` or four digits: ``2,74``, ``1000,99``, ``0,111``) is a decimal
    comma when the other side is one number, and separates a list when the other side is a
    list; ``1,000`` groups thousands; ``1, 5`` (a space) is a list."""

    def options(self) -> Options:
        percent = self.percent or ("either" if self.mode == "lenient" else "fraction")
        return Options(lenient=self.mode == "lenient", percent=percent,
                       min_rounding_digits=self.min_rounding_digits, rel_tol=self.rel_tol,
                       max_digits=self.max_digits)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _parsed(text: str, max_digits: int) -> Node | str:
    """A parsed answer, or the reason it does not parse (cached either way)."""
    try:
        return parse(text, max_digits)
    except Unparseable as exc:
        return str(exc)
    except RecursionError:
        return "answer nested too deeply"


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _verdict(reference: str, prediction: str, options: Options) -> tuple[bool, str]:
    ref, pred = _parsed(reference, options.max_digits), _parsed(prediction, options.max_digits)
    assert not isinstance(ref, str) and not isinstance(pred, str)
    return equivalent(ref, pred, options)


def _reading(params: MathParams) -> str:
    """``detail.extraction``: the reading used (``strict``/``standard``/``lenient`` under
    ``extract: auto``; else ``boxed`` or ``none``)."""
    return params.extraction if params.extract == "auto" else params.extract


def clear_caches() -> None:
    """Forget every parsed answer and verdict (benchmarks measure cold parsing with it)."""
    _parsed.cache_clear()
    _verdict.cache_clear()


class MathVerifier(Verifier):
    """1.0 when the extracted final answer equals the reference answer, else 0.0.

    Outcomes: a missing or unparseable reference is ``invalid_reference`` (the dataset's
    fault). No answer in the completion, or an answer that does not parse, is a reward of 0.0
    with ``detail.rule`` saying which (the model's fault, not a verifier failure).
    """

    name = "math"
    revision = "13"
    deterministic = True
    description = ("1.0 if the final answer (after </think>: last \\boxed{}, 'the answer is', "
                   "'Answer:' line, a closing '... is 34.', last $...$, or last number; a "
                   "letter for multiple choice) is "
                   "mathematically equivalent to the reference answer: exact numbers, "
                   "rounding and tolerance rules, symbolic identity, equations, inequalities, "
                   "sets, intervals, tuples, matrices, units, percent and degrees; else 0.0.")
    reference_fields = {"answer": "str or number: the expected answer, LaTeX (\\frac{1}{2}), "
                                  "plain (0.5) or a choice letter ((C))"}
    Params = MathParams

    def warm_up(self) -> None:
        # The first LaTeX parse builds latex2sympy's grammar (about a second): once, pre-fork.
        self.verify(Sample(completion="\\boxed{\\frac{x}{2}}"), {"answer": "x/2"}, MathParams())
        clear_caches()

    @staticmethod
    def _reference_text(reference: Mapping[str, Any]) -> str:
        answer = reference.get("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = repr(answer) if isinstance(answer, float) else str(answer)
        if not isinstance(answer, str) or not clean_answer(answer):
            raise InvalidReference("math verifier needs a non-empty string 'answer' in the "
                                   "reference")
        found = reference_answer(answer)
        if found is None:
            raise InvalidReference("math verifier found no answer in the reference, a solution "
                                   "text without a box, 'the answer is' or final math: "
                                   f"{answer[:200]!r}")
        return found

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: MathParams) -> Outcome:
        ref_text = self._reference_text(reference)
        if params.decimal_comma:
            ref_text = decimal_comma(ref_text)
        letter = _CHOICE_REFERENCE.match(ref_text)
        if letter is not None:
            return self._choice(sample, letter.group(1), params)
        parsed_reference = _parsed(ref_text, params.max_digits)
        if isinstance(parsed_reference, str):
            raise InvalidReference(f"math verifier could not parse the reference answer "
                                   f"{ref_text[:200]!r}: {parsed_reference}")
        found = extract_answer(sample.completion, params.extract, params.boxed, params.extraction)
        answer, rule = found.answer, str(found.rule)
        if rule == "boxed" and params.boxed == "last":
            together = boxes_together(sample.completion, parsed_reference,
                                      lambda text: _parsed(text, params.max_digits))
            if together is not None:
                answer, rule = together, "boxes_together"
        if (answer is None and isinstance(parsed_reference, TextLeaf) and params.extract == "auto"
                and params.extraction != "strict"):
            answer = text_span(sample.completion)  # $odd$ against \text{odd}: words are it
            rule = "text_span" if answer is not None else rule
        if answer is not None and params.decimal_comma:
            answer = decimal_comma(answer)
        elif answer is not None:  # a comma that cannot group thousands, against one number
            if comma_is_decimal(answer) and isinstance(parsed_reference, NumberLeaf):
                answer = decimal_comma(answer)
            elif comma_is_decimal(ref_text) and isinstance(_parsed(answer, params.max_digits),
                                                           NumberLeaf):
                ref_text = decimal_comma(ref_text)
                parsed_reference = _parsed(ref_text, params.max_digits)
        detail: dict[str, Any] = {
            "extracted": None if answer is None else answer[:200],
            "rule": rule,
            "parsed_prediction": None,
            "parsed_reference": describe(parsed_reference),
            "decided_by": None,
            "extraction": _reading(params),
        }
        if answer is None:
            return Outcome.success(0.0, **detail)
        parsed_prediction = _parsed(answer, params.max_digits)
        if isinstance(parsed_prediction, str):
            detail.update(rule="unparseable_prediction", extraction_rule=rule,
                          reason=parsed_prediction)
            return Outcome.success(0.0, **detail)
        detail["parsed_prediction"] = describe(parsed_prediction)
        same, decided_by = _verdict(ref_text, answer, params.options())
        detail["decided_by"] = decided_by
        return Outcome.success(1.0 if same else 0.0, **detail)

    @staticmethod
    def _choice(sample: Sample, letter: str, params: MathParams) -> Outcome:
        found = extract_answer(sample.completion, params.extract, params.boxed, params.extraction)
        chosen = extract_choice(sample.completion, found)
        return Outcome.success(1.0 if chosen == letter else 0.0,
                               extracted=None if found.answer is None else found.answer[:200],
                               rule=found.rule, parsed_prediction=chosen,
                               parsed_reference=letter, decided_by="choice",
                               extraction=_reading(params))


__all__ = ["MathParams", "MathVerifier", "choice_letter", "clear_caches"]
