"""Finding the JSON and the tool calls in a completion, as the serving stacks write them.

Containers, tried in this order (the first that occurs decides; ``formats`` may leave any out):

* ``hermes``: ``<tool_call>{...}</tool_call>`` tags, one call per tag (Hermes 2 Pro, Qwen2.5,
  Qwen3; what vLLM's ``hermes`` tool parser reads). A tag opened and never closed is a format
  error (a completion cut at max_tokens), not a call.
* ``fenced``: Markdown code blocks, ```` ```json ```` or bare ```` ``` ````; every block counts.
* ``json``: the whole completion is one JSON value, after an optional ``[TOOL_CALLS]``
  (Mistral) or ``<|python_tag|>`` (Llama 3.1) marker.

Reasoning first: a completion with ``</think>`` is read after the last one, so a draft call
inside the reasoning is never scored.

JSON shapes accepted inside a container, for tool calls: an OpenAI message or response
fragment ``{"tool_calls": [...]}``, a list of calls, or one call; a call is OpenAI's
``{"type": "function", "function": {"name", "arguments"}}`` (``arguments`` a JSON string, as
the API and vLLM send it, or an object), Hermes' ``{"name", "arguments"}`` or Llama's
``{"name", "parameters"}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

Container = Literal["hermes", "fenced", "json"]
CONTAINERS: tuple[Container, ...] = ("hermes", "fenced", "json")

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)```", re.DOTALL)
_MARKERS = ("[TOOL_CALLS]", "<|python_tag|>")


class FormatError(ValueError):
    """The completion holds no well-formed JSON (or tool call) where one was asked for: the
    model's fault, scored as the format part, never a verifier failure."""


class NoJSON(FormatError):
    """No container at all: for a tool call, the model answered in prose (no call made)."""


@dataclass(frozen=True, slots=True)
class Found:
    """JSON values read from a completion, and the container they came from."""

    container: Container
    values: list[Any] = field(default_factory=list)


def answer_part(text: str) -> str:
    """The part after the last ``</think>``; the whole text when there is none."""
    head, sep, tail = text.rpartition("</think>")
    return tail if sep else text


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FormatError(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:  # a completion of 10^5 nested brackets is the model's doing
        raise FormatError(f"{where} nests too deeply to read") from None


def find_json(text: str, formats: Sequence[Container] = CONTAINERS) -> Found:
    """Every JSON value of the first container kind present; :class:`FormatError` if none."""
    text = answer_part(text)
    if "hermes" in formats and "<tool_call>" in text:
        tags = _HERMES.findall(text)
        if text.count("<tool_call>") != len(tags):
            raise FormatError("a <tool_call> tag is never closed")
        return Found("hermes", [_loads(t.strip(), "a <tool_call> tag") for t in tags])
    if "fenced" in formats:
        blocks = [body for lang, body in _FENCE.findall(text)
                  if lang.lower() in ("", "json", "tool_call", "tool_calls")]
        if blocks:
            return Found("fenced", [_loads(b.strip(), "a fenced block") for b in blocks])
    if "json" in formats:
        bare = text.strip()
        for marker in _MARKERS:
            if bare.startswith(marker):
                bare = bare[len(marker):].strip()
        if bare[:1] in ("{", "["):
            return Found("json", [_loads(bare, "the completion")])
    raise NoJSON(f"no JSON found (looked for: {', '.join(formats)})")


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call: the function's name and its arguments, decoded."""

    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


def _call(item: Any, where: str) -> Call:
    if not isinstance(item, dict):
        raise FormatError(f"{where} is {type(item).__name__}, not a call object")
    body = item.get("function") if isinstance(item.get("function"), dict) else item
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise FormatError(f"{where} has no function name")
    args = body.get("arguments", body.get("parameters", {}))
    if isinstance(args, str):  # OpenAI and vLLM send arguments JSON-encoded
        args = _loads(args, f"{where}'s arguments string") if args.strip() else {}
    if not isinstance(args, dict):
        raise FormatError(f"{where}'s arguments are {type(args).__name__}, not an object")
    return Call(name.strip(), args)


def tool_calls(text: str,
               formats: Sequence[Container] = CONTAINERS) -> tuple[Container | None, list[Call]]:
    """The calls a completion makes, in order, and their container: ``(None, [])`` for a
    completion without any (a prose answer makes no call); :class:`FormatError` when there
    is a container but something in it is not a call."""
    try:
        found = find_json(text, formats)
    except NoJSON:
        return None, []
    calls: list[Call] = []
    for value in found.values:
        items = value.get("tool_calls") if isinstance(value, dict) and "tool_calls" in value \
            else value
        if isinstance(items, list):
            calls.extend(_call(item, f"call {len(calls) + i}") for i, item in enumerate(items))
        else:
            calls.append(_call(items, f"call {len(calls)}"))
    return found.container, calls
