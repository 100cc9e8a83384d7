"""Size guards: keep numbers too big to compute away from sympy's exact arithmetic.

``2^{2^{2^{2^{2^{2}}}}}`` or ``(10^{100})!`` parse in microseconds, but evaluating them exactly
would run for ever inside C code that no signal can interrupt (the executor would have to kill
the process). latex2sympy2_extended builds unevaluated trees, so before anything evaluates we
estimate each numeric subtree's size in decimal digits from logarithms (cheap floats, never
the value) and fold only the subtrees below the limit. What stays above it is compared
structurally: ``9^{9^{9}}`` equals ``9^{387420489}`` (the exponent folds), while
``2^{2^{100}}`` and ``4^{2^{99}}`` are reported unequal by the ``size_guard`` rule, a
documented false negative on values nobody can check anyway.
"""

from __future__ import annotations

import math

import sympy
from sympy.core.function import AppliedUndef

HUGE = math.inf


def digits(expr: sympy.Basic) -> float:
    """An upper estimate of the decimal digits of the numbers ``expr`` would compute with.

    Symbols count as one digit; the estimate only has to be large for large values and
    cheap to compute, never exact.
    """
    if isinstance(expr, sympy.Integer):
        return max(1.0, abs(int(expr)).bit_length() * 0.30103)
    if isinstance(expr, sympy.Rational):
        return max(digits(sympy.Integer(expr.p)), digits(sympy.Integer(expr.q)))
    if isinstance(expr, sympy.Float):
        return max(1.0, abs(float(sympy.log(abs(expr), 10))) if expr != 0 else 1.0)
    if isinstance(expr, (sympy.Symbol, sympy.NumberSymbol, AppliedUndef)) or expr.is_Atom:
        return 1.0
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        if base in (sympy.S.One, sympy.S.NegativeOne, sympy.S.Zero):
            return digits(exponent)
        exp_digits = digits(exponent)
        if exp_digits > 15:
            return HUGE
        base_digits = digits(base)
        return max(base_digits, exp_digits, base_digits * _magnitude(exponent))
    if isinstance(expr, sympy.factorial):
        (n,) = expr.args
        n_digits = digits(n)
        if n_digits > 15:
            return HUGE
        value = _magnitude(n)
        return max(1.0, value * math.log10(max(value, 2.0)))
    if isinstance(expr, sympy.Mul):
        return sum(digits(arg) for arg in expr.args)
    return max((digits(arg) for arg in expr.args), default=1.0) + 1.0


def _magnitude(expr: sympy.Basic) -> float:
    """|value| of a small numeric expression as a float (1 for symbolic ones)."""
    if expr.free_symbols:
        return 1.0
    try:
        value = abs(complex(expr.evalf(15)))
    except (TypeError, ValueError, OverflowError):
        return HUGE
    return value if math.isfinite(value) else HUGE


def fold(expr: sympy.Basic, max_digits: int) -> tuple[sympy.Basic, bool]:
    """Evaluate every subtree whose estimated size is under ``max_digits``.

    Returns the folded expression and whether any subtree had to stay unevaluated (then
    only structural equality is safe).
    """
    if digits(expr) <= max_digits:
        try:
            return expr.doit(), False
        except (ValueError, TypeError, ZeroDivisionError, NotImplementedError):
            return expr, False
    if not expr.args:
        return expr, True
    folded = [fold(arg, max_digits) for arg in expr.args]
    args = [a for a, _ in folded]
    try:
        rebuilt = expr.func(*args, evaluate=False)
    except TypeError:
        rebuilt = expr.func(*args)
    return rebuilt, True
