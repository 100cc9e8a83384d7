"""JSON Schema checks and comparison by value, for the tool_call and json_schema verifiers.

Validation uses the ``jsonschema`` library, with the draft the schema's ``$schema`` names
(2020-12 when it names none). Only local ``$ref``s resolve: nothing is ever fetched, so a
schema from a request cannot make a worker call an address; an unresolvable ``$ref`` makes
the reference invalid. BFCL's function documents use Python type names (``dict``, ``float``,
``tuple``, ``any``), which are not JSON Schema; :func:`json_schema_types` maps them to
``object``, ``number``, ``array`` and no constraint (none of them is valid JSON Schema, so the
mapping never changes the meaning of a real schema).

Comparison by value (:func:`same`): numbers by numeric value (``1`` equals ``1.0``; ``true`` is
not ``1``), strings exactly (or BFCL-normalised), objects by key whatever the order, arrays in
order unless the schema of that array says order does not matter: ``"uniqueItems": true`` (a
set) or ``"x-unordered": true``. The schema is followed into ``properties``, ``items`` and
``prefixItems`` (not through ``$ref``s or combinators) to find which arrays are unordered.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

import jsonschema
from jsonschema.exceptions import best_match
from referencing.exceptions import Unresolvable

StringMatch = Literal["exact", "bfcl"]

_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_BFCL_STRIP = re.compile(r"[ ,./\-_*^]")
MAX_ERRORS = 5
MAX_SCHEMA_CHARS = 65_536
"""Largest schema accepted, as canonical JSON. Real tool and output schemas are a few KB;
the bound keeps a request's schema from costing the API (which checks it) or a worker (which
compiles its ``pattern`` regexes) more than a moment, and bounds the caches below."""
_CACHE_SIZE = 512
"""Checked schemas and built validators kept per process, by the schema's canonical JSON
(verdicts by its SHA-256): a group's rollouts share one reference, and a dataset reuses a
few tool sets. Checking a schema against its metaschema costs about a millisecond per KB
(seconds for 64 KB of a hostile shape, issue 28 row 7), more than the validation itself."""
INLINE_SCHEMA_CHARS = 16_384
"""Under a :func:`check_budget` (the API), a schema larger than this is not checked against
its metaschema there but by the worker that uses it (one check of it may cost a second)."""
MAX_VALUE_DEPTH = 64
"""Deepest value (arrays and objects in each other) checked against a schema; the same as
the API's nesting limit of a request. A model's output nested deeper cannot be checked:
it fails (:class:`UncheckableValue`), never is excluded."""
_PROBES: tuple[Any, ...] = (None, 0, True, [], {})
"""Shallow values a usable schema validates in a few steps; a schema that recurses without
end on one of them (``{"$ref": "#"}``) is unusable. No string: a string would compile the
schema's ``pattern`` regexes before any value needs them."""


def json_schema_types(schema: Any) -> Any:
    """``schema`` with BFCL's Python type names replaced by JSON Schema's (recursively)."""
    if isinstance(schema, list):
        return [json_schema_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: json_schema_types(v) for k, v in schema.items()}
    kind = out.get("type")
    if kind == "any":
        del out["type"]
    elif isinstance(kind, str) and kind in _BFCL_TYPES:
        out["type"] = _BFCL_TYPES[kind]
    return out


def _key(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@dataclass(slots=True)
class _Budget:
    cpu_s: float
    """Thread CPU seconds left for this request's uncached metaschema checks."""
    deferred: int = 0
    """Schemas left to the workers (for tests and logs)."""


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "rewardd_schema_check_budget", default=None)


@contextmanager
def check_budget(cpu_s: float) -> Iterator[_Budget]:
    """Around one request's checks in the API process: at most about ``cpu_s`` of this
    thread's CPU goes to metaschema checks of schemas not checked before (each at most
    :data:`INLINE_SCHEMA_CHARS`); the rest are left to the workers, which check every
    schema they use (:func:`check_schema` outside a budget) under their time limit. A
    schema found bad in the API is a 422; one left to a worker is ``invalid_reference``."""
    budget = _Budget(cpu_s)
    token = _budget.set(budget)
    try:
        yield budget
    finally:
        _budget.reset(token)


class _Verdicts:
    """Metaschema verdicts by the schema's SHA-256 (LRU, :data:`_CACHE_SIZE`): a schema the
    process checked once is never checked again, and the cache holds no schema text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, str | None] = OrderedDict()

    def get(self, digest: bytes) -> tuple[bool, str | None]:
        with self._lock:
            if digest not in self._entries:
                return False, None
            self._entries.move_to_end(digest)
            return True, self._entries[digest]

    def put(self, digest: bytes, verdict: str | None) -> None:
        with self._lock:
            self._entries[digest] = verdict
            self._entries.move_to_end(digest)
            while len(self._entries) > _CACHE_SIZE:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


verdicts = _Verdicts()


def check_schema(schema: Any) -> str | None:
    """Why ``schema`` is not a usable JSON Schema, or None.

    Checked against its draft's metaschema *without* format assertions: with them the
    ``regex`` format would compile every ``pattern`` of a request's schema here, in the API
    process (a request's regex is only ever compiled and run in a worker, under its time
    limit). A pattern that does not compile is found there: ``invalid_reference``. In a
    worker (outside a :func:`check_budget`), then applied to a few shallow values
    (:data:`_PROBES`): a schema that refers to itself without end (``{"$ref": "#"}``) is not
    usable either (``invalid_reference``).

    Under a :func:`check_budget` (the API), a schema not checked before is checked only while
    the budget lasts and when at most :data:`INLINE_SCHEMA_CHARS`; otherwise None here, and
    the worker checks it."""
    if not isinstance(schema, (dict, bool)):
        return f"a JSON Schema is an object, not {type(schema).__name__}"
    key = _key(schema)
    if len(key) > MAX_SCHEMA_CHARS:
        return f"the schema is {len(key)} characters of JSON, over the limit of " \
               f"{MAX_SCHEMA_CHARS}"
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    known, verdict = verdicts.get(digest)
    budget = _budget.get()
    if not known and budget is not None and (len(key) > INLINE_SCHEMA_CHARS
                                              or budget.cpu_s <= 0):
        budget.deferred += 1
        return None
    if not known:
        started = time.thread_time()
        try:
            verdict = _schema_problem(key)
        finally:
            if budget is not None:
                budget.cpu_s -= time.thread_time() - started
        verdicts.put(digest, verdict)
    if verdict is not None or budget is not None:
        return verdict
    # a worker: a schema that refers to itself without end is unusable. Never in the API:
    # applying a schema can cost exponential time ($refs used twice at each of many levels)
    probed = hashlib.sha256(b"probe\0" + digest).digest()
    known, verdict = verdicts.get(probed)
    if not known:
        verdict = _endless(schema, _PROBES)
        verdicts.put(probed, verdict)
    return verdict


def _draft(schema: Any) -> Any:
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _schema_problem(key: str) -> str | None:
    cls = _draft(json.loads(key))
    meta = cls.META_SCHEMA
    error = best_match(_draft(meta)(meta).iter_errors(json.loads(key)))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.path)
    return f"not a valid JSON Schema{f' at {where}' if where else ''}: {error.message}"


def _out_of_stack(exc: BaseException) -> bool:
    """A RecursionError, also as the panic the ``referencing`` library's Rust maps (rpds)
    turn one into when it strikes inside them (``pyo3_runtime.PanicException``, a
    BaseException that names no RecursionError type of its own)."""
    return isinstance(exc, RecursionError) or (
        type(exc).__name__ == "PanicException" and "RecursionError" in str(exc))


def _endless(schema: Any, probes: Iterable[Any]) -> str | None:
    """Why ``schema`` cannot be applied to a shallow value (it refers to itself without
    end), or None. A ``$ref`` that does not resolve is left to :func:`schema_errors`."""
    validator = _draft(schema)(schema)
    for probe in probes:
        try:
            for _ in validator.iter_errors(probe):
                pass
        except (Unresolvable, re.error, jsonschema.exceptions.SchemaError):
            return None  # reported where the schema is applied (UnusableSchema)
        except BaseException as exc:  # noqa: B036 - see _out_of_stack
            if not _out_of_stack(exc):
                raise
            return (f"the schema refers to itself without end (validating "
                    f"{json.dumps(probe)} never finishes); a $ref must lead to a constraint")
    return None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _validator(key: str) -> Any:
    schema = json.loads(key)
    return _draft(schema)(schema)


def usable_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """``schema`` when it is None or a valid JSON Schema, else ValueError (a validator)."""
    problem = None if schema is None else check_schema(schema)
    if problem:
        raise ValueError(problem)
    return schema


class UnusableSchema(ValueError):
    """The schema cannot be applied: a ``$ref`` that does not resolve locally (a remote one),
    a ``pattern`` that is not a regular expression, or a schema that refers to itself
    without end."""


class UncheckableValue(ValueError):
    """The value cannot be checked against the schema: nested deeper than
    :data:`MAX_VALUE_DEPTH`, or the check does not finish. The value's fault (a model's
    output): it fails the check, it is never excluded."""


def depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep (iterative, and
    stops at the first path past the limit)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children
                         if isinstance(child, (list, dict)))
    return False


class _OutOfStack(Exception):
    """A schema check that ran out of stack (:func:`_out_of_stack`)."""


def _sorted_errors(instance: Any, schema: Any) -> list[Any]:
    try:
        return sorted(_validator(_key(schema)).iter_errors(instance),
                      key=lambda e: list(map(str, e.path)))
    except BaseException as exc:  # noqa: B036 - see _out_of_stack
        if _out_of_stack(exc):
            raise _OutOfStack() from None
        raise


def schema_errors(instance: Any, schema: Any) -> list[str]:
    """The first :data:`MAX_ERRORS` ways ``instance`` breaks ``schema``, each with its JSON
    path; empty when it validates. :class:`UncheckableValue` when ``instance`` is too deep to
    check, :class:`UnusableSchema` when the schema cannot be applied."""
    if depth_over(instance, MAX_VALUE_DEPTH):
        raise UncheckableValue(f"the value nests arrays and objects more than "
                               f"{MAX_VALUE_DEPTH} deep, past what a schema check goes to")
    try:
        errors = _sorted_errors(instance, schema)
    except _OutOfStack:
        # the schema's fault when it cannot finish even on a shallow value, else the value's
        endless = _endless(schema, _PROBES + ("",))
        if endless:
            raise UnusableSchema(endless) from None
        raise UncheckableValue("checking the value against the schema does not finish "
                               "(the schema recurses through the value too deeply)") from None
    except Unresolvable as exc:
        raise UnusableSchema(f"the schema has a $ref that does not resolve locally: {exc}"
                             ) from None
    except re.error as exc:
        raise UnusableSchema(f"the schema has a pattern that is not a regular expression: "
                             f"{exc}") from None
    return [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message[:200]}"
            for e in errors[:MAX_ERRORS]]


def _norm(text: str, how: StringMatch) -> str:
    return _BFCL_STRIP.sub("", text).lower().replace("'", '"') if how == "bfcl" else text


def _sub(schema: Any, key: str | int) -> Any:
    if not isinstance(schema, dict):
        return None
    if isinstance(key, str):
        return (schema.get("properties") or {}).get(key)
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and key < len(prefix):
        return prefix[key]
    items = schema.get("items")
    return items if isinstance(items, dict) else None


def unordered(schema: Any) -> bool:
    return isinstance(schema, dict) and bool(schema.get("uniqueItems")
                                             or schema.get("x-unordered"))


class Choices(dict):  # type: ignore[type-arg]
    """An object in BFCL's possible-answer form: each key's acceptable values, ``""`` among
    them meaning the key may be left out. BFCL writes nested objects this way too."""


def choices(value: Any) -> Any:
    """``value`` of a BFCL possible answer with every nested object made :class:`Choices`."""
    if isinstance(value, list):
        return [choices(v) for v in value]
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return Choices({k: [choices(x) for x in vs] for k, vs in value.items()})
    return value


def same(value: Any, expected: Any, schema: Any = None, strings: StringMatch = "exact") -> bool:
    """Whether ``value`` equals ``expected`` by value (see the module docstring)."""
    if isinstance(expected, Choices):
        return isinstance(value, dict) and value.keys() <= expected.keys() and all(
            any(same(value[k], v, _sub(schema, k), strings) for v in vs if v != "")
            if k in value else "" in vs for k, vs in expected.items())
    if isinstance(expected, bool) or isinstance(value, bool):
        return type(value) is type(expected) and value == expected
    if isinstance(expected, (int, float)):
        return isinstance(value, (int, float)) and value == expected
    if isinstance(expected, str):
        return isinstance(value, str) and _norm(value, strings) == _norm(expected, strings)
    if isinstance(expected, dict):
        return (isinstance(value, dict) and value.keys() == expected.keys()
                and all(same(value[k], expected[k], _sub(schema, k), strings) for k in expected))
    if isinstance(expected, list):
        if not isinstance(value, list) or len(value) != len(expected):
            return False
        if unordered(schema):
            sub = _sub(schema, 0)
            pairs = max_matching(len(expected), len(value),
                                 lambda i, j: same(value[j], expected[i], sub, strings))
            return len(pairs) == len(expected)
        return all(same(v, e, _sub(schema, i), strings)
                   for i, (v, e) in enumerate(zip(value, expected)))
    return value is None and expected is None


def max_matching(left: int, right: int,
                 fits: Callable[[int, int], bool]) -> dict[int, int]:
    """A maximum one-to-one matching {left index: right index} of pairs that ``fits``
    (augmenting paths; groups of calls and array items are small)."""
    edges = [[j for j in range(right) if fits(i, j)] for i in range(left)]
    owner: dict[int, int] = {}

    def place(i: int, seen: set[int]) -> bool:
        for j in edges[i]:
            if j not in seen:
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(left):
        place(i, set())
    return {i: j for j, i in owner.items()}


def defaults(schema: Any) -> dict[str, Any]:
    """The ``default`` of each property of an object schema."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    return {k: v["default"] for k, v in (props or {}).items()
            if isinstance(v, dict) and "default" in v}


def arguments_match(got: Mapping[str, Any], accepted: Mapping[str, Sequence[Any]],
                    optional: Iterable[str], schema: Any, strings: StringMatch) -> list[str]:
    """Why the arguments ``got`` do not match (empty: they match). ``accepted`` lists the
    acceptable values of each expected argument; an ``optional`` one may be left out; an
    argument left out or added counts as given when its value is the schema's default."""
    problems = []
    schema_defaults = defaults(schema)
    optional = set(optional)
    for key, values in accepted.items():
        if key in got:
            if not any(same(got[key], v, _sub(schema, key), strings) for v in values):
                problems.append(f"argument {key!r} is {_short(got[key])}, expected "
                                + " or ".join(_short(v) for v in values))
        elif key not in optional and not (key in schema_defaults and any(
                same(schema_defaults[key], v, _sub(schema, key), strings) for v in values)):
            problems.append(f"argument {key!r} is missing")
    for key in got.keys() - accepted.keys():
        if not (key in schema_defaults and same(got[key], schema_defaults[key])):
            problems.append(f"argument {key!r} is not expected")
    return problems


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
