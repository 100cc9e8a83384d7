"""Bounds on what one request body can make validation do: error count, nesting, unknown keys.

A body is at most ``REWARDD_MAX_BODY_BYTES`` (256 MiB by default), and before these bounds
the work spent refusing one was proportional to it with a large constant: a 1 MB msgpack
body whose ``mask`` held 1,000,000 nulls made pydantic report 1,000,000 errors (1 s to
find them, 2.8 s more to turn them into dicts, 113 MB of JSON, 2 GB of memory), and a
``reference`` nested 500 levels deep decoded fine and then broke pickling in the worker
pool. Three rules, each applied by the request models themselves so they hold for JSON and
msgpack alike and for the in-process entry point:

* **Every list and map of a request model stops at its first bad element**
  (:data:`FAIL_FAST`, pydantic's ``fail_fast``). A bad element is reported with its exact
  path; the ones after it are not looked at. Valid bodies validate exactly as before (same
  speed), and the errors of one body are bounded by the shape of the models (a few hundred
  at most), not by its size: refusing the 1,000,000-null mask takes 3 ms. What is shown is
  also capped at :data:`~rewardd.advantages.errors.MAX_ERRORS`.
* **A model refuses a map with more than MAX_ERRORS unknown keys as one error**
  (:class:`BoundedContract`): ``extra="forbid"`` otherwise reports each unknown key (a 9 MB
  map of 1,000,000 keys was 1,000,000 errors).
* **Free-form fields** (:data:`FreeForm`: ``reference``, ``params``, every ``dict[str,
  Any]``) **nest at most** :data:`MAX_DEPTH` **levels**; deeper is a 422 naming the field,
  the path inside it and the limit. The decoders stop at 1024 levels themselves (orjson's
  limit; msgpack's stack is 1024 too; the stdlib JSON fallback stops at the recursion
  limit), which is a 400; below that, 64 keeps every later step safe: orjson writes at most
  254 levels, pickle and Celery's serialisers recurse, and no verifier reference or
  parameter set needs more than a handful. The depth walk is iterative and visits only the
  free-form values (typed fields cannot nest: a list where a number belongs is a type
  error, found without descending into it), so typed per-token arrays cost nothing extra.

Alternatives weighed: a depth walk over the whole decoded document at decode time (simple,
but a Python loop over every element: ~4 s for a 2^27-token body, on every valid request);
counting errors through a validation context and aborting past the cap (pydantic offers no
way to abort a validation with the errors found so far); capping only what is rendered
(leaves the 1 µs/error validation and its memory unbounded: 256M errors for a 256 MiB body).
"""

from __future__ import annotations

from itertools import islice
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from rewardd.advantages.errors import MAX_ERRORS

MAX_DEPTH = 64
"""Levels of objects and arrays a free-form field may nest (``{"a": [1]}`` is 2)."""

FAIL_FAST: Any = Field(fail_fast=True)
"""``Annotated[list[X], FAIL_FAST]``: the list (or map) stops at its first bad element."""


def too_deep(value: Any, limit: int = MAX_DEPTH) -> tuple[Any, ...] | None:
    """The path to the first object or array in ``value`` nested more than ``limit`` levels
    deep (``value`` itself is level 1), or None. Iterative: any depth is safe to walk."""
    containers = (dict, list, tuple)
    stack = [(value, 1, ())] if isinstance(value, containers) else []
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return path
        for key, child in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(child, containers):
                stack.append((child, depth + 1, path + (key,)))
    return None


def _shallow(value: Any) -> Any:
    path = too_deep(value)
    if path is not None:
        where = ".".join(map(str, path))
        where = where if len(where) <= 120 else where[:117] + "..."
        raise PydanticCustomError(
            "too_deep", "nested more than {limit} levels deep (at {where}); objects and "
            "arrays may nest at most {limit} levels here: flatten it",
            {"limit": MAX_DEPTH, "where": where})
    return value


FreeForm = Annotated[dict[str, Any], FAIL_FAST, BeforeValidator(_shallow)]
"""A free-form object (verifier references, parameters): any JSON, at most MAX_DEPTH deep."""


class BoundedContract(BaseModel):
    """Base of request models: unknown fields are rejected so typos do not pass silently,
    and a map with more than MAX_ERRORS of them is one error, not one per key."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_fields(cls, data: Any) -> Any:
        fields = cls.model_fields
        if isinstance(data, dict) and len(data) > len(fields) + MAX_ERRORS:
            unknown = (key for key in data if key not in fields)
            shown = ", ".join(repr(key)[:40] for key in islice(unknown, 5))
            raise PydanticCustomError(
                "too_many_fields", "{count} keys where {model} has {known} fields; unknown "
                "ones include {shown}: send only the documented fields",
                {"count": len(data), "model": cls.__name__, "known": len(fields),
                 "shown": shown})
        return data
