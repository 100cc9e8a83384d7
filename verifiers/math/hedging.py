"""Hedged answers: a completion whose final statement offers several candidates ("1, 2 or
3", "\\boxed{4} or \\boxed{5}"), a way to farm a verifier that accepts any part of an answer.

Used by the sentinel (its ``hedging`` signal: the share of rewarded completions that hedge,
rising) rather than by the verdict: a disjunction is sometimes the right answer (the roots
of a quadratic), so it is watched as a trend, never refused outright. Only the completion's
last :data:`TAIL_CHARS` characters are read: a candidate list in the working ("it could be 3
or 4; testing 3 ...") is reasoning, not an answer.
"""

from __future__ import annotations

import re

TAIL_CHARS = 300
_ANSWER = r"(?:\\boxed\{[^{}]{1,40}\}|\$[^$]{1,40}\$|(?<![\w.])[-+]?\d+(?:\.\d+)?(?!\w|\.\d))"
_LIST = re.compile(
    rf"({_ANSWER})((?:\s*,\s*{_ANSWER})*)\s*,?\s+(?:or|\\text\{{\s*or\s*\}})\s+({_ANSWER})",
    re.IGNORECASE)
_ITEM = re.compile(_ANSWER)
_WRAP = re.compile(r"^\\boxed\{|\}$|^\$|\$$")


def _bare(answer: str) -> str:
    return _WRAP.sub("", answer.strip()).strip()


def candidates(completion: str) -> int:
    """How many distinct candidate answers the completion's final statement offers in one
    disjunction (1 when it offers no choice)."""
    tail = completion[-TAIL_CHARS:]
    lowered = tail.lower()
    if " or " not in lowered and "{or}" not in lowered and "{ or }" not in lowered:
        return 1  # no disjunction at all (the common case): a substring scan, no regex
    most = 1
    for found in _LIST.finditer(tail):
        items = [found.group(1), *_ITEM.findall(found.group(2)), found.group(3)]
        most = max(most, len({_bare(item) for item in items}))
    return most


__all__ = ["TAIL_CHARS", "candidates"]
