"""Find the final answer in a model's completion, before any parsing.

math-verify has its own extraction regexes, but they try many candidates and silently pick
one; for RL rewards we want a short, documented priority order whose choice is reported in
the response (``detail.rule``), so a surprising reward can be traced to the rule that fired.

First the completion is cut to its answer part (:mod:`rewardd.verifiers.math.completion`):
chat-template debris is dropped (a second turn the model wrote itself is not its answer),
and after a ``</think>`` only the text that follows it is searched, the reasoning only when
that text holds no answer. Then, in priority order (the first rule that yields a non-empty
answer wins):

1. ``boxed``: the last ``\\boxed{...}`` or ``\\fbox{...}`` (balanced, nested braces OK),
   unless "the final answer is X" follows it (boxed steps of the working, then the stated
   final answer: rule 2, issue 31; a plain "the answer is" after a box does not count);
2. ``final_answer_is``: the last "the (final) answer is X" (also "answer is: X", "the
   correct answer is X", "the answer to the problem is X"; case-insensitive; X runs to the
   end of its sentence, or is the next line when the phrase ends its line);
3. ``answer_line``: the last line starting with "Answer:" / "Final Answer:" (bold or
   heading marks allowed), GSM8K's ``#### X``, or the first line of mathematics after a
   "Final Answer" heading;
4. ``bare``: the last line, when it is mathematics with no prose and no math delimiters
   (``3x+4y+14=0``, ``42``);
5. ``closing``: the final sentence ends on "is/are/equals/=/:" and a number or numbers
   (``The largest $n$ is 34.``, ``So it is 8.``, ``It equals 1/2``, ``It is 5 and 6.``),
   unless the last math span of that sentence states a value (``$y = 7$``: then the span,
   rule 6, is the answer as before);
5b. ``conclusion``: a final sentence of prose that concludes (Therefore/Thus/Hence/So, or
   "Final Answer:" in running text) with exactly one number and no math span (issue 31);
6. ``dollar``: the last ``$...$``, ``$$...$$``, ``\\(...\\)`` or ``\\[...\\]`` math span
   that is not prose;
7. ``last_number``: the last whole numeric expression in the text (``3/4``, ``-2.5``,
   ``1,000``, ``3\\frac12``, ``2^{10}``; never the denominator of a fraction, never a digit
   glued inside a word such as ``AZ2B``). With ``extraction="standard"`` (the default) not
   when the text states several candidates (``... 16 8``, ``3 or 4``) or
   ends in a sentence of words after it; ``lenient`` reads it anywhere; ``strict`` stops
   after rule 3 (a box or an explicit final-answer phrase only).

A phrase found by rules 2 and 3 is tidied (:func:`rewardd.verifiers.math.prose.tidy`): ``$\\frac12$
dollars`` gives ``\\frac12``. Words are never read as variables: a line with English words is
not ``bare``. Nothing found gives rule ``no_answer``: a reward of 0, the model's fault.

With ``boxed="all"`` every top-level box counts (``\\boxed{2}`` and ``\\boxed{3}`` is the list
``2, 3``), for questions with several answers. Multiple-choice letters are read by
:func:`extract_choice` when the reference is a single letter. :func:`reference_answer` reads a
reference that is a whole solution text the same way.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Literal

from rewardd.verifiers.math.completion import split_completion
from rewardd.verifiers.math.prose import (FILLER, NUMERIC, comma_is_decimal, only_number, closing_number, is_prose, last_numeric,
                                         math_spans, span_text, tidy, words)
from rewardd.verifiers.text import find_last_boxed

Rule = Literal["boxed", "boxed_all", "final_answer_is", "answer_line", "dollar", "bare",
               "closing", "conclusion", "last_number", "whole", "text_span",
               "no_answer"]

_FINAL_ANSWER = re.compile(
    r"\b(?:the\s+|my\s+|our\s+)?(?:final\s+|correct\s+|required\s+|desired\s+)?answer"
    r"(?:\s+(?:to|for)\s+(?:the|this)\s+(?:problem|question))?"
    r"\s+(?:is|would\s+be|will\s+be|should\s+be)\b\s*:?[ \t]*" + FILLER
    + r"(?=(?P<x>[^\n]*))", re.IGNORECASE)
_ANSWER_LINE = re.compile(
    r"^[ \t>*_#]*(?:final[ \t]+)?answer[ \t]*(?:\*\*)?[ \t]*[:\uff1a](?:\*\*)?[ \t]*(?P<x>[^\n]*)$"
    r"|^[ \t]*####[ \t]*(?P<g>[^\n#]+)$", re.IGNORECASE | re.MULTILINE)
_HEADING = re.compile(r"^[ \t>*_#]*final[ \t]+answer[ \t*_:]*$", re.IGNORECASE | re.MULTILINE)
_POLITE = re.compile(r"(?:I hope (?:it|this) is correct|Hope (?:this|that) helps|I hope this helps)"
                     r"[.!]?$", re.IGNORECASE)
_PHRASE_CHARS = 2_000
"""How far after "the answer is" an answer is looked for (a bound that keeps every rule
linear in the completion's length)."""
_CANDIDATES = 32
"""How many of the last "the answer is" / "Answer:" phrases are tried."""
_WRAPS = (("**", "**"), ("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"),
          ('\\"', '\\"'), ('"', '"'))
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_LONE_DOLLAR = re.compile(r"^\$(?!\$)|(?<![\\$])\$$")
_HEADING_MARK = re.compile(r"^#{1,6}[ \t]+")
_DENIAL = re.compile(r"\b(?:is|are|was|equals?|be)\s+not\s+(?:equal\s+to\s+)?\$?-?[\d.,/]+\$?"
                     r"[\s.!]*$", re.IGNORECASE)
_RELATION = re.compile(r"=|<|>|\\[lg]eq?(?![a-z])|\\neq?(?![a-z])")


_MATH_LINE = re.compile(r"^(?=.*[\w\\])[\w\s\\{}^_+\-*/=<>()\[\].,:;|!'&%$]+$")
"""The characters of a line of mathematics (below a multi-line text: the ``bare`` rule)."""
_STRONG: frozenset[str] = frozenset({"boxed", "final_answer_is", "answer_line"})
_CURRENCY = re.compile(r"(?<![\\$])\$(?=\d)")


@dataclass(frozen=True, slots=True)
class Extraction:
    """The answer text found in a completion (None when nothing was found) and the rule used."""

    answer: str | None
    rule: Rule


def clean_answer(text: str) -> str:
    """Strip what wraps an answer in prose: whitespace, a trailing period, markdown bold and
    heading marks (GSM8K's ``####``), and outer math delimiters (``$``, ``$$``,
    ``\\(..\\)``, ``\\[..\\]``); at most 16 layers (each pass copies the text: a bound
    keeps a text of 10,000 ``####`` lines linear)."""
    text = text.strip()
    for _ in range(16):
        prev = text
        text = text.rstrip(".").strip()
        if text.startswith("#"):
            text = _HEADING_MARK.sub("", text)
        text = text.strip("*").strip()
        for left, right in _WRAPS:
            if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
                inner = text[len(left):len(text) - len(right)]
                if not (left[0] == "$" and "$" in inner):
                    text = inner.strip()
        if text == prev:
            break
    if text.endswith("\\") and not text.endswith("\\\\"):
        text = text[:-1].strip()  # "185\": a stray backslash, no command
    if "$" in text and len(_UNESCAPED_DOLLAR.findall(text)) == 1:  # a span cut in half
        text = _LONE_DOLLAR.sub("", text).strip()
    return text


def _without_politeness(text: str) -> str:
    """The text without "I hope it is correct." and the like at its end."""
    text = text.strip()
    while (m := _POLITE.search(text, max(len(text) - 200, 0))) is not None:
        text = text[:m.start()].strip()
    return text


def _sentence_end(text: str) -> int:
    """Index of the first ``.``/``!``/``?`` that ends a sentence outside a math span, else len."""
    spans, k = math_spans(text), 0
    for m in re.finditer(r"[.!?](?=\s|$)", text):
        while k < len(spans) and spans[k].end <= m.start():
            k += 1
        if k == len(spans) or m.start() < spans[k].start:
            return m.start()
    return len(text)


def _phrase(tail: str, rest: str) -> str | None:
    """The answer a phrase's tail names; the next line when the phrase ended its line."""
    tail, rest = tail[:_PHRASE_CHARS], rest[:_PHRASE_CHARS]
    if not tail.strip():
        lines = [line for line in rest.split("\n") if line.strip()]
        if not lines:
            return None
        block = rest.strip()
        spans = math_spans(block)
        if spans and spans[0].start == 0:
            return tidy(clean_answer(span_text(spans[0]))) or None
        tail = lines[0]
    if tail.lstrip().startswith("}"):  # $\text{the answer is } 17$: the phrase was in text
        tail = tail.lstrip()[1:]
    end = _sentence_end(tail)
    if tail[end:end + 1] == "?":
        return None  # "the answer is 5? Let me check": a question is no answer
    answer = clean_answer(tail[:end])
    return tidy(answer) or None


def _final_answer_is(text: str) -> str | None:
    for m in list(_FINAL_ANSWER.finditer(text))[:-_CANDIDATES - 1:-1]:
        answer = _phrase(m.group("x"), text[m.end():])
        if answer:
            return answer
    return None


def _answer_line(text: str) -> str | None:
    for m in list(_ANSWER_LINE.finditer(text))[:-_CANDIDATES - 1:-1]:
        if m.group("g") is not None:
            answer = clean_answer(m.group("g"))
        else:
            answer = _phrase(m.group("x"), text[m.end():])
        if answer:
            return answer
    headings = list(_HEADING.finditer(text))
    if headings:
        return _last_math_line(text[headings[-1].end():], first=True)
    return None


def _dollar(text: str) -> str | None:
    for m in reversed(math_spans(text)):
        answer = clean_answer(span_text(m))
        if answer and not is_prose(answer):
            return answer
    return None


def _last_math_line(text: str, first: bool = False) -> str | None:
    """The last non-empty line when it is mathematics without prose or math delimiters (a
    line that is one math span is the ``dollar`` rule's); with ``first``, the first line or
    display block (the answer under a "Final Answer" heading)."""
    text = _without_politeness(text)
    if not text:
        return None
    spans = math_spans(text)
    if first and spans and spans[0].start == 0:
        line = spans[0].whole(text)
    else:
        lines = [line for line in text.split("\n") if line.strip()]
        line = lines[0] if first else lines[-1]
        at = text.rindex(line)
        if not first and (any(m.start <= at < m.end for m in spans) or math_spans(line)):
            return None
    if len(line) > 300 or is_prose(line):
        return None
    if "\n" in text and not _MATH_LINE.match(line):
        return None  # a rule, a check mark, a list label ending the reasoning: no answer
    return tidy(clean_answer(line)) or None


def _bare(text: str) -> str | None:
    return _last_math_line(text)


def _closing(text: str) -> str | None:
    """A number the final sentence ends on after "is"/"equals"/"=" (prose around it).

    It beats the last math span unless the last span of the final sentence states a value
    (``$y = 7$ ..., and the sum is 9``: the span decides, as it always has); a span naming a
    quantity (``The largest $n$ is 34.``, ``$2^{100}$ divided by 7 leaves 2``) does not."""
    text = _without_politeness(text).rstrip(".!").strip()
    start = max((m.end() for m in re.finditer(r"[.!?](?=\s)|\n", text)), default=0)
    sentence = text[start:]
    spans = math_spans(sentence)
    if spans and _states_value(span_text(spans[-1])):
        return None
    return closing_number(sentence)


_CONCLUSION = re.compile(r"^(?:therefore|thus|hence|so|consequently|in conclusion|final answer\s*:)",
                         re.IGNORECASE)


def _conclusion(text: str) -> str | None:
    """A final sentence of prose that concludes (Therefore/Thus/Hence/So/"Final Answer:" in
    running text) with exactly one
    number and no math span: the number (``Therefore, there are 12 distinct sequences``,
    ``Therefore, the error increases by 100%``), after the last math span of the reasoning
    (issue 31)."""
    text = _without_politeness(text).rstrip(".!").strip()
    spans = math_spans(text)
    start = max((m.end() for m in re.finditer(r"[.!?](?=\s)|\n", text)), default=0)
    start = max(start, spans[-1].end if spans else 0)
    sentence = text[start:].strip(" \t.")
    if not _CONCLUSION.match(sentence) or math_spans(sentence) or not is_prose(sentence):
        return None
    return only_number(sentence)


def _states_value(math: str) -> bool:
    """A relation with a number in it (``y = 7``), not a name (``n``, ``2^{100}``)."""
    return any(ch.isdigit() for ch in math) and _RELATION.search(math) is not None


def _last_number(text: str) -> str | None:
    if _DENIAL.search(text[-200:]) is not None:
        return None  # "... so it is not 8.": the last number is what the text rules out
    number = last_numeric(text)
    if number is None or comma_is_decimal(number):
        return number
    return number.replace(",", "")


_TAIL = 2_000
"""How much of the end of a text the ``standard`` reading of a last number looks at."""
_SENTENCE_BREAK = re.compile(r"[.!?;](?=\s)|\n")


_WORDS_ONLY = re.compile(r"^[A-Za-z][A-Za-z '\-]{0,60}$")


def text_span(completion: str) -> str | None:
    """The last math span or box that holds only words (``$odd$``, ``$Even$``): the answer
    against a reference that is text (``\\text{odd}``), where words are the answer; None
    otherwise. Rules 1-7 never read words as an answer, since against a number they are not
    one."""
    parts = split_completion(completion)
    for segment in (s for s in (parts.answer, parts.reasoning) if s.strip()):
        boxed = find_last_boxed(segment)
        candidates = [boxed] if boxed is not None else []
        candidates += [span_text(m) for m in reversed(math_spans(segment))]
        for candidate in candidates:
            answer = clean_answer(candidate)
            if _WORDS_ONLY.match(answer) and len(answer.split()) <= 6:
                return answer
            if boxed is not None:
                break
    return None


def _stated_last_number(text: str) -> str | None:
    """``standard``: the last number of free text, unless the text states several candidates
    or ends in non-answer text. Candidates: the number follows another with nothing but
    spaces or "or" between them (``7 0 6 n What 9 sw 10 The 16 8 W``, ``3 or 4``).
    Non-answer text: a further sentence of words after the number's (``... is 12.
    Let me check that again``). A policy can farm a last-number reading by spraying or
    trailing numbers; these are the readings it farms."""
    tail = _without_politeness(text)[-_TAIL:]
    if _DENIAL.search(tail[-200:]) is not None:
        return None
    matches = list(NUMERIC.finditer(tail))
    if not matches:
        return None
    last = matches[-1]
    after = tail[last.end():]
    if (m := _SENTENCE_BREAK.search(after)) is not None and is_prose(after[m.end():]):
        return None
    if (len(matches) > 1 and _CANDIDATE_GAP.fullmatch(tail[matches[-2].end():last.start()])
            and not ("/" in last.group() and matches[-2].group().strip().isdigit())):
        return None  # "16 8", "3 or 4" (a mixed number "3 1/2" is one answer)
    return _last_number(text)


_CANDIDATE_GAP = re.compile(r"\s+|\s*,?\s*\bor\s+(?:maybe\s+|perhaps\s+)?\$?", re.IGNORECASE)


def _boxed(text: str) -> str | None:
    boxed = find_last_boxed(text)
    if boxed is None or not boxed.strip():
        return None
    starts = list(_BOX_START.finditer(text))
    if starts:
        end = starts[-1].end() + len(boxed) + 1
        phrase = _FINAL_ANSWER.search(text, end)
        if (phrase is not None and "final" in phrase.group(0).lower()
                and _phrase(phrase.group("x"), text[phrase.end():])):
            return None  # boxes in the working, then "The final answer is $10,455$": the phrase
    return clean_answer(boxed)


_AUTO_RULES: tuple[tuple[Rule, Callable[[str], str | None]], ...] = (
    ("boxed", _boxed),
    ("final_answer_is", _final_answer_is),
    ("answer_line", _answer_line),
    ("bare", _bare),
    ("closing", _closing),
    ("conclusion", _conclusion),
    ("dollar", _dollar),
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


Level = Literal["strict", "standard", "lenient"]


def _rules(mode: Literal["auto", "boxed"], level: Level
           ) -> tuple[tuple[Rule, Callable[[str], str | None]], ...]:
    if mode == "boxed":
        return _AUTO_RULES[:1]
    if level == "strict":
        return tuple(r for r in _AUTO_RULES if r[0] in _STRONG)
    if level == "standard":
        return _AUTO_RULES[:-1] + (("last_number", _stated_last_number),)
    return _AUTO_RULES


def extract_answer(completion: str, mode: Literal["auto", "boxed", "none"] = "auto",
                   boxed: Literal["last", "all"] = "last",
                   level: Level = "standard") -> Extraction:
    """Apply the rules of ``mode``: ``auto`` all of them in order, ``boxed`` only the first,
    ``none`` none (the whole completion, stripped, is the answer). ``level`` (the
    ``extraction`` parameter) narrows ``auto``: ``strict`` keeps the explicit rules (a box,
    "the answer is", an "Answer:" line), ``standard`` reads a last number unless the text
    hedges around it (:func:`_stated_last_number`), ``lenient`` reads the last number anywhere.

    ``auto`` and ``boxed`` search the answer part of the completion first and its reasoning
    (inside ``<think>``) only when the answer part yields nothing."""
    if mode == "none":
        whole = clean_answer(completion)
        return Extraction(whole, "whole") if whole else Extraction(None, "no_answer")
    parts = split_completion(completion)
    segments = [s for s in (parts.answer, parts.reasoning) if s.strip()]
    if boxed == "all":
        for segment in segments:
            boxes = [b for b in (clean_answer(b) for b in find_all_boxed(segment)) if b]
            if len(boxes) > 1:
                return Extraction(", ".join(boxes), "boxed_all")
            if boxes:
                break
    return _first_found([_money(s) for s in segments], _rules(mode, level))


def _first_found(segments: list[str],
                 rules: tuple[tuple[Rule, Callable[[str], str | None]], ...]) -> Extraction:
    """The rules over the answer part, then the reasoning; but a stated answer in the
    reasoning (a box, "the answer is") beats a bare last number after ``</think>``."""
    weak: Extraction | None = None
    for segment in segments:
        for rule, find in rules:
            if weak is not None and rule not in _STRONG:
                return weak
            answer = find(segment)
            if not answer:
                continue
            if rule != "last_number" or len(segments) == 1:
                return Extraction(answer, rule)
            weak = weak or Extraction(answer, rule)
            break
    return weak or Extraction(None, "no_answer")


def _money(text: str) -> str:
    """GSM8K-style prose writes amounts with a bare ``$`` (``costs $5 and $6``): when a
    ``$...$`` span closes right before a digit, every ``$`` before a digit is a currency sign
    and is escaped, so no rule reads ``5 and`` as a math span."""
    if _CURRENCY.search(text) is None:
        return text
    if not any(m.kind == "s" and text[m.end:m.end + 1].isdigit()
               for m in math_spans(text)):
        return text
    return _CURRENCY.sub(r"\\$", text)


def reference_answer(reference: str) -> str | None:
    """The answer of a reference: the reference itself when it is one, else (a whole solution
    text: prose, a box inside text) the answer extracted from it the way a prediction's is;
    None when a solution text states no answer (the rule ``last_number`` is not used: a
    number somewhere in a solution is no answer to trust)."""
    text = clean_answer(reference)
    if not text:
        return None
    spans = math_spans(text)
    if spans and not is_prose(outside := text.replace(spans[0].whole(text), " ")) and len(
            spans) == 1 and words(outside):
        return tidy(text)  # "$125$ miles": the value with its unit (issue 31)
    if not _looks_like_solution(text) and _FINAL_ANSWER.search(text) is None:
        return text  # ("answer is 10000" states its answer as a solution does)
    if (joined := _joined_boxes(text)) is not None:
        return joined
    parts = split_completion(text)
    for segment in (s for s in (parts.answer, parts.reasoning) if s.strip()):
        for rule, find in _AUTO_RULES:
            if rule == "last_number":
                continue
            answer = find(segment)
            if answer:
                return answer
    return None


_JOINING_GAP = re.compile(r"[^A-Za-z]*|.{0,40}?(?:\band\b|\bor\b|,|;).{0,40}?", re.DOTALL)


def _joined_boxes(text: str) -> str | None:
    """A reference whose boxes are joined as one answer (``\\boxed{1} papers and \\boxed{2}
    bins``, ``\\boxed{35 cm} ++ \\boxed{4}``): every gap between boxes holds no words, or a
    short one with "and"/"or"/a comma; the parts, as a list (issue 31). Boxes with prose
    between them (``\\boxed{1} no no no \\boxed{2}``, a solution that boxes steps) are not
    joined: the last box is the answer, as in a completion."""
    starts = [m.start() for m in _BOX_START.finditer(text)]
    boxes = find_all_boxed(text)
    if len(boxes) < 2 or len(boxes) != len(starts):
        return None
    ends, position = [], 0
    for box in boxes:
        at = text.index(box, position)
        ends.append(at + len(box) + 1)
        position = ends[-1]
    gaps = [text[end:start] for end, start in zip(ends, starts[1:])]
    if not all(_JOINING_GAP.fullmatch(gap.replace("\\", " ")) for gap in gaps):
        return None
    parts = [clean_answer(b) for b in boxes]
    return ", ".join(parts) if all(parts) else None


_SOLUTION_WORDS = 6


def _looks_like_solution(text: str) -> bool:
    """A solution text rather than an answer: a box inside text, or prose that has math
    spans, several lines or several words (short text answers such as ``no solution`` stay
    answers)."""
    if re.search(r"\\(?:boxed|fbox)\s*\{", text) and not (
            len(find_all_boxed(text)) == 1 and re.fullmatch(
            r"\\(?:boxed|fbox)\s*\{.*\}", text, re.DOTALL)):
        return True  # a box inside text, or several boxes
    prose = words(re.sub(r"\\text\s*\{[^{}]*\}", " ", text))
    return is_prose(text) and (len(prose) >= _SOLUTION_WORDS or "\n" in text.strip()
                               or bool(math_spans(text)))
