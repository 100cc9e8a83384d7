"""Issue 28, rows 6, 7, 11 and 15: code references and JSON Schemas replayed as a hostile
tenant would, at the issue's sizes, against a real server. Rows 6 and 7 assert a typed
refusal or a bounded cost (API and worker memory, API CPU) and the other tenant answered
normally meanwhile; rows 11 and 15 assert the verdicts a trainer gets."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.support.abuse import HOSTILE, MB, Neighbour, abuse_server

SIX_MB = 6 * MB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with abuse_server(tmp_dir=tmp_path_factory.mktemp("code")) as running:
        yield running


def score(url: str, groups: list[dict[str, Any]], verifier: str,
          params: dict[str, Any] | None = None) -> httpx.Response:
    body = {"groups": groups, "rewards": [{"name": "r", "verifier": verifier,
                                           "params": params or {}}]}
    with httpx.Client(base_url=url, headers=HOSTILE, timeout=600) as http:
        return http.post("/v1/rewards", json=body)


def group(gid: str, reference: dict[str, Any], *completions: str) -> dict[str, Any]:
    return {"group_id": gid, "reference": reference,
            "rollouts": [{"rollout_id": f"{gid}-{i}", "completion": c, "num_tokens": 1}
                         for i, c in enumerate(completions or ("x", "y"))]}


def cells(response: httpx.Response) -> list[dict[str, Any]]:
    """Each rollout's cell of the component ``r``: its reward, ``ok``, ``error``, ``detail``."""
    assert response.status_code == 200, response.text[:500]
    return [{"reward": rollout["rewards"].get("r"), **rollout["status"]["r"]}
            for g in response.json()["groups"] for rollout in g["rollouts"]]


def hostile_beside_a_neighbour(url: str, send: Any) -> tuple[Any, Neighbour]:
    """``send()`` in a thread while the neighbour's small requests go on; its result.

    The window counted as "during" opens before ``send()`` and closes once it returned *and*
    the neighbour got an answer in the window: a refusal can come back before the
    neighbour's first answer (then the answer that follows it counts), and closing the
    window with the hostile request alone waited forever for an answer it could not count."""
    result: list[Any] = []
    with Neighbour(url) as neighbour:
        neighbour.hostile_running.set()
        worker = threading.Thread(target=lambda: result.append(send()), daemon=True)
        worker.start()
        worker.join()
        while neighbour.answered_during_hostile < 1:
            assert neighbour.alive(), "the neighbour's thread failed"
            time.sleep(0.05)
        neighbour.hostile_running.clear()
    return result[0], neighbour


# ------------------------------------------------------------------------------ row 6

STDIO = {"inputs": ["1\n"], "outputs": ["1\n"]}


@pytest.mark.parametrize("field", ["test_code", "checker.code"])
def test_six_mb_of_code_is_refused_naming_the_field(server: Any, field: str) -> None:
    """Row 6: 6 MB of checker code / test code was compiled in the worker (+2.3 / +3.7 GB,
    killed at 30 s). Now a 422 naming the field, before anything reaches a worker."""
    code = ("assert f(1) == 1\n" * (SIX_MB // 17 + 1))[:SIX_MB]
    reference: dict[str, Any] = (
        {"test_code": code} if field == "test_code"
        else {"tests": STDIO, "checker": {"language": "python", "code": code}})
    rss = server.rss_bytes()
    response, neighbour = hostile_beside_a_neighbour(
        server.url, lambda: score(server.url, [group("g", reference)], "code"))
    assert response.status_code == 422
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "groups", 0, "reference", *field.split(".")]
    assert "REWARDD_MAX_CODE_FIELD_BYTES" in problem["msg"]
    grown = server.rss_bytes() - rss
    print(f"row 6 ({field}, 6 MB): 422, server RSS {grown / MB:+.0f} MB")  # shown with -s
    assert grown < 200 * MB
    assert set(neighbour.statuses) == {200} and neighbour.answered_during_hostile >= 1


def test_test_code_at_the_limit_is_read_in_the_sandbox_at_a_bounded_cost(server: Any) -> None:
    """Just under the cap (1 MiB), the test code is lifted by a sandbox run of its own, held
    to its memory limit (REWARDD_SANDBOX_PARSE_MEMORY_MB): scored, the server's memory
    bounded. (6 MB of it took +3.7 GB in the worker before.)"""
    count = 140_000
    code = f"assert f({count}) == {list(range(count))}\n"
    assert MB - 200_000 < len(code) < MB
    solution = "```python\ndef f(n):\n    return list(range(n))\n```"
    rss = server.rss_bytes()
    response, neighbour = hostile_beside_a_neighbour(server.url, lambda: score(
        server.url, [group("g", {"test_code": code}, solution, "no code")], "code"))
    solved, empty = cells(response)
    assert (solved["reward"], empty["reward"]) == (1.0, 0.0), solved
    assert solved["detail"]["lifted"] == 1  # judged outside the solution's run
    grown = server.rss_bytes() - rss
    print(f"row 6 (test_code at the cap): scored, server RSS {grown / MB:+.0f} MB")
    assert grown < 200 * MB
    assert set(neighbour.statuses) == {200} and neighbour.answered_during_hostile >= 1


# ------------------------------------------------------------------------------ row 7

def schema(seed: int, chars: int) -> dict[str, Any]:
    """A valid JSON Schema of about ``chars`` characters, distinct per ``seed``: properties
    with pattern properties, the shape that costs the metaschema check the most per byte."""
    properties: dict[str, Any] = {}
    size = len('{"properties":{},"type":"object"}')
    while True:
        key = f"s{seed}p{len(properties)}"
        value = {"type": "object", "patternProperties": {f"^{key}[a-z]+$": {
            "type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}}
        more = len(json.dumps({key: value}, separators=(",", ":"))) - 1  # a comma, no braces
        if size + more > chars:
            return {"type": "object", "properties": properties}
        properties[key], size = value, size + more


def schema_groups(seed: int, count: int, chars: int) -> list[dict[str, Any]]:
    return [group(f"g{seed}-{i}", {"schema": schema(seed * 1000 + i, chars)},
                  '{"a": 1}', "not json") for i in range(count)]


@pytest.mark.parametrize("count,chars", [(16, 63_000), (72, 15_000)])
def test_distinct_schemas_cost_the_api_a_bounded_cpu(server: Any, count: int,
                                                     chars: int) -> None:
    """Row 7: 16 groups with distinct 63 KB schemas took 57.6 s of API CPU (a metaschema
    check each, uncached). Now the API checks at most ~1 s of them (none over 16 KiB); the
    workers check the rest under their time limit. Also at the inline size (15 KB each)."""
    groups = schema_groups(count, count, chars)
    assert len(json.dumps(groups[0]["reference"]["schema"], separators=(",", ":"))) \
        in range(chars - 200, chars + 1)
    assert len(json.dumps(groups, separators=(",", ":"))) > 1_000_000
    rss, cpu = server.rss_bytes(), server.api_cpu_s()
    response = score(server.url, groups, "json_schema")
    spent = server.api_cpu_s() - cpu
    assert spent < 2.0, spent
    outcomes = cells(response)
    assert [c["reward"] for c in outcomes] == [1.0, 0.0] * count  # checked, then scored
    grown = server.rss_bytes() - rss
    print(f"row 7 ({count} x {chars} B schemas): API CPU {spent:.2f} s, "
          f"server RSS {grown / MB:+.0f} MB")
    assert grown < 200 * MB
    # the neighbour is answered meanwhile (new schemas: none is cached yet)
    again, neighbour = hostile_beside_a_neighbour(
        server.url, lambda: score(server.url, schema_groups(count + 1, count, chars),
                                  "json_schema"))
    assert again.status_code == 200
    assert set(neighbour.statuses) == {200} and neighbour.answered_during_hostile >= 1


# ------------------------------------------------------------------------------ row 11

def test_an_endless_schema_is_an_invalid_reference(server: Any) -> None:
    """Row 11: ``{"$ref": "#"}`` was an `error` cell. The API does not apply a request's
    schema (that can take exponential time); the worker finds it, the reference's fault."""
    response = score(server.url, [group("g", {"schema": {"$ref": "#"}}, '{"a": 1}')],
                     "json_schema")
    [cell] = cells(response)
    assert cell["error"] == "invalid_reference", cell
    assert "refers to itself without end" in cell["detail"]["message"]


def test_output_too_deep_for_its_schema_is_scored_zero_not_excluded(server: Any) -> None:
    """Row 11: a recursive schema and 900-deep JSON from the model gave an `error` cell
    (the rollout excluded, advantage 0): a model could dodge a negative advantage."""
    deep = "[" * 900 + "]" * 900
    reference = {"schema": {"type": "array", "items": {"$ref": "#"}}}
    body = {"groups": [group("g", reference, deep, "[[]]")],
            "rewards": [{"name": "r", "verifier": "json_schema"}],
            "advantage": {"estimator": "grpo"}}
    with httpx.Client(base_url=server.url, headers=HOSTILE, timeout=600) as http:
        response = http.post("/v1/score", json=body)
    assert response.status_code == 200, response.text[:500]
    deep_one, fine = response.json()["groups"][0]["rollouts"]
    assert deep_one["reward"] == 0.0 and not deep_one.get("excluded"), deep_one
    assert fine["reward"] == 1.0
    assert deep_one["advantages"] != fine["advantages"]  # it takes part in the group


# ------------------------------------------------------------------------------ row 15

@pytest.mark.parametrize("printed,verdict", [("0.99999999999999999999", "partial"),
                                             ("1.0000000000000001", "bad_score")])
def test_checker_scores_are_read_as_decimals(server: Any, printed: str, verdict: str) -> None:
    checker = {"language": "python", "code": f"print({printed!r})\n"}
    response = score(server.url, [group("g", {"tests": STDIO, "checker": checker},
                                        "```python\nprint(input())\n```")], "code")
    [cell] = cells(response)
    if verdict == "partial":
        assert cell["reward"] < 1.0 and cell["detail"]["tests"][0]["verdict"] == "partial"
    else:
        assert cell["error"] == "invalid_reference"
        assert cell["detail"]["checker_failure"] == "bad_score"
