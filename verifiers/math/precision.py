"""Numerical equality of exact closed forms, with precision that scales with what was written.

A fixed number of digits is not equality: at 40 digits ``e^{100}+1`` equals ``e^{100}`` (the 1
sits 44 digits below the leading one), ``\\ln 2+10^{-45}`` equals ``\\ln 2`` and
``x^2+10^{-30}x`` equals ``x^2``. The rule here: the *spread* of an answer is how many decimal
orders below its leading digits it wrote something (the largest ratio of terms inside one sum,
and the digits of every exact rational: an integer's units digit is written). Two values agree
when their difference is below 10^-(25 + spread) of the larger, both evaluated with
40 + spread digits, so a written difference is never rounded away however far below the
leading digit it sits, while a true identity (``\\sqrt2+\\sqrt3`` vs ``\\sqrt{5+2\\sqrt6}``)
leaves a residue 15 orders below the limit. Closed forms that pass are also checked by sympy's
adaptive evaluation of their difference, which finds differences no sum wrote
(``\\cos(10^{-20})`` is not 1, ``e^{\\pi\\sqrt{163}}`` is not ``640320^3+744``). That search
goes as deep as ``MAX_DIGITS`` working digits whatever the spread, because a function can hide
a difference far below anything written: ``\\tanh(100)`` is ``1 - 2e^{-200}``,
``\\cos(e^{-100})`` is ``1 - e^{-200}/2`` and ``2^{e^{-200}}`` is ``1 + e^{-200}\\ln 2``, none of
them 1 (a true identity costs the search a few tens of milliseconds before sympy gives up).

Beyond ``MAX_DIGITS`` working digits equality is not certified: a written spread that needs
more is refused (a false negative on values nobody writes), and a difference hidden more than
``MAX_DIGITS`` orders below the values (``2^{e^{-10000}}`` vs 1) is not found.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Sequence

import mpmath
import sympy
from sympy.core.evalf import PrecisionExhausted

MARGIN_DIGITS = 25
"""A difference must stay this many decimal orders below the smallest written term."""
BASE_DIGITS = 40
"""Working digits when every written term has the same magnitude (MARGIN_DIGITS + 15 guard)."""
MAX_DIGITS = 2_000
"""Most working digits spent on one comparison."""
_MAX_TERMS = 200
_ERRORS = (TypeError, ValueError, ZeroDivisionError, OverflowError, RecursionError,
           AttributeError, mpmath.libmp.libhyper.NoConvergence)


def evaluate(expr: sympy.Basic, subs: dict | None = None,
             digits: int = BASE_DIGITS) -> mpmath.mpc | None:
    """``expr`` (at ``subs``) to ``digits`` significant digits as an mpmath complex, in the
    caller's mpmath precision; None when undefined (a pole, infinity, a symbol left over)."""
    try:
        value = expr.evalf(digits, subs=subs) if subs else expr.evalf(digits)
        if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return None
        real, imag = (sympy.Float(part, digits) for part in value.as_real_imag())
    except _ERRORS:
        return None
    return mpmath.mpc(mpmath.mpf(real._mpf_), mpmath.mpf(imag._mpf_))


def spread(exprs: Sequence[sympy.Basic], subs: dict | None = None) -> int:
    """Decimal orders the answer wrote below its leading digits: the largest, over every
    sum inside ``exprs``, of log10(largest term / smallest nonzero term) (``e^{100}+1``: 44),
    and over every exact rational p/q, of log10(max(|p|, q)) (an integer's units digit is
    written: ``640320^3+744``: 18). Terms are read at 15 digits; at most 200 are read."""
    orders, read = 0.0, 0
    with mpmath.workdps(20):
        for expr in exprs:
            for node in sympy.preorder_traversal(expr):
                if isinstance(node, sympy.Rational) and node not in (0, 1, -1):
                    orders = max(orders, math.log10(max(abs(node.p), node.q)))
                elif isinstance(node, sympy.Add) and read < _MAX_TERMS:
                    sizes = [abs(v) for v in (evaluate(t, subs, 15) for t in node.args)
                             if v is not None and v != 0]
                    read += len(node.args)
                    if len(sizes) > 1:
                        orders = max(orders, float(mpmath.log10(max(sizes) / min(sizes))))
    return math.ceil(orders)


def _provably_different(x: sympy.Basic, y: sympy.Basic, digits: int) -> bool:
    """sympy's adaptive evaluation finds 15 correct digits of ``x - y`` within ``digits``
    of working precision (so it is not zero); it raises PrecisionExhausted on a true zero.
    ``digits`` must not depend on what the answer wrote: the cancellation that hides a
    difference happens inside a function (``\\tanh(100) - 1`` needs 87 digits)."""
    try:
        difference = x - y
        if difference == 0:
            return False
        value = difference.evalf(15, maxn=digits, strict=True)
        return bool(value.is_number and value != 0)
    except (PrecisionExhausted, *_ERRORS):
        return False


class TooPrecise(ValueError):
    """The comparison would need more than MAX_DIGITS working digits."""


@contextmanager
def evaluated(x: sympy.Basic, y: sympy.Basic, subs: dict | None = None,
              orders: int | None = None
              ) -> Iterator[tuple[mpmath.mpc, mpmath.mpc, mpmath.mpf] | None]:
    """``(x, y, rel)`` evaluated with 40 + spread digits, and the relative difference below
    which they agree (10^-(25 + spread)); None when either is undefined. The body runs at
    that precision, so arithmetic on the values keeps it. ``orders``: the spread when the
    caller knows it (a sample-point test reads it at its first point: the orders between
    written terms hardly move between points). Raises TooPrecise."""
    if orders is None:
        orders = spread((x, y), subs)
    digits = BASE_DIGITS + orders
    if digits > MAX_DIGITS:
        raise TooPrecise(f"{digits} digits")
    with mpmath.workdps(digits + 5):
        vx, vy = evaluate(x, subs, digits), evaluate(y, subs, digits)
        if vx is None or vy is None:
            yield None
        else:
            yield vx, vy, mpmath.mpf(10) ** -(MARGIN_DIGITS + orders)


def agree(x: sympy.Basic, y: sympy.Basic, subs: dict | None = None,
          orders: int | None = None) -> bool | None:
    """Whether ``x`` and ``y`` (numbers once ``subs`` is applied) agree within
    10^-(25 + spread) of the larger; closed forms that do must also not be provably
    different by sympy's adaptive evaluation (``\\cos(10^{-20})`` is not 1). None when
    either is undefined there. ``orders``: as for :func:`evaluated`."""
    if orders is None:
        orders = spread((x, y), subs)
    try:
        with evaluated(x, y, subs, orders) as values:
            if values is None:
                return None
            vx, vy, rel = values
            if abs(vx - vy) > rel * max(abs(vx), abs(vy)):
                return False
    except TooPrecise:
        return False
    return subs is not None or not _provably_different(x, y, MAX_DIGITS)


__all__ = ["BASE_DIGITS", "MARGIN_DIGITS", "MAX_DIGITS", "TooPrecise", "agree", "evaluate",
           "evaluated", "spread"]
