"""Cut a raw completion down to the part that can hold its final answer.

Real rollouts are not clean answers: a chat template's tokens come before and after the
assistant's turn (``<|im_start|>assistant``, ``<|im_end|>``, ``<|eot_id|>``), a model that
runs past its end-of-turn writes the next user turn itself (``<|im_start|>user What is
$5+5$?``), and a reasoning model puts pages of trial answers inside ``<think>...</think>``
before the answer it commits to. Extraction rules that look for "the last box" or "the last
``$...$``" would then read a question the model invented or a guess it abandoned. So the
completion is split first:

* template debris: leading role headers are dropped, and the text stops at the first
  end-of-turn or start-of-turn token (what follows is not this turn);
* reasoning: the text after the last ``</think>`` is the answer part, the text before it the
  reasoning part; the answer part is searched first, the reasoning only when the answer
  part holds nothing (a model that closes its thinking and then writes nothing usable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(
    r"^\s*(?:<\|im_start\|>\s*assistant\b|<\|im_start\|>(?!\s*(?:user|system|tool)\b)|<\|start_header_id\|>\s*assistant\s*<\|end_header_id\|>"
    r"|<\|assistant\|>|<start_of_turn>\s*model\b|<\uff5cAssistant\uff5c>|<\|begin_of_text\|>"
    r"|<s>|<\|startoftext\|>)\s*")
_TURN_END = re.compile(
    r"<\|im_end\|>|<\|im_start\|>|<\|eot_id\|>|<\|endoftext\|>|<\|end_of_text\|>"
    r"|<\|start_header_id\|>|<\|end\|>|<\|user\|>|<\|assistant\|>|<\|system\|>|<end_of_turn>"
    r"|<start_of_turn>|</s>|<\uff5cend\u2581of\u2581sentence\uff5c>|<\uff5cUser\uff5c>"
    r"|<\uff5cAssistant\uff5c>|\[INST\]|<\|eom_id\|>|<\|return\|>")
_THINK_OPEN = re.compile(r"<(?:think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Parts:
    """The answer part of a completion, and its reasoning part ("" when it has none)."""

    answer: str
    reasoning: str = ""


def strip_template(text: str) -> str:
    """The assistant's turn alone: role headers dropped, cut at the first turn boundary."""
    if "<" not in text and "[INST]" not in text:
        return text  # no template token can be in it (the common case, kept cheap)
    while (m := _HEADER.match(text)) is not None and m.end() > 0:
        text = text[m.end():]
    end = _TURN_END.search(text)
    return text[:end.start()] if end is not None else text


def split_completion(text: str) -> Parts:
    """Template debris removed, then the answer split from the reasoning at ``</think>``."""
    text = strip_template(text)
    if "</" not in text:
        return Parts(text)
    closes = list(_THINK_CLOSE.finditer(text))
    if not closes:
        return Parts(text)
    last = closes[-1]
    reasoning = _THINK_OPEN.sub("", _THINK_CLOSE.sub("", text[:last.start()]))
    return Parts(text[last.end():], reasoning)


__all__ = ["Parts", "split_completion", "strip_template"]
