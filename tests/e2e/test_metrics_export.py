"""Issue 21 part B, against a real ``rewardd serve`` on Redis and a real ``rewardd worker``
with its exporter (tests/support/observed_stack.py): every metric the Grafana dashboard or
the alert rules name is exported by one of them after some traffic; the tenant label takes
configured values only; JSON log lines carry request, tenant and task ids; probes stay out of
the info log."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rewardd.service.settings import Settings
from rewardd.workers import logs
from rewardd.workers.celery_app import PING_TASK, create_celery
from tests.support.observed_stack import BROKER_URL, Stack, observed_stack
from tests.support.server import REPO_ROOT

pytestmark = pytest.mark.e2e

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "rewardd.json"
RULES = REPO_ROOT / "deploy" / "prometheus" / "rules.yml"
NAME = re.compile(r"\brewardd_[a-z0-9_]+\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")
CODE = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
CODE_REFERENCE = {"tests": {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "13\n"]}}
RUBRIC = {"rubric": [{"criterion": "Mentions 'aspirin'", "points": 1}]}
SECRET_MODEL = f"tenant-model-{uuid.uuid4().hex[:8]}"
CALLER_ID = f"trainer-{uuid.uuid4().hex[:8]}"


def names_used() -> set[str]:
    """Metric names in the dashboard's expressions and anywhere in the rules file (its
    expressions, and the annotations that name a metric)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    return {name for text in [*exprs, RULES.read_text()] for name in NAME.findall(text)}


def samples(text: str) -> dict[str, list[Any]]:
    """Sample name -> samples; a family declared without samples yet (a labelled counter
    nothing incremented, such as judge retries) is listed under its name, empty."""
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, [])
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


FLOW = f"flow-{uuid.uuid4().hex[:8]}"


def publish_ping_with_flow_headers() -> None:
    """A task published as a publisher that sets the flow headers would (workers.logs)."""
    app = create_celery(Settings(broker_url=BROKER_URL, result_ttl_s=300))
    app.tasks[PING_TASK].apply_async(queue="cpu", expires=60, headers={
        logs.FLOW_HEADER: FLOW, logs.TENANT_HEADER: "alpha"})


@pytest.fixture(scope="module")
def traffic() -> Iterator[tuple[Stack, dict[str, list[Any]], dict[str, list[Any]]]]:
    """The stack after: a math batch (alpha), a code sample (beta), a rubric with a model
    the request chose (alpha), a 401 and probes; then one scrape of each."""
    with observed_stack() as stack:
        body = json.loads((REPO_ROOT / "openapi/examples/math_batch.json").read_text())
        with httpx.Client(base_url=stack.api, timeout=120) as http:
            resp = http.post("/v1/score", json=body,
                             headers={**stack.headers("alpha"), "X-Request-ID": CALLER_ID})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-request-id"] == CALLER_ID
            resp = http.post("/v1/verify/code", headers=stack.headers("beta"),
                             json={"completion": CODE, "reference": CODE_REFERENCE})
            assert resp.status_code == 200 and resp.json()["reward"] == 0.5, resp.text
            resp = http.post("/v1/verify/rubric", headers=stack.headers("alpha"), json={
                "completion": "take aspirin", "prompt": "headache?", "reference": RUBRIC,
                "params": {"backend": {"model": SECRET_MODEL}}})
            assert resp.status_code == 200 and resp.json()["ok"], resp.text
            resp = http.post("/v1/score", json=body,
                             headers={"Authorization": f"Bearer {SECRET_MODEL}"})
            assert resp.status_code == 401
            for probe in ("/healthz", "/readyz"):
                assert http.get(probe).status_code == 200
        publish_ping_with_flow_headers()
        yield stack, samples(stack.scrape_api()), samples(stack.scrape_worker())


def test_every_metric_of_the_dashboard_and_rules_is_exported(traffic: Any) -> None:
    _, api, worker = traffic
    exported = {family(name) for name in [*api, *worker]}
    missing = sorted(name for name in names_used() if family(name) not in exported)
    assert not missing, f"named by deploy/ but exported by neither server: {missing}"
    # and they carry values from the traffic, not just their declarations
    assert any(s.labels["verdict"] == "wrong_answer" and s.value == 1
               for s in worker["rewardd_sandbox_verdicts_total"])
    assert [s.labels for s in worker["rewardd_sandbox_isolation"] if s.value == 1] \
        and all(s.labels["level"] in ("full", "namespaces", "none")
                for s in worker["rewardd_sandbox_isolation"])
    assert sum(s.value for s in worker["rewardd_worker_tasks_total"]
               if s.labels["state"] == "success") >= 3
    assert {s.labels["pid"] for s in worker["rewardd_worker_process_resident_bytes"]} \
        and all(s.value > 1e6 for s in worker["rewardd_worker_process_resident_bytes"])
    assert any(s.labels["result"] == "answered" for s in api["rewardd_judge_calls_total"])
    assert {s.labels["role"] for s in api["rewardd_build_info"]} == {"api"}
    assert {s.labels["role"] for s in worker["rewardd_build_info"]} == {"worker"}


def test_queue_series_are_present_for_every_routed_queue(traffic: Any) -> None:
    _, api, _ = traffic
    for name in ("rewardd_queue_depth", "rewardd_workers", "rewardd_queue_oldest_age_seconds",
                 "rewardd_tasks_unacked", "rewardd_tasks_unacked_oldest_age_seconds",
                 "rewardd_calls_pending", "rewardd_calls_in_broker"):
        assert {s.labels["queue"] for s in api[name]} >= {"cpu", "sandbox", "gpu"}, name
    workers = {s.labels["queue"]: s.value for s in api["rewardd_workers"]}
    assert workers["cpu"] == workers["sandbox"] == 1 and workers["gpu"] == 0
    assert {s.labels["source"]: s.value for s in api["rewardd_metrics_source_up"]} == \
        {"broker": 1, "census": 1, "jobs": 1, "queue_depth": 1, "session_store": 1}
    assert max(b.labels["le"] == "3600.0" for b in api["rewardd_task_duration_seconds_bucket"])


def test_tenant_label_takes_configured_values_only(traffic: Any) -> None:
    _, api, worker = traffic
    tenants = {s.labels["tenant"] for s in api["rewardd_http_requests_total"]}
    assert tenants == {"alpha", "beta", "none"}
    by = {(s.labels["route"], s.labels["tenant"], s.labels["status"])
          for s in api["rewardd_http_requests_total"]}
    assert ("/v1/score", "alpha", "200") in by and ("/v1/score", "none", "401") in by
    assert ("/v1/verify/{verifier}", "beta", "200") in by
    values = {v for series in [*api.values(), *worker.values()] for s in series
              for v in s.labels.values()}
    assert SECRET_MODEL not in values and CALLER_ID not in values
    assert "request" in {s.labels["model"] for s in api["rewardd_judge_calls_total"]}


def test_json_log_lines_carry_ids_and_probes_stay_out(traffic: Any) -> None:
    stack, _, _ = traffic
    api = stack.log_lines("api")
    access = [line for line in api if line["logger"] == "uvicorn.access"]
    score = [line for line in access if line.get("request_id") == CALLER_ID]
    assert len(score) == 1 and score[0]["tenant"] == "alpha" and score[0]["status"] == 200
    assert score[0]["path"] == "/v1/score" and score[0]["level"] == "info"
    code = [line for line in access if line["path"] == "/v1/verify/code"]
    assert len(code) == 1 and code[0]["tenant"] == "beta" and len(code[0]["request_id"]) == 32
    assert not [line for line in access if line["path"] in ("/healthz", "/readyz", "/metrics")]
    done = [line for line in stack.log_lines("worker")
            if line["logger"] == "celery.app.trace" and "succeeded" in line["message"]
            and line["message"].startswith("Task rewardd.verify_groups[")]
    assert done and all(line["task_id"] in line["message"] and line["queue"] in
                        ("cpu", "sandbox") and line["verifier"] for line in done)
    assert {line["verifier"] for line in done} >= {"math", "code", "rubric"}
    # the API's own tasks carry their request's flow and tenant to the worker's lines
    assert {(line["verifier"], line.get("tenant")) for line in done} >= {
        ("math", "alpha"), ("code", "beta"), ("rubric", "alpha")}
    assert all(line.get("flow_id") for line in done)
    deadline = time.monotonic() + 30
    while not [line for line in stack.log_lines("worker") if line.get("flow_id") == FLOW]:
        assert time.monotonic() < deadline, "the ping with flow headers never ran"
        time.sleep(0.2)
    (ping,) = [line for line in stack.log_lines("worker")
               if line.get("flow_id") == FLOW and "succeeded" in line["message"]]
    assert ping["tenant"] == "alpha" and ping["task_id"] in ping["message"]
    assert all(set(line) >= {"ts", "level", "logger", "message"} for line in api)
