"""tool_call and json_schema: tool calls as vLLM, Hermes/Qwen, Mistral and Llama emit them,
BFCL cases (simple, multiple, parallel, irrelevance) with BFCL's own function documents and
possible answers, parts and their combination hand-computed, typed reference failures."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import FailureKind, Sample, run_verifier
from rewardd.verifiers.structured import JsonSchemaParams, ToolCallParams

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_current_weather",
    "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City and state, e.g. San Francisco, CA"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
        "required": ["location"]}}}
WEATHER = {"calls": [{"name": "get_current_weather",
                      "arguments": {"location": "Boston, MA", "unit": "fahrenheit"}}],
           "tools": [WEATHER_TOOL]}

# BFCL v3 simple_0 and parallel_0: function documents with BFCL's Python type names
TRIANGLE_DOC = {"name": "calculate_triangle_area",
                "description": "Calculate the area of a triangle given its base and height.",
                "parameters": {"type": "dict", "properties": {
                    "base": {"type": "integer", "description": "The base of the triangle."},
                    "height": {"type": "integer", "description": "The height of the triangle."},
                    "unit": {"type": "string", "description": "The unit of measure (defaults "
                             "to 'units' if not specified)"}},
                    "required": ["base", "height"]}}
TRIANGLE = {"tools": [TRIANGLE_DOC], "possible_answer": [
    {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]}
SPOTIFY_DOC = {"name": "spotify.play", "description": "Play specific tracks from a given "
               "artist for specific time duration.", "parameters": {"type": "dict", "properties": {
                   "artist": {"type": "string", "description": "The artist whose songs you want "
                              "to play."},
                   "duration": {"type": "integer", "description": "The duration for which the "
                                "songs should be played, in minutes."}},
                   "required": ["artist", "duration"]}}
SPOTIFY = {"tools": [SPOTIFY_DOC], "possible_answer": [
    {"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
    {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}}]}


def tool(completion: str, reference: dict[str, Any], **params: Any) -> Any:
    return run_verifier(REGISTRY["tool_call"], Sample(completion), reference, params)


def js(completion: str, reference: dict[str, Any], **params: Any) -> Any:
    return run_verifier(REGISTRY["json_schema"], Sample(completion), reference, params)


def hermes(*calls: dict[str, Any]) -> str:
    return "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in calls)


# ----------------------------------------------------------------------- formats

VLLM_MESSAGE = json.dumps({"role": "assistant", "content": None, "tool_calls": [{
    "id": "chatcmpl-tool-5f3c0a7e", "type": "function", "function": {
        "name": "get_current_weather",
        "arguments": "{\"location\": \"Boston, MA\", \"unit\": \"fahrenheit\"}"}}]})
QWEN3 = ("<think>\nThe user wants Boston's weather. Maybe <tool_call>{\"name\": \"x\"}"
         "</tool_call>? No, the real tool is get_current_weather.\n</think>\n\n"
         + hermes({"name": "get_current_weather",
                   "arguments": {"location": "Boston, MA", "unit": "fahrenheit"}}))


@pytest.mark.parametrize("completion,container", [
    (VLLM_MESSAGE, "json"),
    (QWEN3, "hermes"),
    ('[TOOL_CALLS][{"name": "get_current_weather", "arguments": '
     '{"location": "Boston, MA", "unit": "fahrenheit"}}]', "json"),
    ('<|python_tag|>{"name": "get_current_weather", "parameters": '
     '{"location": "Boston, MA", "unit": "fahrenheit"}}', "json"),
    ('I will call the tool.\n```json\n{"name": "get_current_weather", "arguments": '
     '{"unit": "fahrenheit", "location": "Boston, MA"}}\n```', "fenced"),
])
def test_every_serving_format_of_the_same_call_scores_one(completion: str,
                                                          container: str) -> None:
    out = tool(completion, WEATHER)
    assert out.ok and out.reward == 1.0, out.detail
    assert out.detail["container"] == container
    assert out.detail["parts"] == {"format": 1.0, "name": 1.0, "arguments": 1.0}


def test_a_draft_call_inside_the_reasoning_is_not_scored() -> None:
    out = tool("<think><tool_call>{\"name\": \"get_current_weather\", \"arguments\": "
               "{\"location\": \"Boston, MA\", \"unit\": \"fahrenheit\"}}</tool_call></think>"
               "It is sunny.", WEATHER)
    assert out.reward == 0.0 and out.detail["container"] is None


@pytest.mark.parametrize("completion,why", [
    ('<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Bos',
     "never closed"),
    ('<tool_call>{"name": "get_current_weather", "arguments": {location: 1}}</tool_call>',
     "not valid JSON"),
    ('{"tool_calls": [{"type": "function", "function": {"name": "get_current_weather", '
     '"arguments": "{\\"location\\": "}}]}', "arguments string is not valid JSON"),
    ('<tool_call>{"arguments": {"location": "Boston, MA"}}</tool_call>', "no function name"),
    ('<tool_call>{"name": "get_current_weather", "arguments": ["Boston"]}</tool_call>',
     "not an object"),
    ("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>", "nests too deeply"),
])
def test_malformed_calls_are_format_zero_with_the_reason_not_a_failure(completion: str,
                                                                      why: str) -> None:
    out = tool(completion, WEATHER)
    assert out.ok and out.reward == 0.0
    assert out.detail["parts"] == {"format": 0.0, "name": 0.0, "arguments": 0.0}
    assert why in out.detail["format_error"]


def test_parts_combine_as_the_weighted_mean() -> None:
    wrong_unit = hermes({"name": "get_current_weather",
                         "arguments": {"location": "Boston, MA", "unit": "celsius"}})
    out = tool(wrong_unit, WEATHER)
    assert out.detail["parts"] == {"format": 1.0, "name": 1.0, "arguments": 0.0}
    assert out.reward == pytest.approx(0.2 + 0.3)  # (0.2*1 + 0.3*1 + 0.5*0) / 1.0
    assert out.detail["matched"][0]["problems"] == [
        "argument 'unit' is 'celsius', expected 'fahrenheit'"]
    out = tool(wrong_unit, WEATHER, weights={"format": 1, "name": 1, "arguments": 2})
    assert out.reward == pytest.approx(2 / 4)
    assert tool(wrong_unit, WEATHER, reward="all_or_nothing").reward == 0.0
    wrong_name = hermes({"name": "get_weather", "arguments": {"location": "Boston, MA"}})
    assert tool(wrong_name, WEATHER).reward == pytest.approx(0.2)


def test_prose_where_a_call_was_expected_scores_zero_on_every_part() -> None:
    out = tool("The weather in Boston is usually mild.", WEATHER)
    assert out.ok and out.reward == 0.0
    assert out.detail["parts"] == {"format": 0.0, "name": 0.0, "arguments": 0.0}


def test_arguments_invalid_against_the_tool_schema_do_not_match() -> None:
    ref = {"tools": [WEATHER_TOOL], "calls": [{"name": "get_current_weather",
                                               "arguments": {"location": "Boston, MA"}}]}
    out = tool(hermes({"name": "get_current_weather",
                       "arguments": {"location": "Boston, MA", "unit": "kelvin"}}), ref)
    assert out.detail["parts"]["arguments"] == 0.0
    assert out.detail["schema_errors"]["0"] == [
        "unit: 'kelvin' is not one of ['celsius', 'fahrenheit']"]


def test_a_schema_default_may_be_given_or_left_out() -> None:
    ref = {"tools": [WEATHER_TOOL], "calls": [{"name": "get_current_weather",
                                               "arguments": {"location": "Boston, MA"}}]}
    given = {"name": "get_current_weather",
             "arguments": {"location": "Boston, MA", "unit": "celsius"}}
    assert tool(hermes(given), ref).reward == 1.0
    ref_with_unit = {"tools": [WEATHER_TOOL], "calls": [given]}
    left_out = {"name": "get_current_weather", "arguments": {"location": "Boston, MA"}}
    assert tool(hermes(left_out), ref_with_unit).reward == 1.0


def test_values_compare_by_value_not_by_spelling() -> None:
    ref = {"calls": [{"name": "f", "arguments": {"x": 2, "flag": True, "o": {"a": 1, "b": [1]}}}]}
    assert tool(hermes({"name": "f", "arguments": {"o": {"b": [1.0], "a": 1.0}, "flag": True,
                                                    "x": 2.0}}), ref).reward == 1.0
    assert tool(hermes({"name": "f", "arguments": {"x": 2, "flag": 1, "o": {"a": 1, "b": [1]}}}),
                ref).detail["parts"]["arguments"] == 0.0
    assert tool(hermes({"name": "f", "arguments": {"x": "2", "flag": True,
                                                    "o": {"a": 1, "b": [1]}}}),
                ref).detail["parts"]["arguments"] == 0.0


def test_arrays_are_ordered_unless_the_schema_makes_them_sets() -> None:
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "steps": {"type": "array", "items": {"type": "string"}},
        "rows": {"type": "array", "x-unordered": True}}}
    ref = {"tools": [{"name": "f", "parameters": schema}],
           "calls": [{"name": "f", "arguments": {"tags": ["a", "b"], "steps": ["x", "y"],
                                                 "rows": [[1], [2]]}}]}
    swapped_sets = {"tags": ["b", "a"], "steps": ["x", "y"], "rows": [[2], [1]]}
    assert tool(hermes({"name": "f", "arguments": swapped_sets}), ref).reward == 1.0
    swapped_list = {"tags": ["a", "b"], "steps": ["y", "x"], "rows": [[1], [2]]}
    assert tool(hermes({"name": "f", "arguments": swapped_list}),
                ref).detail["parts"]["arguments"] == 0.0


# ----------------------------------------------------------------------- BFCL

@pytest.mark.parametrize("arguments,reward", [
    ({"base": 10, "height": 5}, 1.0),                       # "" makes unit optional
    ({"base": 10, "height": 5, "unit": "units"}, 1.0),
    ({"base": 10, "height": 5, "unit": "cm"}, 0.5),         # 0.2 + 0.3
    ({"base": 10}, 0.5),                                    # height missing
    ({"base": "10", "height": 5}, 0.5),                     # a string is not the integer
])
def test_bfcl_simple_with_its_possible_answers(arguments: dict[str, Any], reward: float) -> None:
    out = tool(hermes({"name": "calculate_triangle_area", "arguments": arguments}), TRIANGLE)
    assert out.ok and out.reward == pytest.approx(reward), out.detail


def test_bfcl_parallel_calls_match_in_any_order_and_extra_calls_cost() -> None:
    taylor = {"name": "spotify.play", "arguments": {"artist": "Taylor Swift", "duration": 20}}
    maroon = {"name": "spotify.play", "arguments": {"artist": "Maroon 5", "duration": 15}}
    assert tool(hermes(maroon, taylor), SPOTIFY).reward == 1.0
    out = tool(hermes(maroon, taylor), SPOTIFY, order="exact")
    # by position: both names match, neither call's arguments do
    assert out.detail["parts"] == {"format": 1.0, "name": 1.0, "arguments": 0.0}
    only_one = tool(hermes(taylor), SPOTIFY)
    assert only_one.detail["parts"] == {"format": 1.0, "name": 0.5, "arguments": 0.5}
    assert only_one.reward == pytest.approx(0.2 + 0.3 * 0.5 + 0.5 * 0.5)
    three = tool(hermes(taylor, maroon, taylor), SPOTIFY)  # divided by max(2, 3)
    assert three.detail["parts"] == {"format": 1.0, "name": 2 / 3, "arguments": 2 / 3}


def test_bfcl_multiple_picks_the_right_function_among_several() -> None:
    ref = {"tools": [TRIANGLE_DOC, SPOTIFY_DOC], "possible_answer": TRIANGLE["possible_answer"]}
    wrong = tool(hermes({"name": "spotify.play",
                         "arguments": {"artist": "Taylor Swift", "duration": 20}}), ref)
    assert wrong.reward == pytest.approx(0.2)


def test_bfcl_irrelevance_expects_no_call() -> None:
    ref = {"tools": [TRIANGLE_DOC], "calls": []}
    answer = tool("None of the functions can compute the distance to the moon.", ref)
    assert answer.reward == 1.0
    called = tool(hermes({"name": "calculate_triangle_area",
                          "arguments": {"base": 1, "height": 1}}), ref)
    assert called.detail["parts"] == {"format": 1.0, "name": 0.0, "arguments": 0.0}
    assert called.reward == pytest.approx(0.2)


def test_bfcl_nested_objects_and_lists_in_possible_answers() -> None:
    # BFCL writes an object-valued argument as {key: [acceptable values]} too, and a
    # list-valued one as a list of acceptable lists
    ref = {"possible_answer": [{"book_hotel": {
        "guest": [{"name": ["Ana", "Ana Lima"], "age": [30, ""]}],
        "nights": [[1, 2], [2, 1]]}}]}
    good = {"guest": {"name": "Ana Lima"}, "nights": [2, 1]}
    assert tool(hermes({"name": "book_hotel", "arguments": good}), ref).reward == 1.0
    for bad in ({"guest": {"name": "Bo"}, "nights": [1, 2]},           # not acceptable
                {"guest": {"name": "Ana", "age": 31}, "nights": [1, 2]},
                {"guest": {"name": "Ana", "vip": True}, "nights": [1, 2]},  # unknown key
                {"guest": {"age": 30}, "nights": [1, 2]},              # name is required
                {"guest": {"name": "Ana"}, "nights": [1, 3]}):
        out = tool(hermes({"name": "book_hotel", "arguments": bad}), ref)
        assert out.detail["parts"]["arguments"] == 0.0, bad


def test_bfcl_string_matching_ignores_case_and_punctuation_when_asked() -> None:
    ref = {"calls": [{"name": "find", "arguments": {"city": "New York, NY"}}]}
    loose = hermes({"name": "find", "arguments": {"city": "new york ny"}})
    assert tool(loose, ref).detail["parts"]["arguments"] == 0.0
    assert tool(loose, ref, strings="bfcl").reward == 1.0


def test_tools_without_expected_calls_score_validity() -> None:
    ref = {"tools": [WEATHER_TOOL]}
    good = {"name": "get_current_weather", "arguments": {"location": "Oslo"}}
    bad = {"name": "get_current_weather", "arguments": {"unit": "celsius"}}  # no location
    unknown = {"name": "book_flight", "arguments": {}}
    out = tool(hermes(good, bad, unknown), ref)
    assert out.detail["parts"] == {"format": 1.0, "name": 2 / 3, "arguments": 1 / 3}


# ----------------------------------------------------------------------- bad references, params

@pytest.mark.parametrize("reference,field", [
    ({}, "needs calls, possible_answer or tools"),
    ({"calls": [{"name": "f", "args": {}}]}, "reference.calls[0].args"),
    ({"calls": [{"arguments": {}}]}, "reference.calls[0].name"),
    ({"calls": "f()"}, "reference.calls"),
    ({"tools": [{"name": "f", "parameters": {"type": "objekt"}}]}, "tools[0].parameters"),
    ({"tools": [WEATHER_TOOL], "calls": [{"name": "get_weather"}]},
     "reference.calls[0].name: calls 'get_weather', which is not among tools"),
    ({"tools": [WEATHER_TOOL], "calls": [{"name": "get_current_weather",
                                          "arguments": {"location": 3}}]},
     "reference.calls[0].arguments: break the tool's own schema"),
    ({"possible_answer": [{"f": {"a": [1]}, "g": {}}]}, "exactly one function"),
    ({"tools": [{"name": "f", "parameters": {"$ref": "https://example.com/s.json"}}],
      "calls": [{"name": "f"}]}, "does not resolve"),
    ({"tools": [{"name": "f", "parameters": {"properties": {"a": {"pattern": "("}}}}],
      "calls": [{"name": "f", "arguments": {"a": "x"}}]}, "not a regular expression"),
    ({"tools": [{"name": "f", "parameters": {"description": "x" * 70_000}}]},
     "over the limit of 65536"),
])
def test_bad_references_are_invalid_reference_naming_the_field(reference: dict[str, Any],
                                                               field: str) -> None:
    out = tool(hermes({"name": "f", "arguments": {}}), reference)
    assert out.error is FailureKind.invalid_reference
    assert field in out.detail["message"]


def test_bad_params_are_rejected_naming_the_field() -> None:
    for params, loc in [({"weights": {"format": 0, "name": 0, "arguments": 0}}, ("weights",)),
                        ({"formats": ["xml"]}, ("formats", 0)), ({"order": "sorted"}, ("order",)),
                        ({"weights": {"style": 1}}, ("weights", "style"))]:
        with pytest.raises(ValidationError) as info:
            ToolCallParams.model_validate(params)
        assert info.value.errors()[0]["loc"] == loc
    with pytest.raises(ValidationError) as info:
        JsonSchemaParams.model_validate({"json_schema": {"type": 5}})
    assert info.value.errors()[0]["loc"] == ("json_schema",)


# ----------------------------------------------------------------------- json_schema

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                         "langs": {"type": "array", "items": {"type": "string"},
                                   "uniqueItems": True}}}


def test_json_schema_parts_and_reward() -> None:
    ref = {"schema": PERSON, "expected": {"name": "Ada", "age": 36, "langs": ["en", "fr"]}}
    exact = js('```json\n{"age": 36, "name": "Ada", "langs": ["fr", "en"]}\n```', ref)
    assert exact.reward == 1.0 and exact.detail["container"] == "fenced"
    valid_other = js('{"name": "Bob", "age": 1}', ref)
    assert valid_other.detail["parts"] == {"format": 1.0, "schema": 1.0, "value": 0.0}
    assert valid_other.reward == pytest.approx(0.5)
    invalid = js('{"name": "Ada", "age": -1, "extra": 1}', ref)
    assert invalid.detail["parts"] == {"format": 1.0, "schema": 0.0, "value": 0.0}
    assert invalid.detail["schema_errors"] == [
        "(root): Additional properties are not allowed ('extra' was unexpected)",
        "age: -1 is less than the minimum of 0"]
    prose = js("Ada is 36.", ref)
    assert prose.reward == 0.0 and "no JSON found" in prose.detail["format_error"]


def test_json_schema_without_expected_normalises_over_format_and_schema() -> None:
    out = js('{"name": "Ada", "age": "old"}', {"schema": PERSON})
    assert out.detail["parts"] == {"format": 1.0, "schema": 0.0}
    assert out.reward == pytest.approx(0.2 / 0.5)
    assert js('{"name": "Ada", "age": 3}', {}, json_schema=PERSON).reward == 1.0


def test_json_schema_the_last_fenced_block_counts() -> None:
    text = 'Draft:\n```json\n{"name": 1}\n```\nFinal:\n```json\n{"name": "A", "age": 2}\n```'
    assert js(text, {"schema": PERSON}).reward == 1.0


@pytest.mark.parametrize("reference,field", [
    ({}, "reference.schema: needed"),
    ({"schema": {"type": "objekt"}}, "reference.schema"),
    ({"schema": PERSON, "expected": {"name": "Ada"}}, "reference.expected: breaks the schema"),
])
def test_json_schema_bad_references(reference: dict[str, Any], field: str) -> None:
    out = js("{}", reference)
    assert out.error is FailureKind.invalid_reference and field in out.detail["message"]


@pytest.mark.parametrize("name,reference,errors", [
    ("tool_call", {"calls": [{"name": "f", "args": {}}]},
     [(("calls", 0, "args"), "Extra inputs are not permitted")]),
    ("tool_call", {"tools": [WEATHER_TOOL], "possible_answer": [{"g": {}}]},
     [(("possible_answer", 0), "calls 'g', which is not among tools")]),
    ("tool_call", {"answer": "42", **WEATHER}, []),  # another component's key passes
    ("json_schema", {"schema": {"type": "objekt"}},
     [(("schema",), "not a valid JSON Schema at type: 'objekt' is not valid under any of "
                    "the given schemas")]),
    ("json_schema", {}, []),  # the schema may come in params: checked when it runs
    ("tool_call", ["f"], [((), "must be an object, not list")]),
    # validating values against a request's schema runs its regular expressions: only in the
    # worker (run_verifier reports these, see test_bad_references_...), never in the API
    ("tool_call", {"tools": [{"name": "f", "parameters": {"properties": {"a": {
        "type": "string", "pattern": "^(a+)+$"}}}}], "calls": [{"name": "f", "arguments": {
            "a": "a" * 40 + "!"}}]}, []),
    ("json_schema", {"schema": PERSON, "expected": {"name": "Ada"}}, []),
])
def test_reference_errors_give_the_path_the_service_reports(name: str, reference: Any,
                                                            errors: list[Any]) -> None:
    assert REGISTRY[name].reference_errors(reference) == errors


# --------------------------------------------------------------------------- issue 28

def test_a_schema_that_refers_to_itself_without_end_is_an_invalid_reference() -> None:
    """Row 11: ``{"$ref": "#"}`` recursed without end when applied: an `error` cell before,
    now the reference's fault, a 422 at the API and ``invalid_reference`` in the worker."""
    for schema in ({"$ref": "#"}, {"allOf": [{"$ref": "#"}]}):
        [(path, message)] = REGISTRY["json_schema"].reference_errors({"schema": schema})
        assert path == ("schema",) and "refers to itself without end" in message
        out = run_verifier(REGISTRY["json_schema"], Sample('{"a": 1}'), {"schema": schema},
                           {})
        assert out.error == FailureKind.invalid_reference, out
    # recursive through a constraint: a usable schema (trees, linked lists)
    assert REGISTRY["json_schema"].reference_errors({"schema": {"items": {"$ref": "#"}}}) == []
    from rewardd.verifiers.structured_match import check_budget, check_schema, verdicts
    verdicts.clear()
    with check_budget(1.0):  # the API never applies a request's schema: the worker does
        assert check_schema({"$ref": "#"}) is None
    assert check_schema({"$ref": "#"})


def test_a_schema_that_recurses_only_on_strings_is_found_where_it_is_applied() -> None:
    schema = {"if": {"type": "string"}, "then": {"$ref": "#"}}
    out = run_verifier(REGISTRY["json_schema"], Sample('```json\n"x"\n```'),
                       {"schema": schema}, {})
    assert out.error == FailureKind.invalid_reference, out
    assert "refers to itself without end" in out.detail["message"]


@pytest.mark.parametrize("depth", [65, 900])
def test_an_output_too_deep_to_check_is_scored_zero_never_excluded(depth: int) -> None:
    """Row 11: a recursive schema and a 900-deep output gave an `error` cell (advantage 0),
    so a model could dodge a negative advantage. Now a reward of 0 with a typed rule."""
    completion = "[" * depth + "]" * depth
    out = run_verifier(REGISTRY["json_schema"], Sample(completion),
                       {"schema": {"items": {"$ref": "#"}}, "expected": []}, {})
    assert out.ok and out.reward == 0.0, out
    assert out.detail["rule"] == "unverifiable"
    assert set(out.detail["parts"].values()) == {0.0}
    calls = json.dumps({"name": "f", "arguments": {"a": json.loads(completion)}})
    tool = {"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}
    out = run_verifier(REGISTRY["tool_call"], Sample(calls),
                       {"tools": [tool], "calls": [{"name": "f", "arguments": {"a": []}}]}, {})
    assert out.ok and out.detail["parts"]["arguments"] == 0.0, out


def test_an_output_at_the_depth_limit_is_checked() -> None:
    completion = "[" * 64 + "]" * 64
    out = run_verifier(REGISTRY["json_schema"], Sample(completion),
                       {"schema": {"items": {"$ref": "#"}}}, {})
    assert out.ok and out.detail["parts"]["schema"] == 1.0, out


def _big_schema(seed: int, chars: int) -> dict:
    props, schema = {}, {"type": "object", "properties": {}}
    while len(json.dumps(schema, separators=(",", ":"))) < chars:
        props[f"p{seed}_{len(props)}"] = {"type": "array", "items": {"type": "integer"}}
        schema = {"type": "object", "properties": props}
    return schema


def test_schema_checks_in_the_api_are_bounded_by_a_cpu_budget_and_cached() -> None:
    """Row 7: each distinct schema was checked in the API, uncached by content: a budget of
    the request's CPU, a size above which the worker checks instead, a verdict cache."""
    from rewardd.verifiers.structured_match import (INLINE_SCHEMA_CHARS, check_budget,
                                                    check_schema, verdicts)
    verdicts.clear()
    bad = {"type": "objekt", "properties": {"x": {"type": "string"}}}
    with check_budget(0.0) as budget:  # spent: left to the worker
        assert check_schema(bad) is None and budget.deferred == 1
    with check_budget(5.0) as budget:
        assert check_schema(bad) and budget.deferred == 0
        big = {**_big_schema(1, INLINE_SCHEMA_CHARS + 100), "type": "objekt"}
        assert check_schema(big) is None and budget.deferred == 1  # too big to check here
        spent = budget.cpu_s
    with check_budget(0.0) as budget:  # a verdict found once is known by its content
        assert check_schema(bad) and budget.deferred == 0
    assert spent < 5.0
    assert check_schema(big)  # outside a budget (a worker): every schema is checked
