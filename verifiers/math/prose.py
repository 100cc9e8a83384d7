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
from dataclasses import dataclass
from typing import Callable

from rewardd.verifiers.math.normalize import KNOWN_UNITS

_MATH_WORDS = frozenset(
    "sin cos tan cot sec csc log ln exp sqrt arcsin arccos arctan sinh cosh tanh det gcd lcm "
    "max min mod inf infty infinity pi and or dx dy dt no yes true false none undefined".split())
"""Words that may appear in an answer: function names, constants, connectives of a list of
solutions, and the few words that are answers themselves."""
_SHORT_PROSE = frozenset(
    "is it so we be as at by if of to an on my me us he do go up am its the are was".split())
_UNITS = frozenset(u.lower() for u in KNOWN_UNITS)
_COMMANDS = re.compile(r"\\(?:text|textrm|mathrm|mbox|operatorname|textnormal|begin|end)\s*\{[^{}]*\}"
                       r"|\\[a-zA-Z]+")
_WORD = re.compile(r"(?<![a-zA-Z\\])[a-zA-Z]{2,}(?![a-zA-Z])")

_INT = r"\d{1,3}(?:,\d{3})+(?![\d,]\d)|\d+"
_DECIMAL_COMMA = r"(?:\d{4,}|0|\d{1,3}(?=,(?!\d{3}(?!\d))))(?:,\d+)(?![\d,])"
"""A comma that cannot group thousands (``2,74``, ``1000,99``, ``0,111``): read whole, and
:func:`comma_is_decimal` decides against the other side."""
_UNSIGNED = rf"(?:{_DECIMAL_COMMA}|(?:{_INT})(?:\.\d+)?|\.\d+)"
_ARG = r"(?:\{\s*\d+\s*\}|\d)"
NUMERIC = re.compile(
    rf"(?<![\w.\\^_/])(?<!\d,)(?:(?<![\w)\]}}])-\s*)?"
    rf"(?:\\[dt]?frac\s*{_ARG}\s*{_ARG}"
    rf"|{_UNSIGNED}(?:\s*\\[dt]?frac\s*{_ARG}\s*{_ARG}"
    rf"|\s*/\s*{_UNSIGNED}(?![\d/])|\s*\^\s*(?:\{{\s*-?\d+\s*\}}|\d))?)"
    r"(?!(?!(?:mm|cm|km|m|kg|mg|g|ml|l|s|h|min)[\u00b2\u00b3]?(?![a-zA-Z]))[\w/^]|[.,]\d)")
"""One whole number literal in running text: integer, decimal, grouped thousands, ``a/b``,
``\\frac{a}{b}``, a mixed number or an integer power; not preceded by a letter, digit, point
or backslash (``AZ2B``, ``x2``, ``\\log_2``) and not followed by a letter (``2B``) other than
a metric unit written against it (``1,000.99m\u00b2``, ``5kg``)."""

_CONNECTORS = re.compile(r"^(?:[\s,;]|or|and)*$", re.IGNORECASE)
_DELIMITER = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_KIND = {"$$": "d", "$": "s", "\\(": "p", "\\[": "b"}


@dataclass(frozen=True, slots=True)
class Span:
    """A math span: ``kind`` ``d`` (``$$``), ``s`` (``$``), ``p`` (``\\(``) or ``b`` (``\\[``);
    ``start``/``end`` cover the delimiters, ``inner`` is what they enclose."""

    start: int
    end: int
    kind: str
    inner: str

    def whole(self, text: str) -> str:
        return text[self.start:self.end]


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


def math_spans(text: str) -> list[Span]:
    """Every ``$..$``, ``$$..$$``, ``\\(..\\)`` and ``\\[..\\]`` span, in order.

    One pass over the delimiters (an escaped ``\\$`` and a ``\\\\`` line break are none): each
    opener takes the next delimiter of its kind, an opener left without one is skipped, so
    a text of unclosed ``\\(`` costs linear time (a lazy regex would rescan to the end from
    every opener)."""
    tokens = [(m.start(), m.group(0)) for m in _DELIMITER.finditer(text)
              if m.group(0) not in ("\\\\", "\\$")]
    # the index of the next token of each closing family after each token, right to left
    following: dict[str, list[int]] = {"$": [], "\\)": [], "\\]": []}
    upcoming = {family: len(tokens) for family in following}
    for index in range(len(tokens) - 1, -1, -1):
        for family, found in following.items():
            found.append(upcoming[family])
        upcoming["$" if tokens[index][1] in ("$", "$$") else tokens[index][1]] = index
    for found in following.values():
        found.reverse()
    spans, i = [], 0
    while i < len(tokens):
        start, token = tokens[i]
        closer = _CLOSER.get(token)
        if closer is None:
            i += 1
            continue
        j = following["$" if token in ("$", "$$") else closer][i]
        if j < len(tokens) and tokens[j][1] == closer:
            inner = text[start + len(token):tokens[j][0]]
            if inner.strip():
                spans.append(Span(start, tokens[j][0] + len(closer), _KIND[token], inner))
                i = j + 1
                continue
        i += 1
    return spans


def span_text(span: Span) -> str:
    return span.inner.strip()


def _replace_spans(text: str, spans: list[Span], replace: Callable[[Span], str]) -> str:
    out, position = [], 0
    for span in spans:
        out += [text[position:span.start], replace(span)]
        position = span.end
    return "".join(out + [text[position:]])


_AMBIGUOUS_COMMA = re.compile(r"^\s*[+-]?(\d+)(?:,|\{,\})(\d+)\s*$")


def comma_is_decimal(answer: str) -> bool:
    """One number with one comma, no space after it, that cannot separate thousands (``2,74``,
    ``1000,99``, ``0,111``; not ``1,000``): a decimal comma when the other side is one number
    (issue 31), read by :func:`rewardd.verifiers.math.several.decimal_comma`."""
    m = _AMBIGUOUS_COMMA.match(answer)
    if m is None:
        return False
    whole, fraction = m.groups()
    return len(fraction) != 3 or len(whole) > 3 or whole.startswith("0")


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
_CLOSING_CHARS = 160
"""A closing number is read in the last 160 characters of a sentence: "is" and a few numbers
and words; a bound that keeps the rule linear however long the sentence."""
_LIST_SEPARATOR = re.compile(r"\s*,\s+(?:and\s+|or\s+)?|\s+(?:and|or)\s+")
"""Between the numbers of a list: a comma and a space (``1,000`` is one number), "and", "or"."""


def closing_number(sentence: str) -> str | None:
    """The number a sentence ends on after "is"/"equals"/"=" and at most four words
    (``the largest $n$ is 34``, ``x equals 4``, ``she has 18 dollars left``), or the numbers
    (``it is 5 and 6`` -> ``5, 6``), else None."""
    sentence = sentence[-_CLOSING_CHARS:]
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
        outside = _replace_spans(phrase, spans, lambda m: " ")
        inner = [span_text(m) for m in spans if span_text(m)]
        if inner and _CONNECTORS.match(outside):
            return ", ".join(inner)
        if inner and is_prose(outside):
            if not any(ch.isdigit() for ch in inner[0]) and (n := closing_number(phrase)):
                return n  # "The largest $n$ is 34": the span names, the number answers
            return inner[0]
        return re.sub(r"\s+", " ", _replace_spans(phrase, spans,
                                                  lambda m: f" {span_text(m)} ")).strip()
    if not is_prose(phrase):
        return phrase
    if (m := first_numeric(phrase)) is not None and m.start() == 0:
        return m.group(0).strip()
    return closing_number(phrase) or only_number(phrase) or phrase


def only_number(sentence: str) -> str | None:
    """The one number of a sentence of prose (``Jane started growing Sphere 3 hours ago``,
    ``... increases by 100%``, a percent sign kept), None when it has none or several."""
    found = list(NUMERIC.finditer(sentence))
    if len(found) != 1:
        return None
    number = found[0].group(0).strip()
    if re.match(r"\s*\\?%", sentence[found[0].end():]):
        number += "\\%"
    return number


__all__ = ["FILLER", "NUMERIC", "Span", "closing_number", "comma_is_decimal", "first_numeric", "is_prose", "last_numeric", "only_number",
           "math_spans", "span_text",
           "tidy", "words"]
