"""Labelled answers, chains and ratios written as they read: structure the LaTeX grammar misreads.

Datasets write an answer as a label and a value: ``(p,q)=(3,2)``, ``AB=4``, ``|AB|=1``,
``f(x)=1``, ``V_1:V_2=11:21``, ``\\frac{NO}{BO}=\\frac{1}{\\sqrt6}``. latex2sympy reads these as
equations (``AB`` becomes the product ``a*b``, lower-cased), so the value alone never matched.
Here an equation whose left side is a *named quantity* is a :class:`Labelled` value: the label
is kept as written (normalised) and the value parsed on its own. A plain one-symbol label
(``x = 5``) is left to the equation path, which already reads it as an assignment.

A chain ``x = 5+5+1 = 11`` answers with its last side (keeping a label on the left), so does
a closed form stated with its value (``2^{10} = 1024``, ``\\frac12\\cdot 4 = 2``), and a
ratio or clock time with a zero part (``12:00``, ``3:0``) is compared as written: the grammar
reads ``12:00`` as 12/0, the same complex infinity as ``1:00``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rewardd.verifiers.math.answer import Node

_GREEK = ("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda "
          "mu nu xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi "
          "Pi Sigma Phi Psi Omega").split()
_SUB = r"(?:_\{?[A-Za-z0-9]{1,4}\}?)?'*"
_SYMBOL = rf"(?:[A-Za-z]|\\(?:{'|'.join(_GREEK)})(?![A-Za-z])){_SUB}"
_POINTS = rf"(?:[A-Z]'?){{2,4}}{_SUB}"
"""Names of points: a segment ``AB``, an angle ``ABC``, a polygon ``ABCD``."""
_NAME = (rf"(?:(?:m\s*)?\\(?:angle|measuredangle|triangle)\s*{_POINTS}|\\det\s*\(?[A-Z]\)?"
         rf"|\\(?:overline|widehat|overrightarrow|vec)\s*\{{{_POINTS}\}}|{_POINTS}"
         rf"|[A-Z]_\{{?(?:\\triangle\s*)?[A-Z]{{2,4}}\}}?)")
_FUNCTION = rf"(?:[A-Z]|[fghpquvw]|\\(?:phi|varphi|psi)){_SUB}\s*\([^()]{{1,40}}\)"
"""A function's value: ``f(x)``, ``P(A)``, ``P(X=2)``, ``g_2(1)``, ``S(n)``; never ``x(x+1)`` or
``a(b+c)``, which are products (a lower-case name must be one functions are given)."""
_QUANTITY = rf"(?:\|\s*{_NAME}\s*\||{_NAME}|{_FUNCTION}|{_SYMBOL})"
_LABEL = re.compile(
    rf"^(?:{_NAME}|\|\s*{_NAME}\s*\||{_FUNCTION}"
    rf"|\(\s*{_SYMBOL}(?:\s*,\s*{_SYMBOL})+\s*\)"
    rf"|{_QUANTITY}(?:\s*:\s*{_QUANTITY})+"
    rf"|\\frac\s*\{{\s*{_QUANTITY}\s*\}}\s*\{{\s*{_QUANTITY}\s*\}})$")
_PLAIN_SYMBOL = re.compile(rf"^{_SYMBOL}$")
_RELATION_SIGN = re.compile(r"[<>]|\\(?:le|ge|ne|lt|gt|approx|sim|equiv)(?![a-zA-Z])")
_KEY_NOISE = re.compile(r"\s+|[{}|]|\\(?:overline|widehat|overrightarrow|vec)(?![a-zA-Z])"
                        r"|(?<![A-Za-z])m(?=\\(?:angle|measuredangle))")
_ZERO_PART_RATIO = re.compile(r"^\d+(?:\s*:\s*\d+)+$")


@dataclass(frozen=True, slots=True)
class Labelled:
    """``label = value``: a named quantity (``AB``, ``f(x)``, ``(p,q)``) and what it equals."""

    label: str
    """The label as written, without spaces, braces, bars or overlines (``|AB|`` -> ``AB``)."""
    value: "Node"
    relation: "Node | None" = None
    """The whole equation as the grammar reads it, for an answer that labels it differently
    (``y = 2x+1`` against ``2x - y + 1 = 0``); None when the grammar cannot read it."""


def label_key(text: str) -> str:
    """One spelling of a label: ``|AB|``, ``\\overline{AB}`` and ``AB`` are the same segment,
    ``m\\angle ABC`` and ``\\angle ABC`` the same angle, ``V_{1}`` and ``V_1`` the same name."""
    return _KEY_NOISE.sub("", text)


def is_named_quantity(text: str) -> bool:
    """A label that is more than one plain symbol (those are assignments already)."""
    text = text.strip()
    return bool(_LABEL.match(text)) and not _PLAIN_SYMBOL.match(text)


def read_sides(sides: list[str]) -> tuple[str | None, str] | None:
    """For an answer split at its top-level ``=`` signs: (label or None, value text) when it
    is a labelled value or a chain, else None (an equation, left to the grammar).

    ``AB = 4`` -> ("AB", "4"); ``x = 5+5+1 = 11`` -> ("x", "11"); ``2+3 = 5 = 5`` and
    ``2^{10} = 1024`` (a closed form on the left, a value on the right) -> (None, last side);
    ``7 = 11a+c`` and ``y = 2x+1`` -> None (equations);
    ``x = 1 < 2 = y`` -> None.
    """
    if len(sides) < 2 or not all(sides) or any(_RELATION_SIGN.search(s) for s in sides):
        return None
    first, last = sides[0].strip(), sides[-1].strip()
    if len(sides) == 2:
        if is_named_quantity(first):
            return first, last
        # a closed form stated with its value (2^{10} = 1024), never an equation whose other
        # side has variables: 7 = 11a+c is no answer 11a+c (issue 31)
        return (None, last) if _is_closed_form(first) and not _has_variable(last) else None
    if is_named_quantity(first) or _PLAIN_SYMBOL.match(first):
        return first, last
    return None, last


_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[a-zA-Z*]+\}(?:\{[^{}]*\})?")
_COMMAND = re.compile(r"\\[a-zA-Z]+")


def _has_variable(text: str) -> bool:
    """A letter outside LaTeX commands and environments (``11a+c``; not ``\\frac{\\pi}{2}``)."""
    return re.search(r"[A-Za-z]", _COMMAND.sub("", _ENVIRONMENT.sub("", text))) is not None


_BOUND = re.compile(r"\\(?:lim|sum|prod)\s*_\s*\{\s*([A-Za-z])")


def _is_closed_form(text: str) -> bool:
    """Text with no free variable: no letter outside LaTeX commands but Euler's ``e``, the
    imaginary ``i`` and a variable bound by ``\\lim``/``\\sum``/``\\prod``
    (``\\frac12\\cdot 4``, ``2^{10}``, ``e^{i\\pi}``, ``\\lim_{x\\to 0}\\frac{\\sin x}{x}``, a
    ``vmatrix`` of numbers). ``2^{10} = 1024`` states the value 1024 (issue 31: and
    ``e^{i\\pi} = -1`` states -1)."""
    bare = _COMMAND.sub("", _ENVIRONMENT.sub("", text))
    letters = set(re.findall(r"[A-Za-z]", bare)) - set(_BOUND.findall(text)) - {"e", "i"}
    return not letters and (re.search(r"\d", bare) is not None or bare != text)


def written_ratio(text: str) -> str | None:
    """``12:00`` or ``3:0`` (a part is zero, so it is no quotient): the text to compare as
    written, without spaces; None for anything else (``11:21`` stays the quotient 11/21)."""
    if not _ZERO_PART_RATIO.match(text):
        return None
    parts = [p.strip() for p in text.split(":")]
    return ":".join(parts) if any(int(p) == 0 for p in parts) else None


__all__ = ["Labelled", "is_named_quantity", "label_key", "read_sides", "written_ratio"]
