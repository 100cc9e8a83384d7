"""Exact parsing of number literals, without sympy.

Most math answers are plain numbers (``42``, ``-3/4``, ``\\frac{9}{7}``, ``2.50``, ``1,000``,
``1.5\\times10^{3}``, ``3\\frac12``). Reading them with ``fractions.Fraction`` and
``decimal.Decimal`` is exact, has no digit limit (Python's ``int(str)`` refuses more than
4300 digits) and costs microseconds instead of a LaTeX grammar's milliseconds. Anything this
module does not recognise goes to the sympy path in :mod:`rewardd.verifiers.math.answer`.

A decimal literal remembers how it was written (decimal places, significant digits): the
rounding rule in :mod:`rewardd.verifiers.math.compare` needs it to decide whether ``3.142`` is ``\\pi``
rounded or a different number.
"""

from __future__ import annotations

import ast
import math
import re
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MAX_EXPONENT = 10_000
"""Largest |k| in ``m\\times10^{k}`` or ``me k`` read exactly here; bigger goes to the guarded
sympy path (an exact 10**(10**9) would take the process down)."""

_SIGN = r"[+-]?"
_PLAIN = r"(?:\d+(?:\.\d*)?|\.\d+)"
_GROUPED = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?"
_MANTISSA = rf"(?:{_GROUPED}|{_PLAIN})"
_DECIMAL = re.compile(rf"^(?P<m>{_SIGN}{_MANTISSA})"
                      r"(?:(?:[eE](?P<e>[+-]?\d+))|"
                      r"(?:\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*(?:\{\s*(?P<p>[+-]?\d+)\s*\}"
                      r"|(?P<q>[+-]?\d)))|)$")
_INT = r"\d+"
_FRAC = re.compile(rf"^(?P<s>{_SIGN})\s*\\frac\s*(?:\{{\s*(?P<a>{_SIGN}{_INT})\s*\}}|(?P<a1>\d))"
                   rf"\s*(?:\{{\s*(?P<b>{_SIGN}{_INT})\s*\}}|(?P<b1>\d))$")
_SLASH = re.compile(rf"^(?P<a>{_SIGN}{_INT})\s*/\s*(?P<b>{_SIGN}{_INT})$")
_MIXED = re.compile(rf"^(?P<s>{_SIGN})(?P<w>{_INT})\s*(?:\\frac\s*(?:\{{\s*(?P<a>{_INT})\s*\}}|(?P<a1>\d))"
                    rf"\s*(?:\{{\s*(?P<b>{_INT})\s*\}}|(?P<b1>\d))|\s+(?P<c>{_INT})\s*/\s*(?P<d>{_INT}))$")
_BRACES = re.compile(r"^\{(.*)\}$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Number:
    """An exact rational value and how it was written."""

    value: Fraction
    places: int | None = None
    """Digits after the decimal point when written as a decimal literal (``2.50`` -> 2);
    None for integers and fractions."""
    significant: int = 0
    """Significant digits of a decimal literal (``0.03330`` -> 4); 0 when not a decimal."""

    @property
    def is_decimal(self) -> bool:
        return self.places is not None and self.places > 0


def _decimal(text: str) -> Number | None:
    m = _DECIMAL.match(text)
    if m is None:
        return None
    mantissa = m.group("m").replace(",", "")
    exp_text = m.group("e") or m.group("p") or m.group("q")
    exponent = int(exp_text) if exp_text else 0
    if abs(exponent) > MAX_EXPONENT:
        return None
    try:
        d = Decimal(mantissa)
    except InvalidOperation:
        return None
    digits = mantissa.lstrip("+-")
    places = len(digits.split(".", 1)[1]) if "." in digits else 0
    significant = len(digits.replace(".", "").lstrip("0")) or 1
    value = Fraction(d) * (Fraction(10) ** exponent)
    if exp_text:  # scientific notation states a precision even without a point: 1e-12
        written_places = max(places - exponent, 0)
        return Number(value, written_places or None, significant if written_places else 0)
    return Number(value, places or None, significant if places else 0)


def _fraction(text: str) -> Number | None:
    m = _FRAC.match(text)
    if m is not None:
        a = int(m.group("a") or m.group("a1"))
        b = int(m.group("b") or m.group("b1"))
        sign = -1 if m.group("s") == "-" else 1
        return Number(sign * Fraction(a, b)) if b != 0 else None
    m = _SLASH.match(text)
    if m is not None:
        a, b = int(m.group("a")), int(m.group("b"))
        return Number(Fraction(a, b)) if b != 0 else None
    return None


def _mixed(text: str) -> Number | None:
    m = _MIXED.match(text)
    if m is None:
        return None
    whole = int(m.group("w"))
    a = int(m.group("a") or m.group("a1") or m.group("c"))
    b = int(m.group("b") or m.group("b1") or m.group("d"))
    if b == 0 or a >= b:  # 3\frac{5}{2} is not how anyone writes a mixed number
        return None
    value = whole + Fraction(a, b)
    return Number(-value if m.group("s") == "-" else value)


def parse_number(text: str, max_digits: int) -> Number | None:
    """The exact value of a number literal, or None when ``text`` is not one.

    Recognised: integers, decimals (``.5``, ``2.``), thousands separators in groups of three
    (``1,234,567``), scientific notation (``1.5e3``, ``1.5\\times10^{3}``), ``a/b``,
    ``\\frac{a}{b}`` / ``\\frac ab``, mixed numbers (``3\\frac12``, ``3 1/2``). Literals longer
    than ``max_digits`` characters are refused (the size guard for numbers).
    """
    text = text.strip()
    while (m := _BRACES.match(text)) is not None:
        text = m.group(1).strip()
    if not text or len(text) > max_digits + 64:
        return None
    return _decimal(text) or _fraction(text) or _mixed(text)


_ARITHMETIC = re.compile(r"^[\d\s+\-*/().^]+$")
_ARITHMETIC_LATEX = ((re.compile(r"\\(?:cdot|times)(?![a-zA-Z])"), "*"),
                     (re.compile(r"\\div(?![a-zA-Z])"), "/"), (re.compile(r"\^"), "**"))


def arithmetic(text: str, max_digits: int) -> Fraction | None:
    """The exact value of integer arithmetic (``1+1+...+1``, ``2\\cdot(3+4)``, ``2^{10}`` is
    not included: braces go to sympy), or None.

    Parsed by :func:`ast.parse` (the standard library's parser, linear and never ``eval``)
    and evaluated with Fractions over a whitelist of nodes; powers are refused above
    ``max_digits`` digits before they are computed.
    """
    for pattern, replacement in _ARITHMETIC_LATEX:
        text = pattern.sub(replacement, text)
    if not _ARITHMETIC.match(text) or not re.search(r"[+\-*/]", text.strip().lstrip("-+")):
        return None
    limit = sys.getrecursionlimit()
    try:
        tree = ast.parse(text.strip(), mode="eval")
        sys.setrecursionlimit(max(limit, min(len(text), 20_000) + 200))  # 1+1+...+1 nests
        return _evaluate(tree.body, max_digits)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None
    finally:
        sys.setrecursionlimit(limit)


def _evaluate(node: ast.AST, max_digits: int) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, max_digits)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, max_digits), _evaluate(node.right, max_digits)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            return left / right
        if isinstance(node.op, ast.Pow) and right.denominator == 1:
            size = abs(right.numerator) * math.log10(max(abs(left.numerator), abs(left.denominator), 2))
            if size > max_digits:
                raise ValueError("power above the size guard")
            return left ** right.numerator
    raise ValueError(f"not integer arithmetic: {type(node).__name__}")
