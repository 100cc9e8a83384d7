"""Find the program in a completion: the last fenced code block of the task's language.

Rules, in order (``Extracted.code_from`` says which one applied):

1. ``fenced_block``: the LAST fenced block (a line opening with three or more backticks or
   tildes, closed by a line of the same character at least as long) whose info string names
   the task's language (``python``/``py``/``python3``; ``cpp``/``c++``/``cc``/``cxx``;
   ``javascript``/``js``/``node``; case-insensitive) or is empty (a bare fence). Blocks
   tagged with anything else (```` ```text ````, ```` ```bash ````, another language) are
   skipped: they are sample output or shell commands, not the program. Models explain first
   and answer last, so the last block is the answer.
2. ``fenced_block`` with ``fence_closed=False``: when the last accepted fence is never closed
   (a completion cut off at the token limit), the text after it, to the end.
3. ``whole``: no accepted fence at all: the whole completion is the program (models asked for
   "only the code" often omit fences).

An empty or all-whitespace result means there is no code (the caller gives reward 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rewardd.verifiers.code.types import Language

_FENCE = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\s`]*)[^`]*$")

LANGUAGE_TAGS: dict[Language, frozenset[str]] = {
    "python": frozenset({"python", "py", "python3", "py3"}),
    "cpp": frozenset({"cpp", "c++", "cc", "cxx"}),
    "javascript": frozenset({"javascript", "js", "node", "nodejs"}),
}
"""Info strings accepted for each language, besides the bare fence."""


@dataclass(frozen=True, slots=True)
class Extracted:
    code: str
    code_from: Literal["fenced_block", "whole"]
    fence_closed: bool = True
    """False when the program is the text after a final fence that is never closed."""


@dataclass(frozen=True, slots=True)
class _Block:
    info: str
    body: str
    closed: bool


def _blocks(lines: list[str]) -> list[_Block]:
    """Every fenced block, in order; a final unclosed fence yields a block with closed=False."""
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence = opening.group("fence")
        info = opening.group("info").lower()
        for j in range(i + 1, len(lines)):
            stripped = lines[j].strip()
            if stripped and stripped[0] == fence[0] and set(stripped) == {fence[0]} \
                    and len(stripped) >= len(fence):
                blocks.append(_Block(info, "\n".join(lines[i + 1:j]), True))
                i = j + 1
                break
        else:
            blocks.append(_Block(info, "\n".join(lines[i + 1:]), False))
            break
    return blocks


def extract_code(completion: str, language: Language = "python") -> Extracted:
    """The program in ``completion`` by the module's rules (``code`` may be empty)."""
    tags = LANGUAGE_TAGS[language]
    accepted = [b for b in _blocks(completion.splitlines()) if b.info == "" or b.info in tags]
    if accepted:
        last = accepted[-1]
        return Extracted(code=last.body.strip("\n") + "\n" if last.body.strip() else "",
                         code_from="fenced_block", fence_closed=last.closed)
    return Extracted(code=completion if completion.strip() else "", code_from="whole")


__all__ = ["Extracted", "LANGUAGE_TAGS", "extract_code"]
