"""Every status a route answers is in the OpenAPI document (issue 15, row 10).

GET /v1/runs/{id} answered 404 for an unknown run, and the document did not say so. Here
each route of the app is driven to the statuses it can answer (success, its own refusals,
and the sweeps every /v1 route or body-reading route shares: no key, the tenant at its
limit, a body that is not JSON, too large, of another type, or invalid), and each status it
answers must be documented for that route. Every documented route is swept, so a new route
is covered as soon as it exists.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import GatedExecutor

KEY = {"Authorization": "Bearer k"}
MAX_BODY = 4096
LIMIT = 4

SCORE = {"groups": [{"group_id": "g", "reference": {"answer": "1"}, "rollouts": [
    {"rollout_id": "a", "completion": "1"}, {"rollout_id": "b", "completion": "2"}]}],
    "rewards": [{"name": "m", "verifier": "exact_match"}], "advantage": {"output": "scalar"}}
ADVANTAGES = {"groups": [{"group_id": "g", "rollouts": [
    {"rollout_id": "a", "reward": 1.0}, {"rollout_id": "b", "reward": 0.0}]}],
    "advantage": {"output": "scalar"}}
VERIFY = {"completion": "1", "reference": {"answer": "1"}}
BODIES = {"/v1/score": SCORE, "/v1/rewards": {k: SCORE[k] for k in ("groups", "rewards")},
          "/v1/advantages": ADVANTAGES, "/v1/jobs": SCORE, "/v1/verify/{verifier}": VERIFY}
"""Routes that read a body, with a valid one."""


class AnsweringExecutor(GatedExecutor):
    """Answers every check at once; its readiness is switchable (for /readyz's 503)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.set()
        self.is_ready = True

    async def ready(self, wait_s: float = 5.0) -> bool:
        return self.is_ready

    def not_ready_reason(self, wait_s: float = 5.0) -> str:
        return "switched off by the test"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, TestClient]]:
    settings = Settings(pool_size=1, api_keys="k=alice", tenant_max_concurrent_jobs=LIMIT,
                        max_body_bytes=MAX_BODY)
    app = create_app(settings, executor=AnsweringExecutor())
    with TestClient(app) as client:
        yield app, client


def template(paths: Any, url: str) -> str:
    """The documented path template ``url`` matches."""
    path = url.split("?")[0]
    for name in paths:
        if re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", name), path):
            return name
    raise AssertionError(f"no documented path for {url}")


def test_every_status_answered_is_documented(served: tuple[Any, TestClient]) -> None:
    app, client = served
    doc = app.openapi()
    answered: dict[tuple[str, str], set[int]] = {}

    def probe(method: str, url: str, expect: int | None = None, **kwargs: Any) -> Any:
        kwargs["headers"] = {**KEY, **kwargs.get("headers", {})}
        resp = client.request(method, url, **kwargs)
        if expect is not None:
            assert resp.status_code == expect, (method, url, resp.status_code, resp.text)
        answered.setdefault((method, template(doc["paths"], url)), set()).add(resp.status_code)
        return resp

    # each route's own answers
    job_id = probe("POST", "/v1/jobs", 202, json=SCORE).json()["id"]
    probe("POST", "/v1/jobs", 202, json=SCORE, headers={"Idempotency-Key": "x"})
    probe("POST", "/v1/jobs", 200, json=SCORE, headers={"Idempotency-Key": "x"})
    probe("GET", f"/v1/jobs/{job_id}", 200)
    probe("GET", f"/v1/jobs/{job_id}/events", 200)
    probe("GET", f"/v1/jobs/{job_id}/events", 422, headers={"Last-Event-ID": "9" * 23})
    probe("DELETE", f"/v1/jobs/{job_id}", 200)
    for path in (f"/v1/jobs/{'0' * 32}", f"/v1/jobs/{'0' * 32}/events"):
        probe("GET", path, 404)
    probe("DELETE", f"/v1/jobs/{'0' * 32}", 404)
    probe("GET", "/v1/runs/never-seen", 404)
    probe("DELETE", "/v1/runs/never-seen", 200)
    probe("POST", "/v1/verify/no_such_verifier", 404, json=VERIFY)
    probe("GET", "/v1/verifiers", 200)
    probe("GET", "/v1/estimators", 200)
    probe("GET", "/v1/estimators?kind=nonsense", 422)
    probe("GET", "/healthz", 200)
    probe("GET", "/metrics")
    probe("GET", "/readyz", 200)
    app.state.services.executor.is_ready = False
    probe("GET", "/readyz", 503)
    app.state.services.executor.is_ready = True

    # every body-reading route: success and the refusals of a body
    for path, body in BODIES.items():
        url = path.replace("{verifier}", "exact_match")
        probe("POST", url, 202 if path == "/v1/jobs" else 200, json=body)
        probe("POST", url, 400, content=b"{", headers={"content-type": "application/json"})
        probe("POST", url, 413, content=b" " * (MAX_BODY + 1),
              headers={"content-type": "application/json"})
        probe("POST", url, 415, content=b"x", headers={"content-type": "text/plain"})
        probe("POST", url, 422, json={"unknown": 1})

    # every route: no key, then the tenant at its limit (whatever each answers then)
    routes = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]
    limiter = app.state.services.limiter
    tenant = app.state.services.keys.lookup("k")
    held = [f"held-by-the-test-{k}" for k in range(LIMIT)]
    for slot in held:
        asyncio.run(limiter.acquire(tenant, slot, force=True))
    try:
        for method, path in routes:
            url = path.replace("{job_id}", job_id).replace("{run_id}", "r") \
                .replace("{verifier}", "exact_match")
            kwargs = {"json": BODIES[path]} if path in BODIES else {}
            probe(method, url, **kwargs)
    finally:
        for slot in held:
            asyncio.run(limiter.release(tenant, slot))
    for method, path in routes:
        url = path.replace("{job_id}", job_id).replace("{run_id}", "r") \
            .replace("{verifier}", "exact_match")
        probe(method, url, 401 if path.startswith("/v1/") else None,
              headers={"Authorization": "Bearer wrong"})  # /metrics: as its access rule says

    undocumented = sorted(
        f"{method} {path}: {status}" for (method, path), statuses in answered.items()
        for status in statuses
        if str(status) not in doc["paths"][path][method.lower()]["responses"])
    assert not undocumented, undocumented
    assert any(429 in statuses for statuses in answered.values()), "no route hit the limit"
