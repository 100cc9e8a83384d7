"""Redis unreachable: a typed JSON 503 with Retry-After, never a plain-text 500 (issue 20).

The app's state URL points at a closed port; no lifespan runs (it would need Redis to resume
jobs), so each route meets the dead Redis first in its own call. The fault test
(tests/faults/test_redis_down.py) does the same against a real server and a stopped Redis.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import GatedExecutor
from tests.support.server import free_port

SCORE = {"groups": [{"group_id": "g", "reference": {"answer": "1"}, "rollouts": [
    {"rollout_id": "a", "completion": "1", "num_tokens": 2}]}],
    "rewards": [{"name": "m", "verifier": "exact_match"}], "advantage": {"output": "scalar"}}
JOB_ID = "0123456789abcdef" * 2


@pytest.fixture(scope="module")
def client() -> TestClient:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    app = create_app(Settings(pool_size=1, state_url=dead), executor=GatedExecutor())
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/score", SCORE), ("POST", "/v1/jobs", SCORE),
    ("POST", "/v1/verify/exact_match", {"completion": "1", "reference": {"answer": "1"}}),
    ("GET", f"/v1/jobs/{JOB_ID}", None), ("GET", "/v1/runs/exp-1", None)])
def test_a_route_meeting_a_dead_redis_answers_a_typed_503(
        client: TestClient, method: str, path: str, body: dict | None) -> None:
    answer = client.request(method, path, json=body)
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5"
    assert "cannot reach its Redis" in answer.json()["detail"]


def test_liveness_does_not_need_redis(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
