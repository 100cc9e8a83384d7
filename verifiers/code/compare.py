"""Judging a test's output against its expected value, outside the sandbox, on plain data.

Standard output (``stdio`` tests), compared as text decoded from UTF-8 (undecodable bytes
become U+FFFD, so they can never equal expected text that does not contain U+FFFD):

* ``exact``: the decoded text equals the expected text, character for character.
* ``lines`` (default): line by line, where a line's trailing whitespace (spaces, tabs, a
  ``\\r`` of a CRLF ending) is ignored, and so are trailing blank lines at the end of the
  output. Leading whitespace, blank lines in the middle and the line count still matter.
* ``tokens``: the whitespace-separated tokens are equal, in order (any whitespace, any line
  breaks between them).

Never case-folded, never compared as a set or a multiset of tokens: ``YES`` is not ``yes``
and ``2 1`` is not ``1 2``.

``float_tolerance`` (off by default; ``lines`` and ``tokens`` only): a token pair where both
are decimal numbers (``-1.5``, ``2e-3``, ``7``; not ``nan``, ``inf`` or ``1_000``) and at
least one is written with a ``.`` or an exponent compares as numbers, equal when
``|got - expected| <= tol * max(1, |expected|)`` (absolute error below 1, relative above:
the usual checker rule). Two integers are still compared as written, so a tolerance can never
make ``1000001`` equal ``1000000``. In ``lines`` mode a line that differs as text is then
compared token by token (same token count), so only numbers get the tolerance.

Values (``call``/``expr`` tests) are JSON-decoded data compared with the expected value (JSON
data, or a Python literal from an ``assert``):

* lists and tuples are the same thing (JSON has only lists), compared element by element;
* dicts: the same keys, each value equal;
* ``int`` and ``float`` are equal when numerically equal (``1 == 1.0``); with
  ``float_tolerance`` a pair where either side is a float uses the rule above; NaN equals NaN
  (both sides hold the same datum);
* ``bool`` is not a number (``true`` is not ``1``), a string is not a number (``"3"`` is
  not ``3``), ``null`` is only ``null``: no other coercion.

Lifted ``assert`` forms other than ``==`` (:class:`Expectation` kinds, see ``spec.py``) are
judged here too, on the decoded value, with Python's own operators applied to plain data:
``order`` (``<``, ``<=``, ``>``, ``>=`` against a number or a string of the same kind,
``!=`` as the negation of the equality above), ``member`` (``in``/``not in`` a literal
container, membership by the equality above, a substring for a string container) and
``close`` (``math.isclose`` with the assert's tolerances, or ``abs(x - c) < tol``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from rewardd.verifiers.code.lift import Expectation

CompareMode = Literal["exact", "lines", "tokens"]

_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)


def decode(output: bytes) -> str:
    """A program's output as text; undecodable bytes become U+FFFD instead of failing."""
    return output.decode("utf-8", errors="replace")


def numbers_close(got: float, expected: float, tol: float) -> bool:
    """``|got - expected| <= tol * max(1, |expected|)``; NaN equals only NaN."""
    if math.isnan(got) or math.isnan(expected):
        return math.isnan(got) and math.isnan(expected)
    if math.isinf(got) or math.isinf(expected):
        return got == expected
    return abs(got - expected) <= tol * max(1.0, abs(expected))


def tokens_equal(got: str, expected: str, tol: float | None) -> bool:
    """One token pair: equal as text, or as numbers under the tolerance rule."""
    if got == expected:
        return True
    if tol is None or not (_NUMBER.fullmatch(got) and _NUMBER.fullmatch(expected)):
        return False
    if _INTEGER.fullmatch(got) and _INTEGER.fullmatch(expected):
        return False
    try:
        return numbers_close(float(got), float(expected), tol)
    except OverflowError:  # pragma: no cover - float() returns inf rather than raising
        return False


def _token_lists_equal(got: list[str], expected: list[str], tol: float | None) -> bool:
    return len(got) == len(expected) and all(
        tokens_equal(g, e, tol) for g, e in zip(got, expected))


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdout_equal(got: bytes, expected: str, mode: CompareMode = "lines",
                 tol: float | None = None) -> bool:
    """Does a program's stdout match the expected output under ``mode`` (module rules)?"""
    text = decode(got)
    if mode == "exact":
        return text == expected
    if mode == "tokens":
        return _token_lists_equal(text.split(), expected.split(), tol)
    got_lines, expected_lines = _lines(text), _lines(expected)
    if len(got_lines) != len(expected_lines):
        return False
    return all(g == e or (tol is not None and _token_lists_equal(g.split(), e.split(), tol))
               for g, e in zip(got_lines, expected_lines))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def values_equal(got: Any, expected: Any, tol: float | None = None) -> bool:
    """Structural equality of decoded JSON ``got`` with ``expected`` (module rules)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return isinstance(expected, bool) and isinstance(got, bool) and got == expected
    if _is_number(expected):
        if not _is_number(got):
            return False
        if isinstance(got, float) or isinstance(expected, float):
            if math.isnan(float(got)) and math.isnan(float(expected)):
                return True
            if tol is not None:
                try:
                    return numbers_close(float(got), float(expected), tol)
                except OverflowError:  # an int too large for a float
                    return got == expected
        return got == expected
    if expected is None or isinstance(expected, str):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(values_equal(g, e, tol) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(values_equal(got[k], expected[k], tol) for k in expected))
    return False  # a type JSON cannot hold: never produced by the spec parser


ExpectationKind = Literal["stdout", "equal", "order", "member", "close", "completed"]
"""The kinds of :class:`~rewardd.verifiers.code.lift.Expectation` (defined there, so the
lifting program, which runs in the sandbox and imports only the standard library, builds the
same ones)."""




_ORDER = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
          ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _close(got: Any, exp: Expectation) -> bool:
    if not _is_number(got):
        return False
    try:
        if exp.op == "<":
            return abs(got - exp.value) < exp.abs_tol
        if exp.op == "<=":
            return abs(got - exp.value) <= exp.abs_tol
        return math.isclose(got, exp.value, rel_tol=exp.rel_tol, abs_tol=exp.abs_tol)
    except OverflowError:  # an int beyond float range against a float
        return False


def _member(got: Any, container: Any) -> bool:
    if isinstance(container, str):
        return isinstance(got, str) and got in container
    if isinstance(container, dict):
        container = list(container)
    return any(values_equal(got, item) for item in container)


def value_meets(got: Any, exp: Expectation, tol: float | None = None) -> bool:
    """Does the decoded value ``got`` satisfy ``exp`` (kinds ``equal``/``order``/``member``/
    ``close``)? ``tol`` is ``float_tolerance`` and applies to ``equal`` and ``!=``."""
    if exp.kind == "equal":
        return values_equal(got, exp.value, tol)
    if exp.kind == "order":
        if exp.op == "!=":
            return not values_equal(got, exp.value, tol)
        same_kind = (_is_number(got) and _is_number(exp.value)) or (
            isinstance(got, str) and isinstance(exp.value, str))
        try:
            return same_kind and bool(_ORDER[exp.op](got, exp.value))
        except OverflowError:  # pragma: no cover - int/float comparisons do not overflow
            return False
    if exp.kind == "member":
        found = _member(got, exp.value)
        return found if exp.op == "in" else not found
    if exp.kind == "close":
        return _close(got, exp)
    raise ValueError(f"{exp.kind!r} expectations are not judged on a value")


__all__ = ["CompareMode", "Expectation", "ExpectationKind", "decode", "numbers_close",
           "stdout_equal", "tokens_equal", "value_meets", "values_equal"]
