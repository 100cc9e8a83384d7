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

from typing import Any, ClassVar, Collection, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rewardd.verifiers.base import InvalidReference

M = TypeVar("M", bound=BaseModel)


class ReferenceModel(BaseModel):
    """Base of reference shapes: other components' keys pass (see the module docstring)."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    def problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Checks across fields, each at the path it concerns (a model validator can only
        report at the reference as a whole): run once the fields themselves are valid."""
        return []

    def deep_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Checks that run a request's own code, such as the regular expressions of a JSON
        Schema's ``pattern``: only in the worker (``verify``), under its time limit, never in
        the API process, where one catastrophic pattern would stall every request."""
        return []


class StrictPart(BaseModel):
    """Base of structures inside a reference: an unknown key is a typo, refused."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def _path(loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    # pydantic adds the model-validator and union branch names to loc; keep the data path
    return tuple(p for p in loc if isinstance(p, int) or not str(p).startswith(
        ("function-", "list[", "dict[", "json-or-python", "union[")))


def _validate(model: type[M], reference: Mapping[str, Any], deep: bool = False
              ) -> tuple[M | None, list[tuple[tuple[str | int, ...], str]]]:
    try:
        parsed = model.model_validate(reference)
    except ValidationError as exc:
        return None, [(_path(tuple(e["loc"])), e["msg"].removeprefix("Value error, "))
                      for e in exc.errors()]
    if not isinstance(parsed, ReferenceModel):
        return parsed, []
    return parsed, parsed.problems() + (parsed.deep_problems() if deep else [])


def reference_errors(model: type[BaseModel],
                     reference: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """Every problem of ``reference`` under ``model`` that is safe to find in the API process
    (not :meth:`ReferenceModel.deep_problems`): (path inside the reference, reason)."""
    return _validate(model, reference)[1]


def format_path(path: tuple[str | int, ...]) -> str:
    text = "reference"
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def read_reference(model: type[M], reference: Mapping[str, Any], verifier: str) -> M:
    """``reference`` as ``model``, or :class:`InvalidReference` naming each bad field."""
    parsed, problems = _validate(model, reference, deep=True)
    if parsed is None or problems:
        raise InvalidReference(f"{verifier}: " + "; ".join(
            f"{format_path(path)}: {msg}" for path, msg in problems[:5]))
    return parsed


class ReferenceShaped:
    """Mixin of a verifier whose reference is a :class:`ReferenceModel`: ``Reference`` is the
    shape, :meth:`reference_errors` is what the service checks before anything runs (a 422 at
    ``body.groups[i].reference.<path>``), :meth:`reference` what ``verify`` reads."""

    name: ClassVar[str]
    Reference: ClassVar[type[ReferenceModel]]

    def reference_errors(self, reference: Any, shared: Collection[str] = ()
                         ) -> list[tuple[tuple[str | int, ...], str]]:
        """``shared`` (the keys other verifiers of the request read) is not needed here:
        top-level keys this shape does not know are allowed anyway."""
        if not isinstance(reference, Mapping):
            return [((), f"must be an object, not {type(reference).__name__}")]
        return reference_errors(self.Reference, reference)

    def reference(self, reference: Mapping[str, Any]) -> Any:
        return read_reference(self.Reference, reference, self.name)
