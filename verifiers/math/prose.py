"""Tell prose from mathematics, and find the number a sentence ends on.

An answer is never made of English words: ``So it is 8.`` read as LaTeX is the product
``-8*o*s**2*t``, and a grader that does that gives a correct rollout 0. These helpers let the
extraction rules in :mod:`rewardd.verifiers.math.extract` refuse such text as an answer and take
the mathematics out of it instead:

* :func:`is_prose` says whether text contains words (a word of three letters or more that is
  no function name, constant or unit, or a short English function word such as "is");
* :data:`NUMERIC` matches one whole numeric expression in running text (``3/4``, ``-2.5``,
  ``1,000``, ``3\\frac12``, ``2^{10}``, ``\\frac{3}{4}``), never a piece of one (the ``4`` of
  ``3/4``) and never a number glued inside a word (``AZ2B``);
* :func:`tidy` turns the phrase after "the answer is" into the answer it names.
"""

from __future__ import annotations

import re

from rewardd.verifiers.math.normalize import KNOWN_UNITS

_MATH_WORDS = frozenset(
    "sin cos tan cot sec csc log ln exp sqrt arcsin arccos arctan sinh cosh tanh det gcd lcm "
    "max min mod inf infty infinity pi and or dx dy dt no yes true false none undefined".split())
"""Words that may appear in an answer: function names, constants, connectives of a list of
solutions, and the few words that are answers themselves."""
_SHORT_PROSE = frozenset(
    "is it so we be as at by if of to an on my me us he do go up am its the are was".split())
_UNITS = frozenset(u.lower() for u in KNOWN_UNITS)
_COMMANDS = re.compile(r"\\(?:text|textrm|mathrm|mbox|operatorname|textnormal)\s*\{[^{}]*\}"
                       r"|\\[a-zA-Z]+")
_WORD = re.compile(r"(?<![a-zA-Z\\])[a-zA-Z]{2,}(?![a-zA-Z])")

_INT = r"\d{1,3}(?:,\d{3})+(?![\d,]\d)|\d+"
_UNSIGNED = rf"(?:(?:{_INT})(?:\.\d+)?|\.\d+)"
_ARG = r"(?:\{\s*\d+\s*\}|\d)"
NUMERIC = re.compile(
    rf"(?<![\w.\\^_/])(?<!\d,)(?:(?<![\w)\]}}])-\s*)?"
    rf"(?:\\[dt]?frac\s*{_ARG}\s*{_ARG}"
    rf"|{_UNSIGNED}(?:\s*\\[dt]?frac\s*{_ARG}\s*{_ARG}"
    rf"|\s*/\s*{_UNSIGNED}(?![\d/])|\s*\^\s*(?:\{{\s*-?\d+\s*\}}|\d))?)"
    r"(?![\w/^]|[.,]\d)")
"""One whole number literal in running text: integer, decimal, grouped thousands, ``a/b``,
``\\frac{a}{b}``, a mixed number or an integer power; not preceded by a letter, digit, point
or backslash (``AZ2B``, ``x2``, ``\\log_2``) and not followed by a letter (``2B``)."""

_CONNECTORS = re.compile(r"^[\s,;]*(?:(?:or|and|,|;)[\s,;]*)*$", re.IGNORECASE)
_SPAN = re.compile(r"(?<!\\)\$\$(?P<d>.+?)(?<!\\)\$\$|(?<!\\)\$(?P<s>[^$]+?)(?<!\\)\$"
                   r"|\\\((?P<p>.+?)\\\)|\\\[(?P<b>.+?)\\\]", re.DOTALL)


def words(text: str) -> list[str]:
    """The words of ``text`` outside LaTeX commands and ``\\text{}``, lower-cased."""
    return [w.lower() for w in _WORD.findall(_COMMANDS.sub(" ", text))]


def is_prose(text: str) -> bool:
    """True when ``text`` contains an English word, so it cannot be an answer as written."""
    for word in words(text):
        if word in _MATH_WORDS or word in _UNITS:
            continue
        if len(word) >= 3 or word in _SHORT_PROSE:
            return True
    return False


def math_spans(text: str) -> list[re.Match[str]]:
    """Every ``$..$``, ``$$..$$``, ``\\(..\\)`` and ``\\[..\\]`` span, in order."""
    return list(_SPAN.finditer(text))


def span_text(match: re.Match[str]) -> str:
    return next(g for g in match.group("d", "s", "p", "b") if g is not None).strip()


def last_numeric(text: str) -> str | None:
    """The last whole numeric expression in ``text`` (thousands separators kept)."""
    found = NUMERIC.findall(text)
    return found[-1].strip() if found else None


def first_numeric(text: str) -> re.Match[str] | None:
    return NUMERIC.search(text)


FILLER = (r"(?:(?:about|approximately|exactly|just|only|therefore|thus|hence|then|simply|"
          r"clearly|indeed|now|actually)\b[ \t,]*)*")
"""Adverbs between "is" and the answer (``the answer is therefore 17``)."""
_COPULA = re.compile(
    rf"(?:\b(?:is|are|equals?|was|be|gives?|get|obtain|makes?)|=|:)\s+{FILLER}", re.IGNORECASE)
_NUMBERS_THEN_WORDS = re.compile(
    r"^(?P<n>\S+?(?:(?:\s*,\s+(?:and\s+|or\s+)?|\s+(?:and|or)\s+)\S+?)*)"
    r"(?:\s+[A-Za-z][A-Za-z\-']*){0,4}$")
_LIST_SEPARATOR = re.compile(r"\s*,\s+(?:and\s+|or\s+)?|\s+(?:and|or)\s+")
"""Between the numbers of a list: a comma and a space (``1,000`` is one number), "and", "or"."""


def closing_number(sentence: str) -> str | None:
    """The number a sentence ends on after "is"/"equals"/"=" and at most four words
    (``the largest $n$ is 34``, ``x equals 4``, ``she has 18 dollars left``), or the numbers
    (``it is 5 and 6`` -> ``5, 6``), else None."""
    for m in reversed(list(_COPULA.finditer(sentence))):
        tail = _NUMBERS_THEN_WORDS.match(sentence[m.end():].strip())
        if tail is None:
            continue
        numbers = []
        for written in _LIST_SEPARATOR.split(tail.group("n")):
            written = re.sub(r"^\\?\$", "", written)  # an amount: $12, \$12
            number = last_numeric(written)
            if number is None or number != written:
                break
            numbers.append(number)
        else:
            return ", ".join(numbers)
    return None


def tidy(phrase: str) -> str:
    """The answer a phrase names: ``$\\frac12$ dollars`` -> ``\\frac12``, ``$x=2$ or $x=3$``
    -> ``x=2, x=3``, ``34 students in all`` -> ``34``, ``x equals 4`` -> ``4``; a phrase
    without prose is kept."""
    spans = math_spans(phrase)
    if spans:
        outside = _SPAN.sub(" ", phrase)
        inner = [span_text(m) for m in spans if span_text(m)]
        if inner and _CONNECTORS.match(outside):
            return ", ".join(inner)
        if inner and is_prose(outside):
            return inner[0]
        return re.sub(r"\s+", " ", _SPAN.sub(lambda m: f" {span_text(m)} ", phrase)).strip()
    if not is_prose(phrase):
        return phrase
    if (m := first_numeric(phrase)) is not None and m.start() == 0:
        return m.group(0).strip()
    return closing_number(phrase) or phrase


__all__ = ["FILLER", "NUMERIC", "closing_number", "first_numeric", "is_prose", "last_numeric",
           "math_spans", "span_text",
           "tidy", "words"]
