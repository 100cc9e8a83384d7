"""tool_call, json_schema, critique, refusal, refusal_judge and continuation end to end: a real
``rewardd serve`` (embedded pool) scoring one request with all six as reward components, the
judge ones against a real local chat server; GET /v1/verifiers documents them; a bad
reference or bad params are a 422 naming the field before anything runs."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest

from tests.support.generating_judge import GeneratingJudgeServer, generating  # noqa: F401
from tests.support.server import ServerFailed, running_server

pytestmark = pytest.mark.e2e

NEW = ("tool_call", "json_schema", "critique", "refusal", "refusal_judge", "continuation")


@pytest.fixture(scope="module")
def url(generating: GeneratingJudgeServer) -> Iterator[str]:  # noqa: F811
    env = {"REWARDD_JUDGE_BASE_URL": generating.base_url, "REWARDD_JUDGE_MODEL": "rule-judge"}
    try:
        with running_server("--pool-size", "2", env=env) as base:
            yield base
    except ServerFailed as exc:
        pytest.fail(str(exc))


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


REFERENCE = {"calls": [{"name": "add", "arguments": {"a": 12, "b": 5}}],
             "schema": {"type": "object", "required": ["sum"],
                        "properties": {"sum": {"type": "integer"}}},
             "expected": {"sum": 17}, "label": "right", "harmful": False, "answer": "17"}
REWARDS = [{"name": "tool", "verifier": "tool_call"},
           {"name": "json", "verifier": "json_schema"},
           {"name": "critique", "verifier": "critique"},
           {"name": "refusal", "verifier": "refusal"},
           {"name": "refusal_j", "verifier": "refusal_judge", "timeout_s": 60},
           {"name": "transfer", "verifier": "continuation", "timeout_s": 60,
            "params": {"k": 2, "prefix_fraction": 1.0}}]


def body(completions: list[str], reference: dict[str, Any] = REFERENCE,
         rewards: list[dict[str, Any]] = REWARDS) -> dict[str, Any]:
    return {"groups": [{"group_id": "g0", "prompt": "What is 12 + 5?", "reference": reference,
                        "rollouts": [{"rollout_id": f"r{i}", "completion": c}
                                     for i, c in enumerate(completions)]}],
            "rewards": rewards}


def test_every_new_verifier_scores_through_the_server(url: str) -> None:
    good = ("<think>12 + 5, so far: 17</think>" + call("add", a=12, b=5)
            + '\n```json\n{"sum": 17}\n```\nConclusion: right')
    refusing = "I'm sorry, but I can't help with that."
    response = httpx.post(f"{url}/v1/rewards", json=body([good, refusing]), timeout=120)
    assert response.status_code == 200, response.text
    first, second = response.json()["groups"][0]["rollouts"]
    assert first["rewards"] == {"tool": 1.0, "json": 1.0, "critique": 1.0, "refusal": 1.0,
                                "refusal_j": 1.0, "transfer": 1.0}, first["status"]
    assert first["status"]["tool"]["detail"]["parts"] == {"format": 1.0, "name": 1.0,
                                                          "arguments": 1.0}
    assert first["status"]["transfer"]["detail"]["successes"] == 2
    # the refusal of a benign prompt: over-refusal, and no call, JSON or verdict
    assert second["rewards"]["refusal"] == 0.0 and second["rewards"]["refusal_j"] == 0.0
    assert second["rewards"]["tool"] == 0.0 and second["rewards"]["critique"] == 0.0
    assert second["status"]["critique"]["detail"]["rule"] == "no_verdict"


def test_get_verifiers_documents_reference_and_params(url: str) -> None:
    listed = {v["name"]: v for v in httpx.get(f"{url}/v1/verifiers", timeout=30).json()}
    for name in NEW:
        assert listed[name]["description"] and listed[name]["reference_fields"], name
        assert listed[name]["params"], name
        undocumented = [p["name"] for p in listed[name]["params"] if not p["description"]]
        assert not undocumented, f"{name}: {undocumented}"
    assert set(listed["tool_call"]["reference_fields"]) == {"calls", "possible_answer", "tools"}
    assert {p["name"] for p in listed["continuation"]["params"]} >= {"k", "prefix_fraction",
                                                                      "mode", "math", "backend"}


@pytest.mark.parametrize("reference,rewards,loc", [
    ({"calls": [{"name": "add", "args": {}}]}, [{"name": "t", "verifier": "tool_call"}],
     ["body", "groups", 0, "reference", "calls", 0, "args"]),
    ({"label": "maybe"}, [{"name": "c", "verifier": "critique"}],
     ["body", "groups", 0, "reference", "label"]),
    ({"harmful": True, "safety_label": "benign"}, [{"name": "r", "verifier": "refusal"}],
     ["body", "groups", 0, "reference"]),
    ({"answer": ""}, [{"name": "k", "verifier": "continuation"}],
     ["body", "groups", 0, "reference", "answer"]),
    ({"schema": {"type": "objekt"}}, [{"name": "j", "verifier": "json_schema"}],
     ["body", "groups", 0, "reference", "schema"]),
    ({"label": True}, [{"name": "c", "verifier": "critique", "params": {"pattern": "("}}],
     ["body", "rewards", 0, "params", "pattern"]),
    ({"answer": "1"}, [{"name": "k", "verifier": "continuation",
                        "params": {"k": 4, "temperature": 0}}],
     ["body", "rewards", 0, "params"]),
])
def test_bad_reference_or_params_is_a_422_naming_the_field(url: str, reference: dict[str, Any],
                                                           rewards: list[dict[str, Any]],
                                                           loc: list[Any]) -> None:
    response = httpx.post(f"{url}/v1/rewards", json=body(["x"], reference, rewards), timeout=30)
    assert response.status_code == 422, response.text
    assert loc in [e["loc"] for e in response.json()["detail"]], response.json()
