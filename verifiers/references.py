"""Reading a group's reference through a pydantic model, with errors that name the field.

The newer verifiers (tool_call, json_schema, critique, refusal, continuation) each declare
their reference shape as a pydantic model. :func:`read_reference` validates a reference
against it; a bad one raises :class:`~rewardd.verifiers.base.InvalidReference` whose message
names the field path (``reference.calls[0].name: Field required``), so the cell says exactly
what the dataset got wrong. :func:`reference_errors` gives the same findings as
``(path, message)`` pairs, for a request-time check that answers 422 before any worker runs.

Top-level keys a model does not know are allowed: one group's reference is read by every
reward component of the request (``{"answer": ..., "label": ...}`` serves math and critique
at once), so a key another verifier reads is not an error here. Inside a verifier's own
structures (a call, a tool) unknown keys are refused.
"""

from __future__ import annotations

from typing import Any, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rewardd.verifiers.base import InvalidReference

M = TypeVar("M", bound=BaseModel)


class ReferenceModel(BaseModel):
    """Base of reference shapes: other components' keys pass (see the module docstring)."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class StrictPart(BaseModel):
    """Base of structures inside a reference: an unknown key is a typo, refused."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def _path(loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    # pydantic adds the model-validator and union branch names to loc; keep the data path
    return tuple(p for p in loc if isinstance(p, int) or not str(p).startswith(
        ("function-", "list[", "dict[", "json-or-python", "union[")))


def reference_errors(model: type[BaseModel],
                     reference: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """Every problem of ``reference`` under ``model``: (path inside the reference, reason)."""
    try:
        model.model_validate(reference)
    except ValidationError as exc:
        return [(_path(tuple(e["loc"])), e["msg"].removeprefix("Value error, "))
                for e in exc.errors()]
    return []


def format_path(path: tuple[str | int, ...]) -> str:
    text = "reference"
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def read_reference(model: type[M], reference: Mapping[str, Any], verifier: str) -> M:
    """``reference`` as ``model``, or :class:`InvalidReference` naming each bad field."""
    try:
        return model.model_validate(reference)
    except ValidationError:
        problems = reference_errors(model, reference)
        raise InvalidReference(f"{verifier}: " + "; ".join(
            f"{format_path(path)}: {msg}" for path, msg in problems[:5])) from None
