"""Parse an answer string into a small tree: numbers, expressions, relations, collections.

The structure (sets, tuples, intervals, unions, matrices, bare lists of answers) is read here,
by bracket matching, rather than by latex2sympy2_extended, because the grammar must make
choices a grader should not make silently: ``(1,2)`` is both a point and an open interval, a
bare ``1, 2`` is a list of solutions in any order, ``1,000`` is a number. Leaves go to the
exact number reader (:mod:`rewardd.verifiers.math.numbers`) and otherwise to latex2sympy2_extended,
the library that does LaTeX -> sympy well; plain text goes through the same LaTeX parser after
:mod:`rewardd.verifiers.math.normalize`, never through ``sympy.parse_expr`` (which ``eval``s its input).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Literal, Union

import sympy

from rewardd.verifiers.math.labels import Labelled, is_named_quantity, label_key, read_sides, written_ratio
from rewardd.verifiers.math.matrices import Determinant, is_single_environment, unwrap
from rewardd.verifiers.math.normalize import Annotations, clean, matching_close, split_annotations, strip_outer
from rewardd.verifiers.math.numbers import Number, arithmetic, parse_number

MAX_SYMPY_CHARS = 2_000
"""Longest leaf handed to the LaTeX grammar; longer leaves are unparseable (size guard: the
ANTLR grammar runs at roughly a millisecond per character)."""

CollectionKind = Literal["set", "tuple", "list", "pair_or_interval"]


class Unparseable(ValueError):
    """The answer text is not mathematics this parser understands."""


@dataclass(frozen=True, slots=True)
class NumberLeaf:
    number: Number
    notes: Annotations = Annotations()


@dataclass(frozen=True, slots=True)
class ExprLeaf:
    """A sympy expression or relation (Eq, <, <=, And of relations), unevaluated."""

    expr: sympy.Basic
    notes: Annotations = Annotations()


@dataclass(frozen=True, slots=True)
class TextLeaf:
    text: str


@dataclass(frozen=True, slots=True)
class Collection:
    kind: CollectionKind
    items: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class Interval:
    left_closed: bool
    low: "Node"
    high: "Node"
    right_closed: bool


@dataclass(frozen=True, slots=True)
class Union_:
    parts: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class Matrix:
    rows: tuple[tuple["Node", ...], ...] = field(default=())


Node = Union[NumberLeaf, ExprLeaf, TextLeaf, Collection, Interval, Union_, Matrix, Labelled,
             Determinant]

_MATRIX = re.compile(r"^\\begin\{([pbBvV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$",
                     re.DOTALL)
_JUXTAPOSED_NUMBERS = re.compile(r"^[+-]?\d+(?:\.\d+)?(?:(?:\s|~|\\[,:;! ])+\d+(?:\.\d+)?)+$")
"""Numbers side by side with only space between them (what is left once thousands separators
and mixed numbers have been read): latex2sympy2_extended takes ``1 2`` for the mixed number
1 + 2 = 3, so ``10 20`` would match an answer of 30. Nobody writes a sum that way; such text
is no answer. Only a leaf made of such numbers alone is refused (``\\log_2 8`` is a
logarithm, ``\\frac 1 2`` a fraction)."""
_OR_WORDS = re.compile(r"\s*(?:\\text\{\s*or\s*\}|\sor\s|;|\\lor(?![a-zA-Z])|\\vee(?![a-zA-Z]))\s*")
_AND_WORDS = re.compile(r"\s*(?:\\text\{\s*and\s*\}|\sand\s|\\land(?![a-zA-Z])|\\wedge(?![a-zA-Z]))\s*")
_WRAPPED_TEXT = re.compile(r"^\\(?:text|textrm|mathrm|mbox|operatorname)\s*\{([^{}]*)\}$")
_TEXT = re.compile(r"^(?:\\text\{\s*([A-Za-z][A-Za-z \-']*)\s*\}|([A-Za-z][A-Za-z \-']*))$")
_WORD_LIKE = re.compile(r"[A-Za-z]{3,}")
_LATEX_WORDS = frozenset(
    "sin cos tan cot sec csc sinh cosh tanh log ln exp sqrt frac pi infty arcsin arccos "
    "arctan det lim max min gcd lcm mod binom cdot times dfrac tfrac".split())
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def parse(text: str, max_digits: int) -> Node:
    """Parse a cleaned-or-raw answer string into a :data:`Node`; raises Unparseable."""
    text = clean(text)
    if not text:
        raise Unparseable("empty answer")
    return _parse(text, max_digits, depth=0)


def _parse(text: str, max_digits: int, depth: int) -> Node:
    if depth > 50:
        raise Unparseable("answer nested more than 50 levels deep")
    text = _strip_redundant_parens(strip_outer(text))
    if not text:
        raise Unparseable("empty element")
    if (number := parse_number(text, max_digits)) is not None:  # before commas: 1,000
        return NumberLeaf(number)
    if (m := _MATRIX.match(unwrap(text))) is not None and is_single_environment(m.group(2)):
        matrix = _matrix(m.group(2), max_digits, depth)
        return Determinant(matrix) if m.group(1) == "vmatrix" else matrix
    parts = _split_top(text, r"\cup")
    if len(parts) > 1:
        return Union_(tuple(_parse(p, max_digits, depth + 1) for p in parts))
    bracketed = _bracketed(text)
    if bracketed is not None:
        opening, inner, closing = bracketed
        items = _split_top(inner, ",")
        if opening == "\\{":
            return Collection("set", tuple(_parse(i, max_digits, depth + 1) for i in items
                                           if i.strip()))
        if len(items) == 1 and opening == "(" and closing == ")":
            return _parse(inner, max_digits, depth + 1)  # redundant parentheses
        if len(items) == 2 and (opening, closing) != ("(", ")"):
            low, high = (_parse(i, max_digits, depth + 1) for i in items)
            return Interval(opening == "[", low, high, closing == "]")
        if len(items) >= 2 and (opening, closing) in (("(", ")"), ("[", "]")):
            kind: CollectionKind = "pair_or_interval" if len(items) == 2 else "tuple"
            return Collection(kind, tuple(_parse(i, max_digits, depth + 1) for i in items))
    if text == "\\emptyset":
        return Collection("set", ())
    groups = [g for g in _split_top(text, ";") if g.strip()]
    if len(groups) > 1 and all("," in g for g in groups):  # p=5,q=2;p=7,q=2: two solutions
        return Collection("list", tuple(_parse(g, max_digits, depth + 1) for g in groups))
    items = [_LEADING_CONNECTIVE.sub("", i) for i in _split_top(text, ",")]  # 19, 46, and 82
    if len(items) == 1:
        items = [p for p in _OR_WORDS.split(text) if p.strip()]
    if len(items) > 1:
        return _list(items, max_digits, depth)
    conjuncts = [p for p in _AND_WORDS.split(text) if p.strip()]
    if len(conjuncts) > 1:
        parts = [_parse(p, max_digits, depth + 1) for p in conjuncts]
        if all(isinstance(p, ExprLeaf) and isinstance(p.expr, sympy.core.relational.Relational)
               for p in parts) and not _solutions_of_one_unknown(parts):  # "x > 1 and x < 3"
            return ExprLeaf(sympy.And(*(p.expr for p in parts), evaluate=False))
        return Collection("list", tuple(parts))
    if (labelled := _labelled(text, max_digits, depth)) is not None:
        return labelled
    return _leaf(text, max_digits)


_LEADING_CONNECTIVE = re.compile(r"^\s*(?:\\text\{\s*(?:and|or)\s*\}|and\b|or\b)\s*")


def _list(texts: list[str], max_digits: int, depth: int) -> Collection:
    """A bare list of the items' texts; an unbracketed item that is a list itself (``21, 16``
    or ``11``: ``16 or 11``) adds its items (issue 31); ``(0;0;0)`` stays one item."""
    flat: list[Node] = []
    for text in (t for t in texts if t.strip()):
        item = _parse(text, max_digits, depth + 1)
        bracketed = text.strip()[:1] in "([{" or text.strip().startswith("\\left")
        flat.extend(item.items if isinstance(item, Collection) and item.kind == "list"
                    and not bracketed else (item,))
    return Collection("list", tuple(flat))


def _solutions_of_one_unknown(parts: list[Node]) -> bool:
    """``p = -1 and p = 15/8``: one symbol given different values is a list of solutions (it
    cannot be both), not a conjunction."""
    exprs = [p.expr for p in parts if isinstance(p, ExprLeaf)]
    return (len(exprs) == len(parts)
            and all(isinstance(e, sympy.Equality) and isinstance(e.lhs, sympy.Symbol)
                    for e in exprs)
            and len({e.lhs for e in exprs}) == 1 and len({e.rhs for e in exprs}) == len(exprs))


def _labelled(text: str, max_digits: int, depth: int) -> Node | None:
    """``AB = 4`` as a labelled value, ``x = 5+5+1 = 11`` as ``x = 11``, ``2+3 = 5 = 5`` as
    its last side (:mod:`rewardd.verifiers.math.labels`); None for any other text. A chain's
    ``\\approx`` tail is an approximation of the exact side before it, not the answer
    (``x = 5+5+1 = 1/3 \\approx 11`` is ``x = 1/3``, issue 31)."""
    approximate = _split_top(text, "\\approx")
    if len(approximate) > 1 and "=" in approximate[0]:
        text = approximate[0]
    sides = _split_top(text, "=")
    read = read_sides(sides) if len(sides) > 1 else None
    if read is None:
        return None
    label, value = read
    if label is None:
        return _parse(value, max_digits, depth + 1)
    if not is_named_quantity(label):
        return _leaf(f"{label} = {value}", max_digits)
    try:
        relation: Node | None = _leaf(f"{label} = {value}", max_digits)
    except Unparseable:
        relation = None
    return Labelled(label_key(label), _parse(value, max_digits, depth + 1), relation)


def _strip_redundant_parens(text: str) -> str:
    """``((7))`` -> ``7``, iteratively (no recursion depth spent); ``(1, 2)`` is kept."""
    while True:
        bracketed = _bracketed(text)
        if bracketed is None or bracketed[0] != "(" or bracketed[2] != ")":
            return text
        inner = bracketed[1].strip()
        if len(_split_top(inner, ",")) != 1:
            return text
        text = strip_outer(inner)


def _bracketed(text: str) -> tuple[str, str, str] | None:
    """(opening, inner, closing) when one bracket pair encloses the whole text.

    ``[a, b)`` and ``(a, b]`` count as a pair: interval notation mixes brackets.
    """
    if text.startswith("\\{"):
        close = _matching_escaped_brace(text)
        return ("\\{", text[2:close], "\\}") if close == len(text) - 2 else None
    if not text or text[0] not in "([" or text[-1] not in ")]":
        return None
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return None
    return (text[0], text[1:-1], text[-1]) if depth == 0 else None


def _matching_escaped_brace(text: str) -> int:
    depth = 0
    i = 0
    while i < len(text) - 1:
        pair = text[i:i + 2]
        if pair == "\\{":
            depth += 1
            i += 2
            continue
        if pair == "\\}":
            depth -= 1
            if depth == 0:
                return i
            i += 2
            continue
        i += 1
    return -1


def _split_top(text: str, separator: str) -> list[str]:
    """Split on ``separator`` where no bracket or brace is open."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if text.startswith("\\{", i) or text.startswith("\\}", i):
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            i += len(separator)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _matrix(body: str, max_digits: int, depth: int) -> Matrix:
    rows = [r for r in re.split(r"\\\\", body) if r.strip() and not r.strip() == r"\hline"]
    cells = tuple(tuple(_parse(c, max_digits, depth + 1) for c in row.split("&"))
                  for row in rows)
    if not cells or len({len(row) for row in cells}) != 1:
        raise Unparseable("matrix rows of different lengths")
    return Matrix(cells)


def _leaf(text: str, max_digits: int) -> Node:
    bare, notes = split_annotations(text)
    while (m := _WRAPPED_TEXT.match(bare)) is not None and m.group(1).strip():
        bare = m.group(1).strip()  # \text{12}, \mathrm{Odd}
    if not bare:
        raise Unparseable("nothing left after removing units")
    if (ratio := written_ratio(bare)) is not None:  # 12:00 is not 12/0
        return TextLeaf(ratio)
    if (number := parse_number(bare, max_digits)) is not None:
        return NumberLeaf(number, notes)
    if (value := arithmetic(bare, max_digits)) is not None:
        return NumberLeaf(Number(value), notes)
    if (m := _TEXT.match(bare)) is not None and (m.group(1) or _is_words(m.group(2))):
        return TextLeaf(" ".join((m.group(1) or m.group(2)).lower().split()))
    if any(_JUXTAPOSED_NUMBERS.match(side.strip()) for side in bare.split("=")):
        raise Unparseable("numbers side by side with nothing between them")
    try:
        return ExprLeaf(_sympy(bare), notes)
    except Unparseable:
        if "\\pm" not in bare:
            raise
    # a \pm the grammar reads only at the top: inside a fraction it is the two values
    # (\frac{-1 \pm \sqrt{13}}{4}), a set, as 1 \pm \sqrt2 is
    return Collection("set", (_leaf(bare.replace("\\pm", "+", 1), max_digits),
                              _leaf(bare.replace("\\pm", "-", 1), max_digits)))


def _is_words(text: str) -> bool:
    """Plain words ("yes", "no solution") rather than a product of variables ("xy")."""
    words = _WORD_LIKE.findall(text)
    return bool(words) and not any(w.lower() in _LATEX_WORDS for w in words)


def _sympy(text: str) -> sympy.Basic:
    if len(text) > MAX_SYMPY_CHARS:
        raise Unparseable(f"expression longer than {MAX_SYMPY_CHARS} characters")
    if text.count("{") != text.count("}"):
        raise Unparseable("unbalanced braces")
    return _latex(text)


def _latex(text: str) -> sympy.Basic:
    from latex2sympy2_extended import latex2sympy  # imported here: a second of grammar setup

    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 5_000))
        expr = latex2sympy(text)
    except Unparseable:
        raise
    except Exception as exc:  # the grammar's errors have no common base class
        raise Unparseable(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        sys.setrecursionlimit(limit)
    if isinstance(expr, sympy.MatrixBase):
        expr = sympy.ImmutableMatrix(expr)  # latex2sympy returns a mutable one
    if not isinstance(expr, sympy.Basic):
        raise Unparseable(f"parsed to {type(expr).__name__}, not a sympy expression")
    return _constants(expr)


_E, _I = sympy.Symbol("e"), sympy.Symbol("i")


def _constants(expr: sympy.Basic) -> sympy.Basic:
    """A free ``e`` is Euler's number and a free ``i`` the imaginary unit (both sides alike)."""
    if not hasattr(expr, "free_symbols"):
        return expr
    mapping = {s: c for s, c in ((_E, sympy.E), (_I, sympy.I)) if s in expr.free_symbols}
    if not mapping:
        return expr
    return expr.xreplace(mapping)


def describe(node: Node, limit: int = 200) -> str:
    """A short human-readable form of a parsed answer, for ``detail``."""
    text = _describe(node)
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(node: Node) -> str:
    if isinstance(node, NumberLeaf):
        value = node.number.value
        if value.denominator == 1 and value.numerator.bit_length() > 600:
            body = f"<integer of about {int(value.numerator.bit_length() * 0.30103)} digits>"
        elif value.denominator.bit_length() > 600 or value.numerator.bit_length() > 600:
            body = "<rational with hundreds of digits>"
        else:
            body = str(value)
        return body + _describe_notes(node.notes)
    if isinstance(node, ExprLeaf):
        try:
            return sympy.sstr(node.expr) + _describe_notes(node.notes)
        except ValueError:  # huge integers refuse str()
            return "<expression with huge numbers>"
    if isinstance(node, TextLeaf):
        return f"text({node.text})"
    if isinstance(node, Collection):
        return f"{node.kind}({', '.join(_describe(i) for i in node.items)})"
    if isinstance(node, Interval):
        return (("[" if node.left_closed else "(") + _describe(node.low) + ", "
                + _describe(node.high) + ("]" if node.right_closed else ")"))
    if isinstance(node, Union_):
        return " U ".join(_describe(p) for p in node.parts)
    if isinstance(node, Labelled):
        return f"{node.label} = {_describe(node.value)}"
    if isinstance(node, Determinant):
        return "det " + _describe(node.matrix)
    return "matrix(" + "; ".join(", ".join(_describe(c) for c in row) for row in node.rows) + ")"


def _describe_notes(notes: Annotations) -> str:
    return (("%" if notes.percent else "") + ("°" if notes.degrees else "")
            + (f" [{notes.unit}]" if notes.unit else ""))


__all__ = ["Collection", "ExprLeaf", "Interval", "Matrix", "Node", "NumberLeaf", "TextLeaf",
           "Union_", "Unparseable", "describe", "parse", "matching_close"]
