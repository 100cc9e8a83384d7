"""Redis unreachable: every route that needs it answers a JSON 503 with Retry-After, never a
plain-text 500; /healthz stays 200 (issue 20).

A real ``rewardd serve`` keeps its state (tenant slots, jobs, run state) in a private
redis-server, which the test then stops.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from typing import Iterator

import httpx
import pytest
import redis

from tests.support.server import free_port, running_server

pytestmark = pytest.mark.faults

SCORE = {"groups": [{"group_id": "g", "reference": {"answer": "1"}, "rollouts": [
    {"rollout_id": "a", "completion": "1", "num_tokens": 2},
    {"rollout_id": "b", "completion": "2", "num_tokens": 2}]}],
    "rewards": [{"name": "m", "verifier": "exact_match"}], "advantage": {"output": "scalar"}}
ADVANTAGES = {"groups": [{"group_id": "g", "rollouts": [
    {"rollout_id": "a", "reward": 1.0, "num_tokens": 2},
    {"rollout_id": "b", "reward": 0.0, "num_tokens": 2}]}], "advantage": {"output": "scalar"}}
ROUTES = [
    ("POST", "/v1/score", SCORE),
    ("POST", "/v1/rewards", {k: SCORE[k] for k in ("groups", "rewards")}),
    ("POST", "/v1/advantages", ADVANTAGES),
    ("POST", "/v1/verify/exact_match", {"completion": "1", "reference": {"answer": "1"}}),
    ("POST", "/v1/jobs", SCORE),
    ("GET", "/v1/jobs/" + "0123456789abcdef" * 2, None),
    ("DELETE", "/v1/jobs/" + "0123456789abcdef" * 2, None),
    ("GET", "/v1/runs/exp-1", None),
    ("DELETE", "/v1/runs/exp-1", None),
]


@pytest.fixture
def private_redis() -> Iterator[tuple[str, subprocess.Popen]]:
    """A redis-server of this test alone, without persistence."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not on PATH (make redis installs it)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="rewardd-redis-")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=1)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("private redis-server did not start")
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0", proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)


def test_every_route_answers_a_typed_503_while_redis_is_down(
        private_redis: tuple[str, subprocess.Popen]) -> None:
    url, proc = private_redis
    with running_server("--pool-size", "1", env={"REWARDD_STATE_URL": url}) as base:
        with httpx.Client(base_url=base, timeout=60) as client:
            assert client.post("/v1/score", json=SCORE).status_code == 200  # Redis up: works
            proc.terminate()
            proc.wait(timeout=30)
            for method, path, body in ROUTES:
                started = time.monotonic()
                answer = client.request(method, path, json=body)
                took = time.monotonic() - started
                assert answer.status_code == 503, (method, path, answer.text)
                assert answer.headers["content-type"] == "application/json", (method, path)
                assert answer.headers["retry-after"] == "5", (method, path)
                detail = answer.json()["detail"]
                assert "cannot reach its Redis" in detail and "retry after 5 s" in detail
                assert url not in detail  # the URL may hold a password
                assert took < 30, (method, path, took)  # the connect timeout, not a hang
            assert client.get("/healthz").status_code == 200
