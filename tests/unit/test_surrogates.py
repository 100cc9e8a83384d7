"""A string the service accepts is one it can write back (issue 15, row 4).

A lone UTF-16 surrogate (``"\\ud800"``, valid JSON syntax) was read by the stdlib fallback
reader and then broke every writer: 500 on /v1/verify and /v1/score, the batch lost. Now it
is a 422 naming the field, on both wires (msgpack: a string that is not UTF-8), on every
route that reads a body, before anything runs; a surrogate *pair* is the character it
encodes and comes back as that character.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import msgpack
import orjson
import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor

JSON = {"content-type": "application/json"}
MSGPACK = {"content-type": "application/msgpack"}
LONE = "\ud800"


@pytest.fixture(scope="module")
def app_client() -> Iterator[tuple[Any, TestClient]]:
    executor = RefusingExecutor()
    app = create_app(Settings(pool_size=1), executor=executor)
    with TestClient(app) as client:
        yield app, client
    assert executor.run_calls == 0, "an invalid string reached the executor"


@pytest.fixture
def client(app_client: tuple[Any, TestClient]) -> TestClient:
    return app_client[1]


def score_body(completion: str = "4", rollout_id: str = "r0",
               reference: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"groups": [{"group_id": "g", "reference": reference or {"answer": "4"},
                        "rollouts": [{"rollout_id": rollout_id, "completion": completion},
                                     {"rollout_id": "r1", "completion": "5"}]}],
            "rewards": [{"name": "m", "verifier": "exact_match"}]}


def as_json(body: Any) -> bytes:
    """JSON with every non-ASCII character escaped, lone surrogates included (as a client
    with ``ensure_ascii`` writes them)."""
    return json.dumps(body).encode()


def as_msgpack(body: Any) -> bytes:
    """msgpack whose strings are packed as is: a lone surrogate becomes the bytes ED A0 80,
    which are not UTF-8."""
    return msgpack.packb(body, unicode_errors="surrogatepass")


def post(client: TestClient, path: str, body: Any, wire: str) -> Any:
    if wire == "json":
        return client.post(path, content=as_json(body), headers=JSON)
    return client.post(path, content=as_msgpack(body), headers=MSGPACK)


def unicode_error(loc: list[Any], wire: str, code: int = 0xD800, at: int = 1) -> dict:
    if wire == "json":
        why = (f"has a lone surrogate \\u{code:04x} at character {at}, which is not Unicode "
               "text: a \\uD800-\\uDBFF escape must be followed by a \\uDC00-\\uDFFF one")
    else:
        first = chr(code).encode("utf-8", "surrogatepass")[0]
        why = (f"is not valid UTF-8 (byte 0x{first:02X} at character {at}): msgpack strings "
               "must be UTF-8; send raw bytes as bin")
    return {"loc": loc, "msg": f"string {why}", "type": "string_unicode"}


COMPLETION = ["body", "groups", 0, "rollouts", 0, "completion"]


@pytest.mark.parametrize("wire", ["json", "msgpack"])
@pytest.mark.parametrize("path", ["/v1/score", "/v1/rewards", "/v1/jobs"])
def test_a_lone_surrogate_in_a_completion_is_a_422_naming_it(client: TestClient, path: str,
                                                             wire: str) -> None:
    resp = post(client, path, score_body(completion=f"4{LONE}"), wire)
    assert resp.status_code == 422, resp.text
    assert resp.json() == {"detail": [unicode_error(COMPLETION, wire)]}


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_verify_refuses_it_too(client: TestClient, wire: str) -> None:
    resp = post(client, "/v1/verify/exact_match",
                {"completion": f"4{LONE}", "reference": {"answer": "4"}}, wire)
    assert resp.status_code == 422, resp.text
    assert resp.json() == {"detail": [unicode_error(["body", "completion"], wire)]}


def test_a_refused_job_is_not_created(app_client: tuple[Any, TestClient]) -> None:
    app, client = app_client
    resp = post(client, "/v1/jobs", score_body(completion=LONE), "json")
    assert resp.status_code == 422
    assert sum(app.state.services.jobs.store.counts().values()) == 0


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_low_surrogates_ids_and_map_keys_are_named_too(client: TestClient, wire: str) -> None:
    cases = [
        (score_body(completion="ab\udfff"), COMPLETION, 0xDFFF, 2),
        (score_body(rollout_id=f"r{LONE}"), ["body", "groups", 0, "rollouts", 0,
                                             "rollout_id"], 0xD800, 1),
        (score_body(reference={f"k{LONE}": "4"}), ["body", "groups", 0, "reference",
                                                   "k\\ud800" if wire == "json"
                                                   else "k\\xed\\xa0\\x80"], 0xD800, 1),
    ]
    for body, loc, code, at in cases:
        resp = post(client, "/v1/score", body, wire)
        assert resp.status_code == 422, resp.text
        assert resp.json() == {"detail": [unicode_error(loc, wire, code, at)]}


def test_msgpack_bytes_that_are_not_utf8_are_named(client: TestClient) -> None:
    raw = msgpack.packb(score_body(completion="4?")).replace(b"\xa24?", b"\xa24\xff")
    resp = client.post("/v1/score", content=raw, headers=MSGPACK)
    assert resp.status_code == 422, resp.text
    assert resp.json() == {"detail": [{"loc": COMPLETION, "type": "string_unicode", "msg": (
        "string is not valid UTF-8 (byte 0xFF at character 1): msgpack strings must be "
        "UTF-8; send raw bytes as bin")}]}


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack"])
@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_a_surrogate_pair_is_its_character_and_comes_back(client: TestClient, wire: str,
                                                          accept: str) -> None:
    """``"\\ud83d\\ude00"`` is U+1F600: read, echoed and written in either format."""
    body = {"groups": [{"group_id": "g\U0001F600", "rollouts": [
        {"rollout_id": "r\U0001F600", "reward": 1.0}, {"rollout_id": "r1", "reward": 0.0}]}],
        "advantage": {"output": "scalar"}}
    raw = as_json(body) if wire == "json" else msgpack.packb(body)
    if wire == "json":
        assert b"\\ud83d\\ude00" in raw
    resp = client.post("/v1/advantages", content=raw,
                       headers={**(JSON if wire == "json" else MSGPACK), "accept": accept})
    assert resp.status_code == 200, resp.text
    out = orjson.loads(resp.content) if accept == "application/json" else \
        msgpack.unpackb(resp.content)
    [group] = out["groups"]
    assert group["group_id"] == "g\U0001F600"
    assert group["rollouts"][0]["rollout_id"] == "r\U0001F600"


def test_an_escaped_backslash_before_u_d800_is_plain_text(client: TestClient) -> None:
    """``"\\\\ud800"`` is a backslash and five letters: with a NaN making the stdlib read the
    body, the only error is the NaN's."""
    raw = as_json(score_body(completion="\\ud800")).replace(b'"name": "m"', b'"name": "m", "weight": NaN')
    resp = client.post("/v1/score", content=raw, headers=JSON)
    assert resp.status_code == 422, resp.text
    assert [e["loc"] for e in resp.json()["detail"]] == [["body", "rewards", 0, "weight"]]
