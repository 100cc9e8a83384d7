"""Parse answers with math-verify and decide equivalence, without signal-based timeouts.

math-verify (with latex2sympy2_extended underneath) does all the parsing and comparison.
What this module adds:

* a single way to feed both LaTeX (``\\frac{1}{2}``) and plain expressions (``3/4``,
  ``x^2+2x+1``) to the parser: a bare answer is wrapped in ``$...$`` so the LaTeX
  extractor sees exactly that span, and math-verify's expression extractor is the fallback;
* timeouts switched off (``parsing_timeout=None``, ``timeout_seconds=None``). math-verify's
  own timeouts use ``signal.alarm``, which raises outside the main thread. Our executor runs
  every verifier call in a killable worker process with a wall-clock limit instead;
* the "timeout is disabled" warning math-verify logs once per process is filtered out,
  since disabling it is deliberate here.
"""

from __future__ import annotations

import logging
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

_EXTRACTION_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


class _DropTimeoutDisabledWarning(logging.Filter):
    """Hide math-verify's 'Timeout is disabled' warning: we disable it on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def as_math_text(answer: str) -> str:
    """The string handed to ``math_verify.parse`` for an already-extracted answer.

    A bare answer is wrapped in ``$...$``; one that still holds ``$`` (e.g. a whole completion
    with ``extract="none"``) is passed as is and math-verify finds the math in it.
    """
    answer = answer.strip()
    return answer if "$" in answer else f"${answer}$"


def parse_answer(answer: str) -> list[Any]:
    """Parsed sympy forms of ``answer`` (math-verify's list; empty when nothing parses).

    ``fallback_mode="no_fallback"`` keeps unparseable text out of the list, so an empty list
    means "could not parse" rather than "compare as raw strings".
    """
    return parse(as_math_text(answer), extraction_config=list(_EXTRACTION_CONFIG),
                 fallback_mode="no_fallback", parsing_timeout=None)  # type: ignore[arg-type]


def equivalent(reference: list[Any], prediction: list[Any], *, strict: bool,
               float_rounding: int, numeric_precision: int) -> bool:
    """math-verify's verdict; the reference is the gold side (the comparison is asymmetric)."""
    return bool(verify(reference, prediction, float_rounding=float_rounding,
                       numeric_precision=numeric_precision, strict=strict,
                       timeout_seconds=None))


def describe(parsed: list[Any], limit: int = 200) -> str | None:
    """``str`` of the first parsed form, truncated to ``limit`` characters, for ``detail``."""
    if not parsed:
        return None
    text = str(parsed[0])
    return text if len(text) <= limit else text[:limit] + "..."
