"""Equivalence of two parsed answers, with the rule that decided.

The rules, in the order they are tried (the module docstring of :mod:`rewardd.verifiers.math` lists
the user-facing conventions):

* **exact**: exact rational values compare exactly; integers never get a tolerance, and
  tiny or huge numbers are never merged by absolute rounding (``2^{-99} != 2^{-98}``).
* **rounding** (lenient only): a decimal literal with at least ``min_rounding_digits``
  significant digits equals a value it is a correct rounding of (``3.142`` is ``\\pi``).
* **tolerance**: a value written with decimals (or computed from them) equals another within
  the relative tolerance ``rel_tol``.
* **numeric**: closed forms without variables (``\\sqrt{8}`` vs ``2\\sqrt2``) agree within
  10^-(25 + spread) of the larger, evaluated with 40 + spread digits, where the spread is how
  far below the leading digits the answer wrote something (``e^{100}+1``: 44 orders), and are
  not provably different by sympy's adaptive evaluation
  (:mod:`rewardd.verifiers.math.precision`): a written difference is never rounded away.
* **identity**: expressions with variables are equal when they agree, by the same rule, at
  several fixed rational points (and their variables are the same): a numerical identity
  test that is faster than ``simplify`` and, unlike it, cannot hang on a hard identity.
  Equations and inequalities are equal when one side-difference is a constant multiple of
  the other (positive for inequalities).
* **size_guard**: values too big to compute are compared structurally (see
  :mod:`rewardd.verifiers.math.guards`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from itertools import permutations
from typing import Literal, Sequence

import mpmath
import sympy
from sympy.core.relational import Relational

from rewardd.verifiers.math.answer import (Collection, ExprLeaf, Interval, Matrix, Node, NumberLeaf,
                                   TextLeaf, Union_)
from rewardd.verifiers.math.guards import fold
from rewardd.verifiers.math.labels import Labelled
from rewardd.verifiers.math.matrices import (Determinant, evaluate_matrix_expression,
                                          is_matrix_expression)
from rewardd.verifiers.math.normalize import Annotations
from rewardd.verifiers.math.numbers import Number
from rewardd.verifiers.math.precision import TooPrecise, agree, evaluated, spread
from rewardd.verifiers.math.precision import evaluate as _evaluate

Verdict = tuple[bool, str]
PercentMode = Literal["either", "fraction", "number"]

_PRECISION = 40
_POINTS = (sympy.Rational(7, 5), sympy.Rational(-13, 10), sympy.Rational(23, 7),
           sympy.Rational(-5, 9), sympy.Rational(19, 11), sympy.Rational(-29, 13),
           sympy.Rational(3, 17))


@dataclass(frozen=True, slots=True)
class Options:
    lenient: bool = True
    percent: PercentMode = "either"
    min_rounding_digits: int = 4
    rel_tol: float = 1e-9
    max_digits: int = 20_000


def equivalent(reference: Node, prediction: Node, options: Options) -> Verdict:
    """Whether ``prediction`` says what ``reference`` says, and the rule that decided."""
    with mpmath.workdps(_PRECISION):
        return _equivalent(_canonical(reference), _canonical(prediction), options)


def _equivalent(a: Node, b: Node, options: Options) -> Verdict:
    if isinstance(a, Labelled) or isinstance(b, Labelled):
        return _labelled(a, b, options)
    if isinstance(a, Determinant) or isinstance(b, Determinant):
        return _determinant(a, b, options)
    a, b = _as_interval_against(a, b), _as_interval_against(b, a)
    if isinstance(a, Union_) or isinstance(b, Union_):
        return _union(a, b, options)
    if isinstance(a, Interval) or isinstance(b, Interval):
        return _interval(a, b, options)
    if isinstance(a, Matrix) or isinstance(b, Matrix):
        return _matrix(a, b, options)
    if isinstance(a, Collection) or isinstance(b, Collection):
        return _collection(a, b, options)
    if isinstance(a, TextLeaf) or isinstance(b, TextLeaf):
        same = isinstance(a, TextLeaf) and isinstance(b, TextLeaf) and a.text == b.text
        return same, "text"
    return _scalar(a, b, options)


# --------------------------------------------------------------------------- structure


def _canonical(node: Node) -> Node:
    """Turn sympy sets, tuples and matrices inside a leaf into the structural nodes."""
    if not isinstance(node, ExprLeaf):
        return node
    expr = node.expr
    if is_matrix_expression(expr):
        expr = evaluate_matrix_expression(expr)  # A + B, 2A, A^{-1}
    if isinstance(expr, sympy.FiniteSet):
        return Collection("set", tuple(_canonical(ExprLeaf(e)) for e in expr.args))
    if isinstance(expr, sympy.Interval):
        return Interval(not expr.left_open, ExprLeaf(expr.start), ExprLeaf(expr.end),
                        not expr.right_open)
    if isinstance(expr, sympy.Union):
        return Union_(tuple(_canonical(ExprLeaf(e)) for e in expr.args))
    if isinstance(expr, sympy.Tuple):
        return Collection("tuple", tuple(_canonical(ExprLeaf(e)) for e in expr.args))
    if isinstance(expr, sympy.MatrixBase):
        return Matrix(tuple(tuple(ExprLeaf(expr[i, j]) for j in range(expr.cols))
                            for i in range(expr.rows)))
    if (isinstance(expr, sympy.Eq) and isinstance(expr.lhs, sympy.Symbol)
            and isinstance(expr.rhs, sympy.Set)):
        return _canonical(ExprLeaf(expr.rhs))  # "x \in [1, 2]"
    return node


def _labelled(a: Node, b: Node, options: Options) -> Verdict:
    """``AB = 4``: the same label and an equal value; the value alone (lenient); an answer
    labelled otherwise, or an equation, is compared with the whole equation."""
    if isinstance(a, Labelled) and isinstance(b, Labelled):
        if a.label == b.label:
            return equivalent(a.value, b.value, options)[0], "labelled"
        if a.relation is None or b.relation is None:
            return False, "label_mismatch"
        return equivalent(a.relation, b.relation, options)[0], "relation"
    labelled, other = (a, b) if isinstance(a, Labelled) else (b, a)
    assert isinstance(labelled, Labelled)
    if _label_of(other) is not None or (isinstance(other, ExprLeaf)
                                        and _is_relation(other.expr)):
        if labelled.relation is None:
            return False, "label_mismatch"
        return equivalent(labelled.relation, other, options)[0], "relation"
    if not options.lenient:
        return False, "kind_mismatch"
    return equivalent(labelled.value, other, options)[0], "label"


def _label_of(node: Node) -> str | None:
    """The label of ``AB = 4`` or of an assignment ``x = 5``; None for anything else."""
    if isinstance(node, Labelled):
        return node.label
    if isinstance(node, ExprLeaf) and isinstance(node.expr, sympy.Eq) \
            and isinstance(node.expr.lhs, sympy.Symbol) \
            and node.expr.lhs not in node.expr.rhs.free_symbols:
        return node.expr.lhs.name
    return None


def _determinant(a: Node, b: Node, options: Options) -> Verdict:
    """A ``vmatrix`` against a number is its value; against a matrix, the same entries."""
    det, other = (a, b) if isinstance(a, Determinant) else (b, a)
    assert isinstance(det, Determinant)
    if isinstance(other, Determinant):
        other = other.matrix
    if isinstance(other, Matrix):
        return _matrix(det.matrix, other, options)
    cells = [[_cell_value(c) for c in row] for row in det.matrix.rows]
    if len(cells) != len(cells[0]) or any(c is None for row in cells for c in row):
        return False, "kind_mismatch"
    try:
        value = sympy.Matrix(cells).det()
    except (ValueError, TypeError, ArithmeticError):
        return False, "kind_mismatch"
    return equivalent(ExprLeaf(value), other, options)[0], "determinant"


def _cell_value(node: Node) -> sympy.Basic | None:
    """A matrix entry as a sympy value, variables allowed (``ad - bc``)."""
    if isinstance(node, NumberLeaf):
        return sympy.Rational(node.number.value.numerator, node.number.value.denominator)
    return _exact_decimals(node.expr) if isinstance(node, ExprLeaf) else None


def _union(a: Node, b: Node, options: Options) -> Verdict:
    if options.lenient:
        a, b = _relation_as_set(a, b), _relation_as_set(b, a)
    parts_a = a.parts if isinstance(a, Union_) else (a,)
    parts_b = b.parts if isinstance(b, Union_) else (b,)
    if _unordered(parts_a, parts_b, options):
        return True, "union"
    return _same_real_set(a, b), "union"


def _same_real_set(a: Node, b: Node) -> bool:
    """Fallback for sets of reals written differently (``[0,1] \\cup [1,2]`` is ``[0,2]``):
    build both as sympy sets, which merge and order themselves, and compare."""
    set_a, set_b = _as_sympy_set(a), _as_sympy_set(b)
    if set_a is None or set_b is None:
        return False
    try:
        return bool(set_a == set_b)
    except (TypeError, ValueError):
        return False


def _as_sympy_set(node: Node) -> sympy.Set | None:
    node = _open_pair_as_interval(node)
    try:
        if isinstance(node, Union_):
            parts = [_as_sympy_set(p) for p in node.parts]
            return None if any(p is None for p in parts) else sympy.Union(*parts)
        if isinstance(node, Interval):
            low, high = _as_sympy_value(node.low), _as_sympy_value(node.high)
            if low is None or high is None:
                return None
            return sympy.Interval(low, high, not node.left_closed, not node.right_closed)
        if isinstance(node, Collection) and node.kind == "set":
            values = [_as_sympy_value(i) for i in node.items]
            return None if any(v is None for v in values) else sympy.FiniteSet(*values)
        if isinstance(node, ExprLeaf) and isinstance(node.expr, sympy.Set):
            return node.expr.doit()  # latex2sympy leaves \\setminus unevaluated
    except (TypeError, ValueError, NotImplementedError):
        return None
    return None


def _as_sympy_value(node: Node) -> sympy.Basic | None:
    if isinstance(node, NumberLeaf):
        return sympy.Rational(node.number.value.numerator, node.number.value.denominator)
    if isinstance(node, ExprLeaf) and not node.expr.free_symbols:
        folded, huge = fold(_exact_decimals(node.expr), 1000)
        return None if huge else folded
    return None


def _interval(a: Node, b: Node, options: Options) -> Verdict:
    if options.lenient:
        a, b = _relation_as_set(a, b), _relation_as_set(b, a)
    a, b = _open_pair_as_interval(a), _open_pair_as_interval(b)
    if not (isinstance(a, Interval) and isinstance(b, Interval)):
        return _same_real_set(a, b), "interval"
    if a.left_closed != b.left_closed or a.right_closed != b.right_closed:
        return False, "interval"
    same = (equivalent(a.low, b.low, options)[0] and equivalent(a.high, b.high, options)[0])
    return same, "interval"


def _as_interval_against(node: Node, other: Node) -> Node:
    """Read an ambiguous ``(a, b)`` as an interval when the other side is a set of reals."""
    other_is_set = isinstance(other, (Interval, Union_)) or (
        isinstance(other, ExprLeaf) and isinstance(other.expr, (Relational, sympy.And)))
    return _open_pair_as_interval(node) if other_is_set else node


def _open_pair_as_interval(node: Node) -> Node:
    """``(1, 2)`` is both a point and an open interval: as an interval here."""
    if isinstance(node, Collection) and node.kind == "pair_or_interval":
        return Interval(False, node.items[0], node.items[1], False)
    return node


def _relation_as_set(node: Node, other: Node) -> Node:
    """An inequality in one variable, or in one function value (``0 < f(x) < 1``), as the
    interval(s) it describes (lenient mode), when the other side is an interval or union."""
    if not isinstance(other, (Interval, Union_)):
        return node
    if isinstance(node, Collection) and node.kind == "list":  # "x < -2 or x > 2"
        exprs = [item.expr for item in node.items if isinstance(item, ExprLeaf)]
        if len(exprs) == len(node.items) and all(_is_relation(e) for e in exprs):
            node = ExprLeaf(sympy.Or(*exprs, evaluate=False))
    if not isinstance(node, ExprLeaf):
        return node
    expr = node.expr
    functions = expr.atoms(sympy.core.function.AppliedUndef)
    if len(functions) == 1:  # 0 < f(x) < 1 bounds the quantity f(x), as 0 < y < 1 bounds y
        expr = expr.subs(functions.pop(), sympy.Dummy("bounded"))
    if not (isinstance(expr, (Relational, sympy.And, sympy.Or))
            and len(expr.free_symbols) == 1):
        return node
    try:
        return _canonical(ExprLeaf(expr.as_set()))
    except (NotImplementedError, TypeError, ValueError):
        return node


def _matrix(a: Node, b: Node, options: Options) -> Verdict:
    if options.lenient and not (isinstance(a, Matrix) and isinstance(b, Matrix)):
        a, b = _vector_as_tuple(a), _vector_as_tuple(b)  # a column vector vs (1, 2)
        if isinstance(a, Collection) and isinstance(b, Collection):
            return _collection(a, b, options)
    if not (isinstance(a, Matrix) and isinstance(b, Matrix)):
        return False, "kind_mismatch"
    if len(a.rows) != len(b.rows) or len(a.rows[0]) != len(b.rows[0]):
        return False, "matrix_shape"
    same = all(equivalent(x, y, options)[0]
               for row_a, row_b in zip(a.rows, b.rows) for x, y in zip(row_a, row_b))
    return same, "matrix"


def _vector_as_tuple(node: Node) -> Node:
    if isinstance(node, Matrix) and (len(node.rows) == 1 or len(node.rows[0]) == 1):
        cells = tuple(c for row in node.rows for c in row)
        return Collection("tuple", cells)
    return node


def _collection(a: Node, b: Node, options: Options) -> Verdict:
    if not isinstance(a, Collection) or not isinstance(b, Collection):
        single = a if isinstance(a, Collection) else b
        other = b if single is a else a
        if options.lenient and single.kind in ("set", "list") and len(single.items) == 1:
            return equivalent(single.items[0], other, options)[0], "singleton"
        return False, "kind_mismatch"
    unordered = {"set", "list"}
    if (named := _named_against_values(a, b)) is not None:
        return named and all(equivalent(x, y, options)[0] for x, y in zip(a.items, b.items)), \
            "labelled"
    if a.kind in unordered and b.kind in unordered:
        if a.kind != b.kind and not options.lenient:
            return False, "kind_mismatch"
        return _unordered(a.items, b.items, options), "set"
    if a.kind in unordered or b.kind in unordered:
        listed = a.kind == "list" or b.kind == "list"
        if not (options.lenient and listed):
            return False, "kind_mismatch"
    if len(a.items) != len(b.items):
        return False, "tuple"
    return all(equivalent(x, y, options)[0] for x, y in zip(a.items, b.items)), "tuple"


def _named_against_values(a: Collection, b: Collection) -> bool | None:
    """``AB=4, CD=5`` (distinct labels) against bare values ``4, 5``: the values answer in
    the order of the labels, so ``5, 4`` is wrong. None where this does not apply (no such
    labels, the same label repeated: ``x=2, x=3`` is a set of solutions)."""
    for named, values in ((a, b), (b, a)):
        labels = [_label_of(i) for i in named.items]
        if (None not in labels and len(set(labels)) == len(labels) > 1
                and all(_label_of(i) is None for i in values.items)):
            return len(named.items) == len(values.items)
    return None


def _unordered(items_a: Sequence[Node], items_b: Sequence[Node], options: Options) -> bool:
    """Every element of each side equals some element of the other (duplicates ignored)."""
    def covered(xs: Sequence[Node], ys: Sequence[Node]) -> bool:
        return all(any(equivalent(x, y, options)[0] for y in ys) for x in xs)
    return covered(items_a, items_b) and covered(items_b, items_a)


# --------------------------------------------------------------------------- scalars


def _scalar(a: Node, b: Node, options: Options) -> Verdict:
    notes_a, notes_b = a.notes, b.notes  # type: ignore[union-attr]
    if notes_a.unit and notes_b.unit and notes_a.unit != notes_b.unit:
        return False, "unit_mismatch"
    if isinstance(a, ExprLeaf) and isinstance(b, ExprLeaf):
        rel_a, rel_b = _is_relation(a.expr), _is_relation(b.expr)
        if rel_a and rel_b:
            return _relations(a.expr, b.expr, options)
    for side, other in ((a, b), (b, a)):
        if isinstance(side, ExprLeaf) and _is_relation(side.expr):
            if isinstance(other, ExprLeaf) and _is_relation(other.expr):
                continue
            value = _assigned_value(side.expr)
            if value is None or not options.lenient:
                return False, "kind_mismatch"
            same, _ = _scalar(ExprLeaf(value, side.notes), other, options)
            return same, "assignment"
    best: Verdict = (False, "different")
    for x in _readings(a, b, options):
        for y in _readings(b, a, options):
            verdict = _values(x, y, options)
            if verdict[0]:
                return verdict
            if verdict[1] == "size_guard":
                best = verdict
    return best


def _is_relation(expr: sympy.Basic) -> bool:
    return isinstance(expr, (Relational, sympy.And))


def _assigned_value(expr: sympy.Basic) -> sympy.Basic | None:
    """``x = 5`` -> 5 (one bare variable on one side of an equation)."""
    if not isinstance(expr, sympy.Eq):
        return None
    if isinstance(expr.lhs, sympy.Symbol) and expr.lhs not in expr.rhs.free_symbols:
        return expr.rhs
    if isinstance(expr.rhs, sympy.Symbol) and expr.rhs not in expr.lhs.free_symbols:
        return expr.lhs
    return None


Value = Number | sympy.Basic


def _readings(node: Node, other: Node, options: Options) -> list[Value]:
    """The values a leaf may mean: percent and degree marks can be read more than one way."""
    notes: Annotations = node.notes  # type: ignore[union-attr]
    base: Value = node.number if isinstance(node, NumberLeaf) else node.expr  # type: ignore[union-attr]
    readings: list[Value] = []
    if notes.percent:
        fraction = _scale(base, Fraction(1, 100))
        readings = {"either": [fraction, base], "fraction": [fraction],
                    "number": [base]}[options.percent]
    else:
        readings = [base]
    if notes.degrees and options.lenient and _mentions_pi(other):
        readings += [_scale_expr(r, sympy.pi / 180) for r in readings]
    return readings


def _mentions_pi(node: Node) -> bool:
    return isinstance(node, ExprLeaf) and node.expr.has(sympy.pi)


def _scale(value: Value, factor: Fraction) -> Value:
    if isinstance(value, Number):
        places = None if value.places is None else value.places + 2
        return Number(value.value * factor, places, value.significant)
    return sympy.Mul(value, sympy.Rational(factor.numerator, factor.denominator))


def _scale_expr(value: Value, factor: sympy.Basic) -> sympy.Basic:
    if isinstance(value, Number):
        value = sympy.Rational(value.value.numerator, value.value.denominator)
    return sympy.Mul(value, factor)


def _values(x: Value, y: Value, options: Options) -> Verdict:
    if isinstance(x, Number) and isinstance(y, Number):
        return _numbers(x, y, options)
    if isinstance(x, Number) or isinstance(y, Number):
        number, expr = (x, y) if isinstance(x, Number) else (y, x)
        return _number_vs_expr(number, expr, options)  # type: ignore[arg-type]
    return _exprs(x, y, options)


def _numbers(x: Number, y: Number, options: Options) -> Verdict:
    if x.value == y.value:
        return True, "exact"
    if x.is_decimal and y.is_decimal:  # two approximations: a relative tolerance
        return _within(x.value, y.value, options.rel_tol), "tolerance"
    for written, other in ((x, y), (y, x)):  # an approximation of an exact value
        if written.is_decimal and _rounds_to(written, other.value, options):
            return True, "rounding"
    return False, "exact"


def _within(x: Fraction | mpmath.mpf, y: Fraction | mpmath.mpf, rel_tol: float) -> bool:
    return abs(x - y) <= Fraction(rel_tol) * max(abs(x), abs(y)) if isinstance(x, Fraction) \
        else abs(x - y) <= rel_tol * max(abs(x), abs(y))


def _rounds_to(written: Number, value: Fraction | mpmath.mpf, options: Options) -> bool:
    """``written`` is ``value`` rounded to the decimal places it shows (lenient mode)."""
    if not options.lenient or written.significant < options.min_rounding_digits:
        return False
    half_unit = Fraction(1, 2 * 10 ** written.places)  # type: ignore[operator]
    if isinstance(value, Fraction):
        return abs(written.value - value) <= half_unit
    return abs(mpmath.mpf(written.value.numerator) / written.value.denominator - value) \
        <= mpmath.mpf(half_unit.numerator) / half_unit.denominator


def _number_vs_expr(number: Number, expr: sympy.Basic, options: Options) -> Verdict:
    folded, huge = fold(_exact_decimals(expr), options.max_digits)
    if huge:
        return False, "size_guard"
    if folded.free_symbols:  # sin^2 x + cos^2 x is a number too
        constant = sympy.Rational(number.value.numerator, number.value.denominator)
        return _identical(folded, constant), "identity"
    if isinstance(folded, sympy.Rational):
        return _numbers(number, Number(Fraction(folded.p, folded.q)), options)
    if not number.is_decimal and not expr.atoms(sympy.Float):  # 1 vs sin^2(1) + cos^2(1)
        exact = sympy.Rational(number.value.numerator, number.value.denominator)
        return agree(exact, folded) is True, "numeric"
    value = _evaluate(folded)
    if value is None or value.imag != 0:
        return False, "numeric"
    value = value.real
    if number.is_decimal and expr.atoms(sympy.Float):  # decimals on both sides
        written = mpmath.mpf(number.value.numerator) / number.value.denominator
        return _within(written, value, options.rel_tol), "tolerance"
    return (number.is_decimal and _rounds_to(number, value, options)), "rounding"


def _exact_decimals(expr: sympy.Basic) -> sympy.Basic:
    """Decimal literals inside an expression as the exact rationals they were written as
    (latex2sympy makes ``0.1`` a binary float, which is not 1/10)."""
    floats = expr.atoms(sympy.Float)
    if not floats:
        return expr
    return expr.xreplace({f: sympy.Rational(str(f)) for f in floats})


def _exprs(x: sympy.Basic, y: sympy.Basic, options: Options) -> Verdict:
    inexact = bool(x.atoms(sympy.Float) or y.atoms(sympy.Float))
    fx, huge_x = fold(_exact_decimals(x), options.max_digits)
    fy, huge_y = fold(_exact_decimals(y), options.max_digits)
    if huge_x or huge_y:
        return fx == fy, "size_guard"
    if fx == fy:
        return True, "exact"
    if _infinite(fx) or _infinite(fy):
        return False, "exact"
    if not fx.free_symbols and not fy.free_symbols:
        if isinstance(fx, sympy.Rational) and isinstance(fy, sympy.Rational):
            return False, "exact"
        if not inexact:
            return agree(fx, fy) is True, "numeric"
        vx, vy = _evaluate(fx), _evaluate(fy)
        if vx is None or vy is None:
            return False, "numeric"
        return _close(vx, vy, options.rel_tol), "numeric"
    try:
        difference = fx - fy
    except TypeError:  # a set minus a number, and the like: not the same kind of thing
        return False, "kind_mismatch"
    if not inexact:
        return _identical(fx, fy), "identity"
    return _identity(difference, options.rel_tol), "identity"


def _infinite(expr: sympy.Basic) -> bool:
    return expr in (sympy.oo, -sympy.oo, sympy.zoo)


def _close(x: mpmath.mpc, y: mpmath.mpc, tol: mpmath.mpf | float) -> bool:
    scale = max(abs(x), abs(y))
    return abs(x - y) <= tol * scale if scale else True


def _point(symbols: Sequence[sympy.Symbol], k: int) -> dict:
    return {s: _POINTS[(k + 3 * i) % len(_POINTS)] + sympy.Rational(i, 7)
            for i, s in enumerate(symbols)}


def _identical(x: sympy.Basic, y: sympy.Basic) -> bool:
    """Exact expressions ``x`` and ``y`` agree at every sample point where both are defined
    (at least 3), each point with the precision its written terms need
    (:func:`rewardd.verifiers.math.precision.agree`): ``x^2+10^{-30}x`` is not ``x^2``."""
    symbols = sorted(x.free_symbols | y.free_symbols, key=lambda s: s.name)
    defined, orders = 0, None
    for k in range(len(_POINTS)):
        point = _point(symbols, k)
        orders = spread((x, y), point) if orders is None else orders
        same = agree(x, y, point, orders)
        if same is None:
            continue
        if not same:
            return False
        defined += 1
    return defined >= 3


def _identity(difference: sympy.Basic, tol: mpmath.mpf | float) -> bool:
    """``difference`` vanishes at every sample point where it is defined (at least 3)."""
    symbols = sorted(difference.free_symbols, key=lambda s: s.name)
    defined = 0
    for k in range(len(_POINTS)):
        value = _evaluate(difference, _point(symbols, k))
        if value is None:
            continue
        scale = _scale_at(difference, symbols, k)
        if abs(value) > tol * max(scale, mpmath.mpf(1)):
            return False
        defined += 1
    return defined >= 3


def _scale_at(difference: sympy.Basic, symbols: Sequence[sympy.Symbol], k: int) -> mpmath.mpf:
    """The magnitude of the terms of ``difference`` at point k (relative tolerance base)."""
    terms = sympy.Add.make_args(difference)
    values = [_evaluate(t, _point(symbols, k)) for t in terms]
    return max((abs(v) for v in values if v is not None), default=mpmath.mpf(1))


def _relations(x: sympy.Basic, y: sympy.Basic, options: Options) -> Verdict:
    if x == y:  # identical relations, even of functions no point can evaluate: f(y) = y
        return True, "relation"
    parts_x, parts_y = _conjuncts(x), _conjuncts(y)
    if len(parts_x) != len(parts_y):
        if options.lenient and (len(parts_x) > 1 or len(parts_y) > 1):
            return _sets_of(x, y)
        return False, "relation"
    if len(parts_x) == 1:
        return _relation(parts_x[0], parts_y[0], options), "relation"
    for order in permutations(parts_y):
        if all(_relation(a, b, options) for a, b in zip(parts_x, order)):
            return True, "relation"
    return (_sets_of(x, y) if options.lenient else (False, "relation"))


def _sets_of(x: sympy.Basic, y: sympy.Basic) -> Verdict:
    try:
        if len(x.free_symbols) == 1 and x.free_symbols == y.free_symbols:
            return x.as_set() == y.as_set(), "relation"
    except (NotImplementedError, TypeError, ValueError):
        pass
    return False, "relation"


def _conjuncts(expr: sympy.Basic) -> list[sympy.Basic]:
    return list(expr.args) if isinstance(expr, sympy.And) else [expr]


_KIND = {sympy.Eq: "eq", sympy.Ne: "ne", sympy.StrictLessThan: "lt",
         sympy.LessThan: "le", sympy.StrictGreaterThan: "lt", sympy.GreaterThan: "le"}


def _normal(rel: sympy.Basic) -> tuple[str, sympy.Basic] | None:
    """(kind, f) with the relation read as ``f <kind> 0`` (``>`` flipped to ``<``)."""
    kind = _KIND.get(type(rel))
    if kind is None:
        return None
    lhs, rhs = rel.args
    if isinstance(rel, (sympy.StrictGreaterThan, sympy.GreaterThan)):
        lhs, rhs = rhs, lhs
    return kind, sympy.Add(lhs, sympy.Mul(-1, rhs))


def _relation(x: sympy.Basic, y: sympy.Basic, options: Options) -> bool:
    nx, ny = _normal(x), _normal(y)
    if nx is None or ny is None or nx[0] != ny[0]:
        return False
    kind = nx[0]
    fx, huge_x = fold(_exact_decimals(nx[1]), options.max_digits)
    fy, huge_y = fold(_exact_decimals(ny[1]), options.max_digits)
    if huge_x or huge_y:
        return fx == fy
    if fx.free_symbols != fy.free_symbols:
        return False
    if not fx.free_symbols:
        return bool(sympy.Eq(fx, 0) == sympy.Eq(fy, 0))
    return _proportional(fx, fy, positive=kind in ("lt", "le"))


def _proportional(f: sympy.Basic, g: sympy.Basic, positive: bool) -> bool:
    """``f = c * g`` for one nonzero constant c (c > 0 when ``positive``), tested at the
    sample points with the precision the written terms need (``y = x^2 + 10^{-30}x`` is not
    ``y = x^2``): c is read at the first point, then ``f - c g`` must vanish at the others
    within 10^-(25 + spread) of the larger."""
    symbols = sorted(f.free_symbols, key=lambda s: s.name)
    ratio, checked, orders = None, 0, None
    for k in range(len(_POINTS)):
        point = _point(symbols, k)
        orders = spread((f, g), point) if orders is None else orders
        try:
            with evaluated(f, g, point, orders) as values:
                if values is None:
                    continue
                fv, gv, rel = values
                scale = max(abs(fv), abs(gv))
                if abs(gv) <= rel * scale:
                    if abs(fv) > rel * scale:
                        return False
                    continue
                if ratio is None:
                    ratio = fv / gv
                    if (abs(mpmath.im(ratio)) > rel * abs(ratio)
                            or (positive and mpmath.re(ratio) <= 0)):
                        return False
                    ratio = mpmath.re(ratio)
                elif abs(fv - ratio * gv) > rel * max(abs(fv), abs(ratio * gv)):
                    return False
        except TooPrecise:
            return False
        checked += 1
    return checked >= 3
