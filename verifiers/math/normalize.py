"""Text clean-up of an answer before parsing: one spelling for what has many.

latex2sympy2_extended parses LaTeX well, but models and datasets write the same answer in many
ways it does not normalise: unicode symbols (``π``, ``−``, ``°``), spacing commands
(``\\!``, ``\\,``), ``\\left(``, ``\\dfrac``, ``\\mathbf{}`` wrappers, plain-text ``sqrt(2)`` and
``pi``, units in ``\\text{}``, ``^\\circ`` and ``\\%``. The rules here are small string
rewrites with one job each; the annotations that carry meaning (percent, degrees, unit) are
split off and returned, not thrown away, so the comparison can use them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNICODE = {
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": r"\times ", "\u22c5": r"\cdot ",
    "\u00b7": r"\cdot ", "\u00f7": r"\div ", "\u03c0": r"\pi ", "\u221e": r"\infty ",
    "\u2264": r"\le ", "\u2265": r"\ge ", "\u2260": r"\ne ", "\u222a": r"\cup ",
    "\u2229": r"\cap ", "\u2208": r"\in ", "\u221a": r"\sqrt", "\u00b0": r"^\circ ",
    "\u00bd": r"\frac{1}{2}", "\u00bc": r"\frac{1}{4}", "\u00be": r"\frac{3}{4}",
    "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2002": " ", "\u2003": " ",
    "\u00b2": "^2", "\u00b3": "^3",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\ufeff]")
_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)"
                     r"(?![a-zA-Z])\s*")
_DELIM_ALIASES = ((r"\lbrace", r"\{"), (r"\rbrace", r"\}"), (r"\lvert", "|"), (r"\rvert", "|"),
                  (r"\vert", "|"), (r"\lbrack", "["), (r"\rbrack", "]"), (r"\langle", "("),
                  (r"\rangle", ")"))
_SPACING = re.compile(r"(?<!\\)\\(?:[!,;:> ]|quad|qquad|displaystyle|textstyle|hfill|enspace)"
                      r"(?![a-zA-Z])|~")
_THOUSANDS = re.compile(r"(?<=\d)(?:,\s*\\[!,]|\{,\}(?:\\!)?|\\,|(?<!\\)\\ |\\!|\s)\s*"
                        r"(?=\d{3}(?!\d))")
"""Thousands separators between digit groups: MATH writes ``11,\\!111,\\!100`` and
``32{,}349``, typesetting ``1\\,000``; a plain ``1,000`` is read by the number reader."""
_CURRENCY = re.compile(r"\\text\s*\{\s*\\(?:\$|textdollar)\s*\}|\\textdollar(?![a-zA-Z])"
                       r"|\\\$\s*(?=[-+]?\.?\d)|(?<=[\d.])\s*\\\$"
                       r"|^\$(?=[-+]?\.?\d[^$]*$)")
"""A dollar sign written before or after an amount (``\\$16.20``, ``16.20\\$``, ``$16`` when
it opens no math span): money is compared as the number."""
_EMPTY_SET = re.compile(r"\\(?:varnothing|emptyset|empty)(?![a-zA-Z])|\\\{\s*\\\}|\u2205")
_FRAC_ALIASES = re.compile(r"\\[dt]frac(?![a-zA-Z])")
_BINOM_ALIASES = re.compile(r"\\[dt]binom(?![a-zA-Z])")
_WRAPPERS = re.compile(r"\\(?:mathbf|boldsymbol|bm|textbf|mathit|textit|mathsf|emph|mathnormal)"
                       r"\s*\{")
_TEXT_AMOUNT = re.compile(r"\\(?:text|textnormal|textrm|mbox)\s*\{\s*([-+]?\d[\d,]*(?:\.\d+)?)"
                          r"((?:\s+[A-Za-z][A-Za-z/^\d]*){0,3})\s*\}")
"""A number written inside ``\\text{}`` with a known unit (``\\text{5 cm}``): the number
comes out, the unit stays in text; other words (``\\text{5 apples and 3 pears}``) stay text."""
_ROMAN_CONSTANT = re.compile(r"\\(?:mathrm|operatorname|text)\s*\{\s*([ei])\s*\}")
_SHORT_ARGS = ((re.compile(r"\\sqrt\s*([0-9a-zA-Z])"), r"\\sqrt{\1}"),
               (re.compile(r"\\frac\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])"), r"\\frac{\1}{\2}"),
               (re.compile(r"\\frac\s*(\{[^{}]*\})\s*([0-9a-zA-Z])"), r"\\frac\1{\2}"),
               (re.compile(r"\\frac\s*([0-9a-zA-Z])\s*(\{)"), r"\\frac{\1}\2"))
_PLAIN_SQRT = re.compile(r"(?<![\\a-zA-Z])sqrt\s*\(")
_PLAIN_WORDS = ((re.compile(r"(?<![\\a-zA-Z])pi(?![a-zA-Z])"), r"\\pi "),
                (re.compile(r"(?<![\\a-zA-Z])(?:infinity|inf)(?![a-zA-Z])"), r"\\infty "),
                (re.compile(r"\*\*"), "^"), (re.compile(r">="), r"\\ge "),
                (re.compile(r"<="), r"\\le "), (re.compile(r"!="), r"\\ne "),
                (re.compile(r"\\(?:geqslant|geq)(?![a-zA-Z])"), r"\\ge "),
                (re.compile(r"\\(?:leqslant|leq)(?![a-zA-Z])"), r"\\le "),
                (re.compile(r"\\(?:neq)(?![a-zA-Z])"), r"\\ne "))

_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\s(?:percent|\\text\{\s*percent\s*\}))$")
_DEGREES = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|"
                      r"\s*\\text\{\s*(?:degrees?|°)\s*\}|\s+degrees?)$")
_TEXT_UNIT = re.compile(r"\s*\\(?:text|textnormal|textup|textsf|mathrm|textrm|mbox|operatorname)\s*\{\s*([^{}]*?)\s*\}"
                        r"(?:\s*\^\s*\{?\s*([23])\s*\}?)?$")
_KNOWN_UNITS = (
    "mm cm dm m km in inch inches ft foot feet yd yard yards mi mile miles mg g kg lb lbs "
    "pound pounds oz ml mL l L s sec secs second seconds min mins minute minutes h hr hrs hour "
    "hours day days week weeks month months year years dollars dollar cents cent units unit "
    "square sq cubic meters meter metres centimeters centimetres kilometers millimeters "
    "mph kph km/h m/s cm^2 m^2 cm^3 m^3 inches^2 ft^2 people students apples ways"
).split()
KNOWN_UNITS: tuple[str, ...] = tuple(_KNOWN_UNITS)
_UNIT_WORDS = frozenset(u.lower() for u in _KNOWN_UNITS) | {"square", "cubic", "sq"}
"""Unit names read after a number; prose detection (:mod:`rewardd.verifiers.math.prose`) lets
them stand in an answer."""
_PLAIN_UNIT = re.compile(r"(?<=[\d}.)])\s+((?:square |cubic |sq )?(?:"
                         + "|".join(map(re.escape, sorted(_KNOWN_UNITS, key=len, reverse=True)))
                         + r")(?:\s*\^\s*\{?[23]\}?)?)\.?$")


@dataclass(frozen=True, slots=True)
class Annotations:
    """What a leaf answer said beside its value."""

    percent: bool = False
    degrees: bool = False
    unit: str | None = None


def matching_close(text: str, start: int, opening: str = "{", closing: str = "}") -> int:
    """Index of the bracket closing the one at ``start``, or -1 when it is never closed."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == opening and (opening != "{" or i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif ch == closing and (closing != "}" or i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return i
    return -1


def _unwrap_commands(text: str, pattern: re.Pattern[str]) -> str:
    """``\\mathbf{x}`` -> ``x`` for every wrapper command matched by ``pattern``."""
    while (m := pattern.search(text)) is not None:
        close = matching_close(text, m.end() - 1)
        if close < 0:
            return text[:m.start()] + text[m.end():]
        text = text[:m.start()] + text[m.end():close] + text[close + 1:]
    return text


def _plain_sqrt(text: str) -> str:
    """``sqrt(2)`` -> ``\\sqrt{2}`` (plain-text answers)."""
    while (m := _PLAIN_SQRT.search(text)) is not None:
        close = matching_close(text, m.end() - 1, "(", ")")
        if close < 0:
            return text
        text = text[:m.start()] + r"\sqrt{" + text[m.end():close] + "}" + text[close + 1:]
    return text


def strip_outer(text: str) -> str:
    """Remove what wraps a whole answer: ``$``, ``\\(..\\)``, ``\\[..\\]``, redundant braces,
    nested ``\\boxed{}``, and a trailing period."""
    previous = None
    while text != previous:
        previous = text
        text = text.strip().rstrip(".").strip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if (len(text) >= len(left) + len(right) and text.startswith(left)
                    and text.endswith(right)):
                text = text[len(left):len(text) - len(right)]
        for box in ("\\boxed{", "\\fbox{", "\\boxed {"):
            if text.startswith(box) and matching_close(text, len(box) - 1) == len(text) - 1:
                text = text[len(box):-1]
        if text.startswith("{") and matching_close(text, 0) == len(text) - 1:
            text = text[1:-1]
    return text


def _text_amount(m: re.Match[str]) -> str:
    unit = m.group(2).split()
    if not unit:
        return m.group(1)
    if all(w.lower() in _UNIT_WORDS for w in unit):
        return f"{m.group(1)}\\text{{ {' '.join(unit)}}}"
    return m.group(0)


def clean(text: str) -> str:
    """One spelling for each notation; see the module docstring."""
    text = _CONTROL.sub("", text)
    text = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], text)
    text = _SIZING.sub("", text)
    text = _EMPTY_SET.sub(r"\\emptyset ", text)
    for alias, canonical in _DELIM_ALIASES:
        text = text.replace(alias, canonical)
    text = _CURRENCY.sub("", text)
    text = _TEXT_AMOUNT.sub(_text_amount, text)
    text = _THOUSANDS.sub("", text)
    text = _SPACING.sub(" ", text)
    text = _FRAC_ALIASES.sub(r"\\frac", text)
    text = _BINOM_ALIASES.sub(r"\\binom", text)
    text = _ROMAN_CONSTANT.sub(r"\1", text)
    text = _unwrap_commands(text, _WRAPPERS)
    text = _plain_sqrt(text)
    for pattern, replacement in _SHORT_ARGS:
        text = pattern.sub(replacement, text)
    for pattern, replacement in _PLAIN_WORDS:
        text = pattern.sub(replacement, text)
    return strip_outer(re.sub(r"\s+", " ", text))


def split_annotations(leaf: str) -> tuple[str, Annotations]:
    """Split a trailing percent sign, degree mark or unit off a leaf answer."""
    percent = degrees = False
    unit: str | None = None
    previous = None
    while leaf != previous:
        previous = leaf
        if (m := _PERCENT.search(leaf)) is not None and m.start() > 0:
            percent, leaf = True, leaf[:m.start()].rstrip()
        if (m := _DEGREES.search(leaf)) is not None and m.start() > 0:
            degrees, leaf = True, leaf[:m.start()].rstrip()
        m = _TEXT_UNIT.search(leaf)
        if m is not None and m.start() > 0 and re.search(r"[A-Za-z$]", m.group(1)):
            unit, leaf = _unit_name(m.group(1), m.group(2)), leaf[:m.start()].rstrip()
        elif (m := _PLAIN_UNIT.search(leaf)) is not None:
            unit, leaf = _unit_name(m.group(1), None), leaf[:m.start()].rstrip()
    return strip_outer(leaf), Annotations(percent, degrees, unit)


def _unit_name(text: str, power: str | None) -> str:
    name = re.sub(r"\s+", " ", text.replace("\\", "").strip().lower())
    return f"{name}^{power}" if power else name
