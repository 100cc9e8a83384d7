"""Issue 15 row 7: request-chosen strings never become Prometheus label values, and /metrics is
guarded like the API (REWARDD_METRICS_TOKEN, else the API keys).

The judge test runs the real rubric verifier in this process (an executor that calls the
worker's task function inline) against the rule-based judge server over real HTTP, so the
label a request's ``backend.model`` gets is the one the whole path produces.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rewardd.service import metrics
from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.verifiers.judge.backend import REQUEST_MODEL
from tests.support.executors import GatedExecutor, InlineExecutor
from tests.support.judge_server import JudgeServer

RUBRIC = {"rubric": [{"criterion": "Mentions 'aspirin'", "points": 1}]}
JUDGE_METRICS = ("rewardd_judge_calls_total", "rewardd_judge_tokens_total",
                 "rewardd_judge_cost_usd_total", "rewardd_judge_retries_total")


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://rewardd")


def parse(text: str) -> dict[str, set[tuple]]:
    """Metric name -> the label sets of its samples, from an exposition text."""
    found: dict[str, set[tuple]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).add(tuple(sorted(sample.labels.items())))
    return found


async def scrape(http: httpx.AsyncClient) -> dict[str, set[tuple]]:
    resp = await http.get("/metrics")
    assert resp.status_code == 200, resp.text
    return parse(resp.text)


def label_values(scraped: dict[str, set[tuple]], names: Sequence[str], label: str) -> set[str]:
    return {value for name in names for labels in scraped.get(name, ()) for key, value in labels
            if key == label}


async def test_fifty_request_chosen_judge_models_create_no_label_values(
        judge: JudgeServer) -> None:
    app = create_app(Settings(), executor=InlineExecutor())
    async with client(app) as http:
        async def verify(model: str | None) -> dict[str, Any]:
            params = {"backend": {"model": model}} if model else {}
            resp = await http.post("/v1/verify/rubric", json={
                "completion": "take aspirin", "prompt": "headache?", "reference": RUBRIC,
                "params": params})
            assert resp.status_code == 200, resp.text
            assert resp.json()["ok"], resp.json()
            return resp.json()["detail"]["judge"]

        configured = await verify(None)
        assert configured["model"] == configured["metric_model"] == "rule-judge"
        first = await verify("tenant-model-0")
        assert first["model"] == "tenant-model-0" and first["metric_model"] == REQUEST_MODEL
        before = await scrape(http)
        for i in range(1, 51):
            assert (await verify(f"tenant-model-{i}"))["model"] == f"tenant-model-{i}"
        after = await scrape(http)
        text = (await http.get("/metrics")).text
    assert {"rule-judge", REQUEST_MODEL} <= label_values(after, JUDGE_METRICS, "model")
    assert "tenant-model" not in text
    for name in JUDGE_METRICS:  # not one new series: the same label sets before and after
        assert after.get(name, set()) == before.get(name, set()), name
    assert len(judge.requests) == 52


def test_judge_labels_past_their_bound_fold_into_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verifier that reports request strings anyway (a plugin, a worker older than
    metric_model) still makes a bounded number of series; every call is still counted."""
    monkeypatch.setattr(metrics, "JUDGE_MODEL", metrics.BoundedLabel("model", limit=3))
    monkeypatch.setattr(metrics, "JUDGE_BACKEND", metrics.BoundedLabel("backend", limit=2))
    for i in range(20):
        metrics.observe_judge_usage("bounded-test", {"backend": f"b{i}", "model": f"m{i}",
                                                     "calls": 1})
    seen = {(s.labels["backend"], s.labels["model"]): s.value
            for family in metrics.JUDGE_CALLS.collect() for s in family.samples
            if s.labels.get("verifier") == "bounded-test" and s.name.endswith("_total")}
    assert seen == {("b0", "m0"): 1.0, ("b1", "m1"): 1.0, ("other", "m2"): 1.0,
                    ("other", "other"): 17.0}


async def test_http_methods_outside_the_standard_ones_are_labelled_other() -> None:
    app = create_app(Settings(), executor=GatedExecutor())
    async with client(app) as http:
        for i in range(5):
            await http.request(f"BREW{i}", "/healthz")
        resp = await http.get("/metrics")
    methods = label_values(parse(resp.text), ["rewardd_http_requests_total"], "method")
    assert "other" in methods and not any(m.startswith("BREW") for m in methods)


# ---- who may read /metrics ---------------------------------------------------------------


@pytest.mark.parametrize("settings,allowed,refused", [
    ({}, [None, "anything"], []),
    ({"api_keys": "key-a=a"}, ["key-a"], [None, "wrong"]),
    ({"api_keys": "key-a=a", "metrics_token": "scrape"}, ["scrape"], [None, "key-a", "wrong"]),
    ({"metrics_token": "scrape"}, ["scrape"], [None, "wrong"]),
], ids=["open-without-keys", "any-api-key", "token-only-with-keys", "token-without-keys"])
async def test_metrics_access_follows_the_token_else_the_api_keys(
        settings: dict[str, str], allowed: list[str | None], refused: list[str | None]) -> None:
    app = create_app(Settings(**settings), executor=GatedExecutor())
    async with client(app) as http:
        for token in allowed:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            resp = await http.get("/metrics", headers=headers)
            assert resp.status_code == 200, (token, resp.text)
            assert "rewardd_http_requests_total" in resp.text
        for token in refused:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            resp = await http.get("/metrics", headers=headers)
            assert resp.status_code == 401, (token, resp.text)
            assert resp.headers["www-authenticate"] == "Bearer"
            detail = resp.json()["detail"]
            assert "/metrics" in detail
            assert ("REWARDD_METRICS_TOKEN" in detail) == ("metrics_token" in settings)
            assert "rewardd_" not in resp.text
        if "metrics_token" in settings and "api_keys" not in settings:
            # the token guards /metrics only: the API stays open without keys
            assert (await http.get("/v1/verifiers")).status_code == 200
