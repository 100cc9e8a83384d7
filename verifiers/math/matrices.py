"""Matrix spellings the structural parser must see through, and determinants.

``\\left[\\begin{array}{cc}1&2\\\\3&4\\end{array}\\right]`` is how MATH and NuminaMath write a
matrix (an ``array`` inside brackets); ``\\begin{vmatrix}..\\end{vmatrix}`` is a determinant,
a number, not a matrix: it equals a number reference by its value, and another matrix only
entry by entry (the bars are notation on the same entries). Arithmetic between matrices
(``A + B``, ``2A``, ``AB``, ``A^{-1}``, ``A^T``) is left to latex2sympy and evaluated in
:mod:`rewardd.verifiers.math.compare` when its size is safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    from rewardd.verifiers.math.answer import Matrix

_BRACKETED = re.compile(r"^(?:\[|\()\s*(\\begin\{(array|matrix)\}.*\\end\{\2\})\s*(?:\]|\))$",
                        re.DOTALL)
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{")
MAX_POWER = 64
"""Largest |exponent| of a matrix power evaluated (A^{10^9} would multiply for ever)."""


@dataclass(frozen=True, slots=True)
class Determinant:
    """``\\begin{vmatrix}..\\end{vmatrix}``: the determinant of these entries."""

    matrix: "Matrix"


def unwrap(text: str) -> str:
    """``[\\begin{array}..\\end{array}]`` -> the environment alone (one environment only)."""
    m = _BRACKETED.match(text)
    if m is None or len(_ENVIRONMENT.findall(m.group(1))) != 2:
        return text
    return m.group(1)


def is_single_environment(body: str) -> bool:
    """The body of a matched ``\\begin{..}..\\end{..}`` holds no other environment: ``A + B``
    written as two matrices is arithmetic, not one matrix with odd cells."""
    return _ENVIRONMENT.search(body) is None


def is_matrix_expression(expr: sympy.Basic) -> bool:
    """``A + B``, ``2A``, ``AB``, ``A^T`` (sympy matrix expressions) or ``A^{-1}`` (a power
    of a matrix, which latex2sympy leaves as a plain ``Pow``)."""
    return (isinstance(expr, sympy.MatrixExpr) and not isinstance(expr, sympy.MatrixBase)) \
        or (isinstance(expr, sympy.Pow) and bool(expr.base.is_Matrix))


def evaluate_matrix_expression(expr: sympy.Basic) -> sympy.Basic:
    """A matrix expression of explicit matrices evaluated to one matrix; returned unchanged
    when it has a power that is not an integer of at most ``MAX_POWER`` or does not
    evaluate (a singular inverse)."""
    try:
        return _evaluate(expr)
    except (ValueError, TypeError, ArithmeticError, sympy.ShapeError):
        return expr


def _evaluate(expr: sympy.Basic) -> sympy.Basic:
    if isinstance(expr, (sympy.Pow, sympy.MatPow)) and bool(expr.base.is_Matrix):
        exponent = expr.exp
        if not isinstance(exponent, sympy.Integer) or abs(int(exponent)) > MAX_POWER:
            raise ValueError("matrix power out of range")
        base = _evaluate(expr.base)
        if not isinstance(base, sympy.MatrixBase):
            raise ValueError("not an explicit matrix")
        return sympy.ImmutableMatrix(base) ** int(exponent)
    if isinstance(expr, sympy.MatrixBase):
        return sympy.ImmutableMatrix(expr)
    if not expr.args or not any(bool(getattr(a, "is_Matrix", False)) or is_matrix_expression(a)
                                for a in expr.args):
        return expr
    args = [_evaluate(a) for a in expr.args]
    value = expr.func(*args).doit()
    return sympy.ImmutableMatrix(value) if isinstance(value, sympy.MatrixBase) else value


__all__ = ["Determinant", "MAX_POWER", "evaluate_matrix_expression", "is_matrix_expression",
           "is_single_environment", "unwrap"]
