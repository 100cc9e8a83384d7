"""One sample as the protocols send it, made into what the verifiers read: the completion,
the prompt text and the reference its label stands for.

Each protocol carries the text differently (OpenRLHF: the decoded prompt plus completion
as one ``query``; slime: ``response`` apart, ``prompt`` a string or chat messages;
NeMo-Gym: an OpenAI Responses object whose ``output_text`` parts are the answer); this
module holds those readings so the routes only map fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rewardd.advantages.errors import Loc, RequestInvalid, error
from rewardd.service.compat.config import LABEL, CompatConfig


@dataclass(frozen=True, slots=True)
class SampleIn:
    """What one sample brings: the texts, the reference built from its label, and where its
    label was in the request (errors about the label name it)."""

    prompt: str
    completion: str
    reference: dict[str, Any]
    label_loc: Loc
    prompt_mismatch: bool = False
    """OpenRLHF: the query did not start with its prompt, so the whole query was scored."""


def completion_of_query(query: str, prompt: str | None) -> tuple[str, bool]:
    """OpenRLHF's ``query`` is the decoded prompt followed by the completion: (the text
    after the prompt, False). A query that does not start with its prompt (a tokenizer whose
    decode does not round-trip the prompt's text) is scored whole, (query, True), and the
    answer flags it in ``extra_logs.rewardd_prompt_mismatch``; cutting at a guessed offset
    could drop the answer, while a verifier that reads the last answer (math) still finds it
    in the whole text."""
    if prompt is None:
        return query, False
    if query.startswith(prompt):
        return query[len(prompt):], False
    return query, True


def reference_of(label: Any, config: CompatConfig, loc: Loc) -> dict[str, Any]:
    """The reference ``label`` stands for under ``config`` (see
    :attr:`CompatConfig.reference`); a 422 naming ``loc`` when it cannot be one."""
    if label is None:
        return {}
    if isinstance(label, str) and config.label_format == "json":
        try:
            label = json.loads(label)
        except json.JSONDecodeError as exc:
            raise RequestInvalid([error(loc, f"label_format is json and the label is not "
                                        f"JSON: {exc.msg} at {exc.pos}")]) from None
    if isinstance(label, dict):
        return label
    if isinstance(label, (list, bool)) or not isinstance(label, (str, int, float)):
        raise RequestInvalid([error(loc, "a label is a string, a number or an object (the "
                                    f"reference itself); got {type(label).__name__}")])
    return _fill(config.reference, str(label))


def _fill(template: Any, label: str) -> Any:
    if isinstance(template, str):
        return label if template == LABEL else template.replace(LABEL, label)
    if isinstance(template, dict):
        return {key: _fill(value, label) for key, value in template.items()}
    if isinstance(template, list):
        return [_fill(value, label) for value in template]
    return template


def chat_text(messages: Sequence[Any]) -> str:
    """Chat messages as ``role: content`` lines (the form rewardd-client sends for slime's
    chat prompts); content parts (``{"type": "input_text", "text": ...}``) are joined."""
    lines = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text") or "" for part in content
                              if isinstance(part, Mapping))
        lines.append(f"{message.get('role', 'user')}: {content or ''}")
    return "\n".join(lines)


def prompt_text(prompt: str | Sequence[Any] | None) -> str:
    """A prompt that is text or chat messages, as text."""
    if prompt is None:
        return ""
    return prompt if isinstance(prompt, str) else chat_text(prompt)


def responses_output_text(response: Mapping[str, Any]) -> str:
    """The assistant's text of an OpenAI Responses object: every ``output_text`` part of
    every ``message`` item, joined (what NeMo-Gym's resources servers read: reasoning items,
    tool calls and refusals are not the answer)."""
    parts = []
    for item in response.get("output") or ():
        if not isinstance(item, Mapping) or item.get("type") != "message":
            continue
        for content in item.get("content") or ():
            if isinstance(content, Mapping) and content.get("type") == "output_text":
                parts.append(content.get("text") or "")
    return "".join(parts)
