"""Code references with special judges through a real ``rewardd serve``: unknown reference keys
are a 422 naming the key before anything runs, a checker grades through the worker pool, a
failing checker is a typed cell, and GET /v1/verifiers documents the shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rewardd_client.client import RewarddClient, RewarddError

CHECKER = """
import sys
n = int(open(sys.argv[1]).read())
p = [int(t) for t in open(sys.argv[2]).read().split()]
sys.exit(0 if sorted(p) == list(range(1, n + 1)) and all(p[i] != i + 1 for i in range(n))
         else 1)
"""
TESTS = {"inputs": ["3\n", "4\n"], "outputs": ["2 3 1\n", "2 3 4 1\n"]}
SHIFT = "n = int(input())\nprint(n, *range(1, n))"  # a derangement, never the jury's
IDENTITY = "n = int(input())\nprint(*range(1, n + 1))"


def request(reference: dict[str, Any], completions: list[str]) -> dict[str, Any]:
    return {"groups": [{"group_id": "g", "reference": reference, "rollouts": [
                {"rollout_id": f"r{i}", "completion": c} for i, c in enumerate(completions)]}],
            "rewards": [{"name": "code", "verifier": "code", "timeout_s": 30}],
            "advantage": {"output": "none"}}


@pytest.mark.parametrize("reference,loc", [
    ({"tests": TESTS, "checkr": {"language": "python", "code": CHECKER}}, ["checkr"]),
    ({"tests": json.dumps({**TESTS, "fn": "f"})}, ["tests", "fn"]),
    ({"input_output": {**TESTS, "extra": 1}}, ["input_output", "extra"]),
    ({"tests": TESTS, "checker": {"language": "python", "code": CHECKER, "time": 1}},
     ["checker", "time"]),
])
def test_unknown_reference_key_is_422_naming_it(server: str, reference: dict,
                                               loc: list[str]) -> None:
    with RewarddClient(server) as client, pytest.raises(RewarddError) as info:
        client.score(request(reference, [SHIFT]))
    assert info.value.status == 422
    errors = info.value.detail
    assert [e["loc"] for e in errors] == [["body", "groups", 0, "reference", *loc]], errors
    assert f"'{'.'.join(loc)}' is not a known key" in errors[0]["msg"]


def test_keys_of_the_requests_other_verifiers_are_not_unknown(server: str) -> None:
    """One reference serves code and math: math's 'answer' is known to the request; alone
    with the code verifier it is not."""
    reference = {"tests": TESTS, "answer": "3"}
    both = request(reference, ["```python\nprint(3)\n```\nThe answer is $3$."])
    both["rewards"].append({"name": "math", "verifier": "math"})
    with RewarddClient(server) as client:
        result = client.score(both)
        [rollout] = result["groups"][0]["rollouts"]
        assert rollout["status"]["code"]["ok"] is True  # graded, not invalid_reference
        assert (rollout["rewards"]["code"], rollout["rewards"]["math"]) == (0.0, 1.0)
        with pytest.raises(RewarddError) as info:
            client.score(request(reference, [SHIFT]))
    assert info.value.status == 422
    assert [e["loc"] for e in info.value.detail] == [["body", "groups", 0, "reference",
                                                      "answer"]]
    assert "(code verifier)" in info.value.detail[0]["msg"]


def test_checker_grades_through_the_server(server: str) -> None:
    reference = {"tests": TESTS, "checker": {"language": "python", "code": CHECKER}}
    with RewarddClient(server) as client:
        result = client.rewards({k: v for k, v in request(reference, [SHIFT, IDENTITY]).items()
                                 if k != "advantage"})
    shift, identity = result["groups"][0]["rollouts"]
    assert (shift["rewards"]["code"], identity["rewards"]["code"]) == (1.0, 0.0)
    assert shift["status"]["code"]["detail"]["judged_by"] == "checker (python)"
    assert [t["verdict"] for t in identity["status"]["code"]["detail"]["tests"]] == [
        "wrong_answer"] * 2


def test_crashing_checker_is_a_typed_cell(server: str) -> None:
    reference = {"tests": TESTS, "checker": {"language": "python", "code": "1 / 0"}}
    with RewarddClient(server) as client:
        result = client.score(request(reference, [SHIFT]))
    [rollout] = result["groups"][0]["rollouts"]
    cell = rollout["status"]["code"]
    assert cell["ok"] is False and cell["error"] == "invalid_reference", cell
    assert cell["detail"]["checker_failure"] == "crashed"
    assert rollout["rewards"]["code"] is None


def test_verifiers_document_the_checker(server: str) -> None:
    with RewarddClient(server) as client:
        listed = client.verifiers()
    rows = listed["verifiers"] if isinstance(listed, dict) else listed
    [code] = [v for v in rows if v["name"] == "code"]
    assert "checker <input> <output> <answer>" in code["reference_fields"]["checker"]
    params = {p["name"]: p for p in code["params"]}
    assert (params["checker_cpu_s"]["default"], params["checker_wall_s"]["default"],
            params["checker_memory_mb"]["default"]) == (2.0, 3.0, 512)


def test_verify_route_refuses_an_unknown_reference_key(server: str) -> None:
    """POST /v1/verify/code checks the reference as a batch does: a 422 at body.reference.<key>,
    not an invalid_reference result."""
    reference = {"tests": TESTS, "checkr": {"language": "python", "code": CHECKER}}
    with RewarddClient(server) as client, pytest.raises(RewarddError) as info:
        client.verify("code", SHIFT, reference=reference)
    assert info.value.status == 422
    assert [e["loc"] for e in info.value.detail] == [["body", "reference", "checkr"]]
    assert "'checkr' is not a known key" in info.value.detail[0]["msg"]
