"""msgpack by any of its media types: ``application/vnd.msgpack`` (IANA), ``application/msgpack``
and ``application/x-msgpack``, read as bodies and honoured in ``Accept``, in the type asked."""

from __future__ import annotations

from typing import Any, Iterator

import msgpack
import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.codec import msgpack_type
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor

BODY = {"groups": [{"group_id": "HumanEval/0", "rollouts": [
    {"rollout_id": "r0", "reward": 1.0, "num_tokens": 2},
    {"rollout_id": "r1", "reward": 0.0, "num_tokens": 2}]}],
    "advantage": {"estimator": "grpo", "output": "rle"}}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as c:
        yield c


@pytest.mark.parametrize("accept, expected", [
    ("application/vnd.msgpack", "application/vnd.msgpack"),
    ("application/msgpack", "application/msgpack"),
    ("application/x-msgpack", "application/x-msgpack"),
    ("Application/Vnd.MsgPack ; charset=binary", "application/vnd.msgpack"),
    ("application/json, application/vnd.msgpack", "application/vnd.msgpack"),
    ("application/msgpack;q=0.4, application/vnd.msgpack;q=0.9", "application/vnd.msgpack"),
    ("application/json;q=0.5, application/x-msgpack", "application/x-msgpack"),
    ("application/json, application/vnd.msgpack;q=0.5", None),
    ("application/vnd.msgpack;q=0", None),
    ("application/vnd.msgpack;q=bogus", None),
    ("*/*", None),
    ("", None),
    ("application/vnd.msgpack+json", None),
])
def test_accept_chooses_the_msgpack_type_asked_for(accept: str, expected: str | None) -> None:
    assert msgpack_type(accept) == expected


def json_answer(client: TestClient) -> dict[str, Any]:
    resp = client.post("/v1/advantages", json=BODY)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("media", ["application/vnd.msgpack", "application/msgpack",
                                   "application/x-msgpack"])
def test_a_msgpack_body_and_answer_in_each_media_type(client: TestClient, media: str) -> None:
    resp = client.post("/v1/advantages", content=msgpack.packb(BODY),
                       headers={"Content-Type": media, "Accept": media})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == media
    assert msgpack.unpackb(resp.content, raw=False) == json_answer(client)


def test_a_vnd_msgpack_body_with_a_json_answer(client: TestClient) -> None:
    resp = client.post("/v1/advantages", content=msgpack.packb(BODY),
                       headers={"Content-Type": "application/vnd.msgpack"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == json_answer(client)


def test_errors_stay_json_whatever_accept_says(client: TestClient) -> None:
    bad = {**BODY, "advantage": {"estimator": "nope"}}
    resp = client.post("/v1/advantages", content=msgpack.packb(bad),
                       headers={"Content-Type": "application/vnd.msgpack",
                                "Accept": "application/vnd.msgpack"})
    assert resp.status_code == 422 and resp.headers["content-type"] == "application/json"
    [err] = resp.json()["detail"]
    assert err["loc"] == ["body", "advantage", "estimator"]


def test_an_unknown_content_type_names_the_accepted_ones(client: TestClient) -> None:
    resp = client.post("/v1/advantages", content=b"x", headers={"Content-Type": "text/csv"})
    assert resp.status_code == 415
    assert "application/vnd.msgpack" in resp.text and "application/msgpack" in resp.text


def test_the_openapi_document_lists_vnd_msgpack(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    for path in ("/v1/score", "/v1/advantages", "/v1/rewards"):
        post = doc["paths"][path]["post"]
        assert "application/vnd.msgpack" in post["requestBody"]["content"], path
        assert "application/vnd.msgpack" in post["responses"]["200"]["content"], path
    status = doc["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]["200"]["content"]
    assert set(status) == {"application/json", "application/msgpack", "application/vnd.msgpack"}
