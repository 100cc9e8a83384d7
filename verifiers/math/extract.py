"""Find the final answer in a model's completion, before any parsing.

math-verify has its own extraction regexes, but they try many candidates and silently pick
one; for RL rewards we want a short, documented priority order whose choice is reported in
the response (``detail.rule``), so a surprising reward can be traced to the rule that fired.

Priority (the first rule that yields a non-empty answer wins):

1. ``boxed``: the last ``\\boxed{...}`` or ``\\fbox{...}`` (balanced, nested braces OK);
2. ``final_answer_is``: the last "the final answer is X" / "the answer is X"
   (case-insensitive; X runs to the end of the sentence or line);
3. ``answer_line``: the last line starting with "Answer:" (the rest of the line);
4. ``dollar``: the last ``$...$`` (or ``$$...$$``) math span;
5. ``bare``: the whole completion, when it is one short line of mathematics with no prose
   (``3x+4y+14=0``, ``x^2+1``);
6. ``last_number``: the last number in the text (thousands separators removed).

Nothing found gives rule ``no_answer``: a reward of 0, since that is the model's fault.

With ``boxed="all"`` every top-level box counts (``\\boxed{2}`` and ``\\boxed{3}`` is the list
``2, 3``), for questions with several answers. Multiple-choice letters are read by
:func:`extract_choice` when the reference is a single letter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal

from rewardd.verifiers.text import find_last_boxed

Rule = Literal["boxed", "boxed_all", "final_answer_is", "answer_line", "dollar", "bare",
               "last_number", "whole",
               "no_answer"]

_FINAL_ANSWER = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b\s*:?[ \t]*(?P<x>[^\n]*)",
                           re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)")
_ANSWER_LINE = re.compile(r"^[ \t>*_#]*answer[ \t]*(?:\*\*)?:(?:\*\*)?[ \t]*(?P<x>[^\n]*)$",
                          re.IGNORECASE | re.MULTILINE)
_DOLLAR = re.compile(r"(?<!\\)\$\$(?P<d>.+?)(?<!\\)\$\$|(?<!\\)\$(?P<s>[^$]+?)(?<!\\)\$",
                     re.DOTALL)
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.\d+|\d+)")


@dataclass(frozen=True, slots=True)
class Extraction:
    """The answer text found in a completion (None when nothing was found) and the rule used."""

    answer: str | None
    rule: Rule


def clean_answer(text: str) -> str:
    """Strip what wraps an answer in prose: whitespace, a trailing period, markdown bold,
    and outer math delimiters (``$``, ``$$``, ``\\(..\\)``, ``\\[..\\]``)."""
    prev = None
    text = text.strip()
    while text != prev:
        prev = text
        text = text.strip().rstrip(".").strip()
        for left, right in (("**", "**"), ("$$", "$$"), ("$", "$"), ("\\(", "\\)"),
                            ("\\[", "\\]")):
            inner = text[len(left):len(text) - len(right)]
            if (len(text) >= len(left) + len(right) and text.startswith(left)
                    and text.endswith(right) and not (left.startswith("$") and "$" in inner)):
                text = inner.strip()
    return text


def _final_answer_is(text: str) -> str | None:
    matches = list(_FINAL_ANSWER.finditer(text))
    for m in reversed(matches):
        tail = m.group("x")
        end = _SENTENCE_END.search(tail)
        answer = clean_answer(tail[:end.start()] if end else tail)
        if answer:
            return answer
    return None


def _answer_line(text: str) -> str | None:
    for m in reversed(list(_ANSWER_LINE.finditer(text))):
        answer = clean_answer(m.group("x"))
        if answer:
            return answer
    return None


def _dollar(text: str) -> str | None:
    for m in reversed(list(_DOLLAR.finditer(text))):
        answer = clean_answer(m.group("d") if m.group("d") is not None else m.group("s"))
        if answer:
            return answer
    return None


_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_MATH_WORDS = frozenset("sin cos tan cot sec csc log exp sqrt arcsin arccos arctan sinh cosh "
                        "tanh det gcd lcm max min mod inf infty".split())


def _bare(text: str) -> str | None:
    text = text.strip()
    if not text or "\n" in text or len(text) > 300:
        return None
    if any(w.lower() not in _MATH_WORDS for w in _PROSE_WORD.findall(text)):
        return None
    return clean_answer(text) or None


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _boxed(text: str) -> str | None:
    boxed = find_last_boxed(text)
    return clean_answer(boxed) if boxed is not None and boxed.strip() else None


_AUTO_RULES: tuple[tuple[Rule, Callable[[str], str | None]], ...] = (
    ("boxed", _boxed),
    ("final_answer_is", _final_answer_is),
    ("answer_line", _answer_line),
    ("dollar", _dollar),
    ("bare", _bare),
    ("last_number", _last_number),
)


def find_all_boxed(text: str) -> list[str]:
    """Contents of every top-level ``\\boxed{}``/``\\fbox{}``, in order (unclosed ones skipped)."""
    found, position = [], 0
    for m in _BOX_START.finditer(text):
        if m.start() < position:
            continue  # inside a box already taken
        depth = 1
        for i in range(m.end(), len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[m.end():i])
                    position = i + 1
                    break
    return found


_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_CHOICE = re.compile(r"^\(?\s*([A-Ea-e])\s*\)?(?:$|[\s.:)])")
_CHOICE_IN_TEXT = re.compile(r"(?:\(([A-E])\)|\*\*([A-E])\*\*|\b(?:option|choice)\s+\(?([A-E])\b)")
_TEXT_ANYWHERE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")


def choice_letter(answer: str) -> str | None:
    """The letter of a multiple-choice answer (``C``, ``(C)``, ``\\text{(C)}``, ``C) 42``)."""
    answer = _TEXT_ANYWHERE.sub(r"\1", clean_answer(answer)).strip()
    m = _CHOICE.match(answer)
    return m.group(1).upper() if m else None


def extract_choice(completion: str, found: Extraction) -> str | None:
    """The chosen letter: from the extracted answer, else the last ``(C)`` / ``**C**`` /
    "option C" in the text."""
    if found.answer is not None and (letter := choice_letter(found.answer)) is not None:
        return letter
    if found.rule in ("boxed", "final_answer_is", "answer_line"):
        return None  # an explicit answer that is not a letter: do not hunt for one
    matches = list(_CHOICE_IN_TEXT.finditer(completion))
    if not matches:
        return None
    last = matches[-1]
    return next(g for g in last.groups() if g)


def extract_answer(completion: str, mode: Literal["auto", "boxed", "none"] = "auto",
                   boxed: Literal["last", "all"] = "last") -> Extraction:
    """Apply the rules of ``mode``: ``auto`` all of them in order, ``boxed`` only the first,
    ``none`` none (the whole completion, stripped, is the answer)."""
    if boxed == "all" and mode != "none":
        boxes = [clean_answer(b) for b in find_all_boxed(completion)]
        boxes = [b for b in boxes if b]
        if len(boxes) > 1:
            return Extraction(", ".join(boxes), "boxed_all")
    if mode == "none":
        whole = clean_answer(completion)
        return Extraction(whole, "whole") if whole else Extraction(None, "no_answer")
    rules = _AUTO_RULES if mode == "auto" else _AUTO_RULES[:1]
    for rule, find in rules:
        answer = find(completion)
        if answer:
            return Extraction(answer, rule)
    return Extraction(None, "no_answer")
