"""``tool_call`` and ``json_schema``: structured output, parsed, validated and compared by value.

Both score a completion in **parts**, each in [0, 1], reported in ``detail.parts``:

* ``tool_call``: ``format`` (1 when the completion's calls parse: a well-formed container and
  every call with a name and object arguments; a prose answer is format 0 where a call was
  expected), ``name`` (expected calls whose function name was called) and ``arguments``
  (expected calls matched in full: name, every argument by value, and the arguments valid
  against the tool's JSON Schema when ``tools`` are given). Calls are paired one-to-one by a
  maximum matching (any order, ``order: "any"``; by position with ``order: "exact"``), and
  ``name`` and ``arguments`` divide by max(expected calls, calls made), so an extra call
  costs like a missing one. ``calls: []`` (BFCL's irrelevance cases) expects no call: none
  made scores 1 on every part, any call 0 on name and arguments. With ``tools`` but no
  expected calls, name is the fraction of calls naming a known tool and arguments the
  fraction whose arguments validate.
* ``json_schema``: ``format`` (a JSON value was found; of several fenced blocks the last one
  counts), ``schema`` (it validates) and ``value`` (it equals ``reference.expected`` by
  value; only when the reference has one).

reward = sum(weight[p] * part[p]) / sum(weight[p]) over the parts present (default weights:
format 0.2, name 0.3, arguments 0.5; format 0.2, schema 0.3, value 0.5), so it lies in
[0, 1]; ``reward: "all_or_nothing"`` gives 1 only when every part is 1. A malformed
completion is a reward (format 0), never a failure: it is the model's fault. A reference that
cannot be used (a bad schema, an expected call its own schema rejects) is
``invalid_reference``, naming the field.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal, Mapping

from pydantic import Field, field_validator, model_validator

from rewardd.verifiers.base import InvalidReference, Outcome, Sample, Verifier, VerifierParams
from rewardd.verifiers.references import ReferenceModel, ReferenceShaped, StrictPart
from rewardd.verifiers.structured_match import (StringMatch, UncheckableValue, UnusableSchema,
                                                arguments_match, check_schema, choices,
                                                json_schema_types, max_matching, same,
                                                schema_errors, usable_schema)
from rewardd.verifiers.structured_parse import (CONTAINERS, Call, Container, FormatError,
                                                find_json, tool_calls)
from rewardd.verifiers.text import truncate

SHOWN_CALLS = 8
"""Calls listed in ``detail.calls`` (a completion may make thousands)."""


# --------------------------------------------------------------------------- references

class ExpectedCall(StrictPart):
    name: str = Field(min_length=1)
    """The function's name."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Every argument the call must pass, by value."""


def _tool_schema(tool: Any, index: int) -> tuple[str, Any]:
    """(name, parameters schema) of an OpenAI tool or a BFCL function document."""
    fn = tool.get("function") if isinstance(tool, dict) and "function" in tool else tool
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"tools[{index}] has no function name (an OpenAI tool "
                         "{type, function: {name, parameters}} or {name, parameters})")
    schema = json_schema_types(fn.get("parameters", {"type": "object"}))
    problem = check_schema(schema)
    if problem:
        raise ValueError(f"tools[{index}].parameters: {problem}")
    return fn["name"], schema


class ToolCallReference(ReferenceModel):
    calls: list[ExpectedCall] | None = None
    """The expected calls ([] expects none)."""
    possible_answer: list[dict[str, dict[str, list[Any]]]] | None = None
    """BFCL's ground truth instead: [{function: {argument: [acceptable values]}}]; "" among
    the values makes the argument optional; an object-valued argument's acceptable values
    are written the same way ({key: [acceptable values]}), as BFCL does."""
    tools: list[dict[str, Any]] | None = Field(None, max_length=1000)
    """The tools offered (OpenAI tool objects or BFCL function documents): their parameter
    schemas validate the arguments."""

    @field_validator("tools")
    @classmethod
    def _schemas(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(tools or ()):
            _tool_schema(tool, i)
        return tools

    @field_validator("possible_answer")
    @classmethod
    def _one_function_each(cls, value: list[dict[str, Any]] | None) -> Any:
        for i, item in enumerate(value or ()):
            if len(item) != 1:
                raise ValueError(f"possible_answer[{i}] must name exactly one function")
        return value

    @model_validator(mode="after")
    def _something_to_check(self) -> ToolCallReference:
        if self.calls is not None and self.possible_answer is not None:
            raise ValueError("give calls or possible_answer, not both")
        if self.calls is None and self.possible_answer is None and not self.tools:
            raise ValueError("tool_call needs calls, possible_answer or tools")
        return self

    def problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        schemas = self.schemas()
        if not schemas:
            return []
        names = [(("calls", i, "name"), c.name) for i, c in enumerate(self.calls or ())]
        names += [(("possible_answer", i), next(iter(c))) for i, c in
                  enumerate(self.possible_answer or ())]
        return [(path, f"calls {name!r}, which is not among tools")
                for path, name in names if name not in schemas]

    def deep_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        schemas = self.schemas()
        found: list[tuple[tuple[str | int, ...], str]] = []
        for i, call in enumerate(self.calls or () if schemas else ()):
            try:
                errors = _arguments_errors(call.arguments, schemas.get(call.name, True))
            except UnusableSchema as exc:
                return [(("tools",), str(exc))]
            if errors:
                found.append((("calls", i, "arguments"), f"break the tool's own schema: "
                              f"{errors[0]}"))
        return found

    def schemas(self) -> dict[str, Any]:
        return dict(_tool_schema(t, i) for i, t in enumerate(self.tools or ()))

    def expected(self) -> list[tuple[str, dict[str, list[Any]], set[str]]] | None:
        """(name, acceptable values per argument, optional arguments) per expected call."""
        if self.calls is not None:
            return [(c.name, {k: [v] for k, v in c.arguments.items()}, set())
                    for c in self.calls]
        if self.possible_answer is not None:
            out = []
            for item in self.possible_answer:
                [(name, args)] = item.items()
                out.append((name, {k: [choices(v) for v in vs if v != ""]
                                   for k, vs in args.items()},
                            {k for k, vs in args.items() if "" in vs}))
            return out
        return None


# --------------------------------------------------------------------------- params

def _combine(parts: Mapping[str, float], weights: Mapping[str, float], mode: str) -> float:
    if mode == "all_or_nothing":
        return 1.0 if all(v == 1.0 for v in parts.values()) else 0.0
    total = sum(weights[p] for p in parts)
    return sum(weights[p] * v for p, v in parts.items()) / total


class _Weights(VerifierParams):
    def by_part(self) -> dict[str, float]:
        return self.model_dump()

    @model_validator(mode="after")
    def _some_weight(self) -> _Weights:
        if sum(self.by_part().values()) <= 0:
            raise ValueError("at least one weight must be above 0")
        return self


class ToolCallWeights(_Weights):
    format: float = Field(0.2, ge=0, le=1000)
    name: float = Field(0.3, ge=0, le=1000)
    arguments: float = Field(0.5, ge=0, le=1000)


class JsonWeights(_Weights):
    format: float = Field(0.2, ge=0, le=1000)
    schema_: float = Field(0.3, ge=0, le=1000, alias="schema")
    value: float = Field(0.5, ge=0, le=1000)

    def by_part(self) -> dict[str, float]:
        return {"format": self.format, "schema": self.schema_, "value": self.value}


class _PartsParams(VerifierParams):
    reward: Literal["weighted", "all_or_nothing"] = "weighted"
    """``weighted``: the weighted mean of the parts; ``all_or_nothing``: 1 only when every
    part is 1."""
    strings: StringMatch = "exact"
    """``exact``, or ``bfcl``: case and the characters `` ,./-_*^`` ignored, as BFCL's
    checker does."""


class ToolCallParams(_PartsParams):
    formats: list[Container] = Field(default_factory=lambda: list(CONTAINERS), min_length=1)
    """Where calls may be: ``hermes`` <tool_call> tags, ``fenced`` code blocks, ``json`` (the
    whole completion)."""
    order: Literal["any", "exact"] = "any"
    """``any``: calls are paired whatever their order (parallel calls); ``exact``: the i-th
    call made is compared with the i-th expected."""
    weights: ToolCallWeights = Field(default_factory=ToolCallWeights)
    """Weight of each part in the reward; at least one above 0."""


class JsonSchemaParams(_PartsParams):
    formats: list[Literal["fenced", "json"]] = Field(default_factory=lambda: ["fenced", "json"],
                                                     min_length=1)
    """Where the JSON may be: ``fenced`` code blocks, ``json`` (the whole completion)."""
    json_schema: dict[str, Any] | None = None
    """The schema; else ``reference.schema``."""
    weights: JsonWeights = Field(default_factory=JsonWeights)
    """Weight of each part (format, schema, value) in the reward; at least one above 0."""

    _valid = field_validator("json_schema")(usable_schema)


# --------------------------------------------------------------------------- tool_call

class ToolCallVerifier(ReferenceShaped, Verifier):
    name = "tool_call"
    deterministic = True
    description = ("Tool calls (OpenAI tool_calls JSON, Hermes <tool_call> tags or a fenced "
                   "JSON block) checked against the expected calls: parts format, name and "
                   "arguments (by value, JSON Schema-valid), reward their weighted mean.")
    reference_fields: ClassVar[dict[str, str]] = {
        "calls": "list of {name, arguments}: the expected calls ([] expects none)",
        "possible_answer": "BFCL ground truth instead of calls: [{function: {argument: "
                           "[acceptable values, \"\" = optional]}}]",
        "tools": "optional list of OpenAI tools ({type: function, function: {name, "
                 "parameters}}) or BFCL function documents; parameters are JSON Schemas"}
    Params = ToolCallParams
    Reference = ToolCallReference

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: ToolCallParams) -> Outcome:
        ref: ToolCallReference = self.reference(reference)
        schemas, expected = ref.schemas(), ref.expected()
        detail: dict[str, Any] = {"weights": params.weights.by_part()}
        try:
            container, calls = tool_calls(sample.completion, params.formats)
        except FormatError as exc:
            parts = {"format": 0.0, "name": 0.0, "arguments": 0.0}
            return self._done(parts, params, detail, format_error=str(exc), calls=[])
        detail.update(container=container, calls=[truncate(json.dumps(c.to_dict()))
                                                  for c in calls[:SHOWN_CALLS]])
        try:
            invalid = {i: _arguments_errors(c.arguments, schemas[c.name])
                       for i, c in enumerate(calls) if c.name in schemas}
        except UnusableSchema as exc:
            raise InvalidReference(f"tool_call: reference.tools: {exc}") from None
        invalid = {i: e for i, e in invalid.items() if e}
        detail["schema_errors"] = {str(i): e for i, e in invalid.items()}
        if expected is None:
            parts = _validity_parts(calls, schemas, invalid)
        else:
            parts, matching = _match_parts(calls, expected, schemas, invalid, params, detail)
            detail["matched"] = matching
        return self._done(parts, params, detail)

    @staticmethod
    def _done(parts: dict[str, float], params: ToolCallParams, detail: dict[str, Any],
              **more: Any) -> Outcome:
        reward = _combine(parts, params.weights.by_part(), params.reward)
        return Outcome.success(reward, parts=parts, **detail, **more)


def _arguments_errors(arguments: dict[str, Any], schema: Any) -> list[str]:
    """A call's schema errors; arguments too deep to check break the schema (the model's
    output fails, it is never excluded)."""
    try:
        return schema_errors(arguments, schema)
    except UncheckableValue as exc:
        return [f"(root): {exc}"]


def _validity_parts(calls: list[Call], schemas: Mapping[str, Any],
                    invalid: Mapping[int, list[str]]) -> dict[str, float]:
    if not calls:
        return {"format": 0.0, "name": 0.0, "arguments": 0.0}
    known = [i for i, c in enumerate(calls) if c.name in schemas]
    return {"format": 1.0, "name": len(known) / len(calls),
            "arguments": sum(1 for i in known if i not in invalid) / len(calls)}


def _match_parts(calls: list[Call], expected: list[tuple[str, dict[str, list[Any]], set[str]]],
                 schemas: Mapping[str, Any], invalid: Mapping[int, list[str]],
                 params: ToolCallParams, detail: dict[str, Any]
                 ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    if not expected:
        none = 0.0 if calls else 1.0
        return {"format": 1.0, "name": none, "arguments": none}, []
    if not calls:
        return {"format": 0.0, "name": 0.0, "arguments": 0.0}, []
    problems: dict[tuple[int, int], list[str]] = {}

    def names(i: int, j: int) -> bool:
        return (params.order == "any" or i == j) and calls[j].name == expected[i][0]

    def full(i: int, j: int) -> bool:
        if not names(i, j):
            return False
        name, accepted, optional = expected[i]
        found = arguments_match(calls[j].arguments, accepted, optional, schemas.get(name),
                                params.strings) + invalid.get(j, [])
        problems[(i, j)] = found
        return not found

    full_pairs = max_matching(len(expected), len(calls), full)
    rest_e = [i for i in range(len(expected)) if i not in full_pairs]
    taken = set(full_pairs.values())
    rest_c = [j for j in range(len(calls)) if j not in taken]
    name_pairs = {rest_e[a]: rest_c[b] for a, b in max_matching(
        len(rest_e), len(rest_c), lambda a, b: names(rest_e[a], rest_c[b])).items()}
    denominator = max(len(expected), len(calls))
    matching = [{"expected": i, "call": j, "arguments_match": True}
                for i, j in sorted(full_pairs.items())]
    matching += [{"expected": i, "call": j, "arguments_match": False,
                  "problems": problems.get((i, j), [])[:5]}
                 for i, j in sorted(name_pairs.items())]
    detail["expected_calls"] = len(expected)
    return {"format": 1.0, "name": (len(full_pairs) + len(name_pairs)) / denominator,
            "arguments": len(full_pairs) / denominator}, matching


# --------------------------------------------------------------------------- json_schema

class JsonSchemaReference(ReferenceModel):
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    """The JSON Schema the output must satisfy (or params.json_schema)."""
    expected: Any = None
    """Optional: the value the output must equal (arrays unordered where the schema says)."""

    _valid = field_validator("schema_")(usable_schema)

    def deep_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        if self.schema_ is None or "expected" not in self.model_fields_set:
            return []
        try:
            errors = schema_errors(self.expected, self.schema_)
        except UnusableSchema as exc:
            return [(("schema",), str(exc))]
        except UncheckableValue as exc:
            return [(("expected",), str(exc))]
        return [(("expected",), f"breaks the schema: {errors[0]}")] if errors else []


class JsonSchemaVerifier(ReferenceShaped, Verifier):
    name = "json_schema"
    deterministic = True
    description = ("Structured output: the completion's JSON (a fenced block or the whole "
                   "completion) validated against a JSON Schema and, optionally, compared "
                   "by value with reference.expected; parts format, schema, value.")
    reference_fields: ClassVar[dict[str, str]] = {
        "schema": "JSON Schema (object) the output must satisfy; or params.json_schema",
        "expected": "optional: the JSON value the output must equal"}
    Params = JsonSchemaParams
    Reference = JsonSchemaReference

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: JsonSchemaParams) -> Outcome:
        ref: JsonSchemaReference = self.reference(reference)
        schema = params.json_schema if params.json_schema is not None else ref.schema_
        if schema is None:
            raise InvalidReference("json_schema: reference.schema: needed (or "
                                   "params.json_schema)")
        has_expected = "expected" in ref.model_fields_set
        try:
            if has_expected and params.json_schema is not None:
                errors = _expected_errors(ref.expected, schema)  # the reference's was checked
                if errors:
                    raise InvalidReference("json_schema: reference.expected breaks "
                                           f"params.json_schema: {errors[0]}")
            parts, detail = _json_parts(sample.completion, schema, ref.expected, has_expected,
                                        params)
        except UnusableSchema as exc:
            where = "reference.schema" if params.json_schema is None else "params.json_schema"
            raise InvalidReference(f"json_schema: {where}: {exc}") from None
        weights = params.weights.by_part()
        reward = _combine(parts, weights, params.reward)
        return Outcome.success(reward, parts=parts, weights=weights, **detail)


def _expected_errors(expected: Any, schema: Any) -> list[str]:
    try:
        return schema_errors(expected, schema)
    except UncheckableValue as exc:
        raise InvalidReference(f"json_schema: reference.expected: {exc}") from None


UNVERIFIABLE = "unverifiable"
"""``detail.rule`` of an output whose schema check cannot finish (too deep, or the schema
recurses through it without end): every part 0, a reward like any failed output's."""


def _json_parts(completion: str, schema: Any, expected: Any, has_expected: bool,
                params: JsonSchemaParams) -> tuple[dict[str, float], dict[str, Any]]:
    parts = {"format": 0.0, "schema": 0.0}
    if has_expected:
        parts["value"] = 0.0
    try:
        found = find_json(completion, params.formats)
    except FormatError as exc:
        return parts, {"format_error": str(exc)}
    value = found.values[-1]
    try:
        errors = schema_errors(value, schema)
    except UncheckableValue as exc:
        # scored 0, never excluded: an `error` cell would give the rollout advantage 0, and a
        # model could nest its output deeply to dodge a negative one (issue 28, row 11)
        return parts, {"container": found.container, "rule": UNVERIFIABLE,
                       "schema_errors": [f"(root): {exc}"]}
    parts["format"] = 1.0
    parts["schema"] = 0.0 if errors else 1.0
    if has_expected:
        parts["value"] = 1.0 if same(value, expected, schema, params.strings) else 0.0
    return parts, {"container": found.container, "schema_errors": errors,
                   "parsed": truncate(json.dumps(value))}
