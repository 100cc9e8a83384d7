"""A ~3 KB request whose reference nests 500 levels deep, against a real ``rewardd serve``.

Before the embedded executor sealed its task arguments, pickling such a reference killed the
pool's scheduler thread: the request hung, every later call of every tenant was
``unavailable``, /readyz answered 503 until a restart, the tenant's slot stayed leased and
SIGTERM hung. Here every route that reaches the workers answers it with a typed failure,
the next normal request scores correctly (the tenant may run one request at a time, so a
leaked slot would be a 429), /readyz is ready and SIGTERM stops the server.

The typed failure is whichever layer stops the payload first: the request validation's bound
on nesting (a 422 naming the reference) where it is in place, else the executor's refusal
(the cells' ``invalid_reference``). The executor does not count on the bound
(tests/unit/test_executor_resilience.py sends it the payload directly), and neither does
this test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from tests.support.server import REPO_ROOT, child_env, free_port
from tests.support.hostile import UNSENDABLE_MESSAGE, nested

pytestmark = pytest.mark.e2e

HANG_S = 60.0  # bounds against hangs, not measurements



def batch(reference: dict[str, Any]) -> dict[str, Any]:
    return {"groups": [{"group_id": "g", "reference": reference, "rollouts": [
        {"rollout_id": "r0", "completion": "4", "num_tokens": 2},
        {"rollout_id": "r1", "completion": "5", "num_tokens": 2}]}],
        "rewards": [{"name": "m", "verifier": "exact_match"}]}


@pytest.fixture(scope="module")
def serve() -> Any:
    """A server with one worker whose single tenant may run one request at a time."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewardd.service.cli", "serve", "--host", "127.0.0.1",
         "--port", str(port), "--pool-size", "1"], cwd=REPO_ROOT,
        env={**child_env(), "REWARDD_TENANT_MAX_CONCURRENT_JOBS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, "rewardd serve exited before it was ready"
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "rewardd serve was not ready within 120 s"
        time.sleep(0.25)
    yield url, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def test_a_reference_nested_500_deep_is_a_typed_failure_and_the_server_keeps_serving(
        serve: Any) -> None:
    url, proc = serve
    reference = {"answer": "4", "extra": nested()}
    assert len(json.dumps(batch(reference))) < 4096
    with httpx.Client(base_url=url, timeout=HANG_S) as client:
        for route, body in (("/v1/score", batch(reference)), ("/v1/rewards", batch(reference)),
                            ("/v1/verify/exact_match", {"completion": "4",
                                                        "reference": reference})):
            response = client.post(route, json=body)
            if response.status_code == 422:  # refused by validation, naming the reference
                [error] = response.json()["detail"]
                assert "reference" in error["loc"], response.text
                continue
            assert response.status_code == 200, response.text
            answer = response.json()
            cells = ([answer] if route.startswith("/v1/verify") else
                     [r["status"]["m"] for r in answer["groups"][0]["rollouts"]])
            for cell in cells:
                assert (cell["ok"], cell["error"]) == (False, "invalid_reference"), route
                assert cell["detail"]["message"] == UNSENDABLE_MESSAGE

        normal = client.post("/v1/score", json=batch({"answer": "4"}))  # 429 if a slot leaked
        assert normal.status_code == 200, normal.text
        rollouts = normal.json()["groups"][0]["rollouts"]
        assert [r["rewards"]["m"] for r in rollouts] == [1.0, 0.0]
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["executor"]["rebuilds"] == 0

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG_S) is not None  # raises TimeoutExpired if SIGTERM hangs
