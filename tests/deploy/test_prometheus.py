"""A real Prometheus (the Debian package's binary) scraping a real rewardd API and a real
``rewardd worker`` exporter with deploy/prometheus/prometheus.yml (its targets pointed at
them, a 1 s interval) and deploy/prometheus/rules.yml: both targets up, queries answered from
both, every dashboard expression evaluated by the server, every alert rule loaded and
evaluated without error."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from tests.deploy.conftest import DEPLOY, find_tool
from tests.deploy.test_observability import dashboard_expressions
from tests.support.observed_stack import METRICS_TOKEN, Stack, observed_stack
from tests.support.server import REPO_ROOT, free_port

pytestmark = pytest.mark.deploy

READY_S = 60.0


def config_for(stack: Stack, token_file: Path) -> dict[str, Any]:
    """The shipped scrape config with its targets replaced by the stack's."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(DEPLOY / "prometheus" / "rules.yml")]
    targets = {"rewardd-api": stack.api.removeprefix("http://"),
               "rewardd-worker": stack.worker_metrics.removeprefix("http://").split("/")[0]}
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        if job["job_name"] == "rewardd-api":
            job["authorization"] = {"credentials_file": str(token_file)}
    return config


class Prometheus:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.http.get("/api/v1/query", params={"query": expr}).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def wait(self, expr: str, within_s: float = READY_S) -> list[dict[str, Any]]:
        deadline = time.monotonic() + within_s
        while True:
            result = self.query(expr)
            if result:
                return result
            assert time.monotonic() < deadline, f"no result for {expr} within {within_s:g} s"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, Stack]]:
    binary = find_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    with observed_stack() as stack:
        body = json.loads((REPO_ROOT / "openapi/examples/math_batch.json").read_text())
        resp = httpx.post(f"{stack.api}/v1/score", json=body, headers=stack.headers("alpha"),
                          timeout=120)
        assert resp.status_code == 200, resp.text
        token = tmp / "token"
        token.write_text(METRICS_TOKEN)
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(config_for(stack, token)))
        port = free_port()
        with open(tmp / "prometheus.log", "wb") as log:
            proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log,
                stderr=subprocess.STDOUT)
        try:
            server = Prometheus(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + READY_S
            while True:
                assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
                try:
                    if server.http.get("/-/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "Prometheus was not ready"
                time.sleep(0.25)
            yield server, stack
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_prometheus_scrapes_the_api_and_the_worker(prometheus: Any) -> None:
    server, _ = prometheus
    server.wait('count(up{job=~"rewardd-api|rewardd-worker"} == 1) == 2')  # both up
    up = server.query('count by (job) (up{job=~"rewardd-api|rewardd-worker"} == 1)')
    assert {r["metric"]["job"] for r in up} == {"rewardd-api", "rewardd-worker"}
    roles = {r["metric"]["role"] for r in server.wait("rewardd_build_info")}
    assert roles == {"api", "worker"}
    workers = {r["metric"]["queue"]: float(r["value"][1])
               for r in server.wait("max by (queue) (rewardd_workers)")}
    assert workers["cpu"] == 1 and workers["gpu"] == 0
    scored = server.wait('sum(rewardd_worker_tasks_total{state="success"})')
    assert float(scored[0]["value"][1]) >= 2
    tenants = {r["metric"]["tenant"] for r in
               server.wait('sum by (tenant) (rewardd_http_requests_total{route="/v1/score"})')}
    assert tenants == {"alpha"}


def test_prometheus_evaluates_every_dashboard_expression(prometheus: Any) -> None:
    server, _ = prometheus
    server.wait("rate(rewardd_http_requests_total[1m])")  # two scrapes of the API at least
    answered = 0
    for expr in dashboard_expressions("1m"):
        answered += bool(server.query(expr))
    assert answered >= 20  # each query succeeded; most already have data after one batch


def test_prometheus_loads_and_evaluates_every_alert_rule(prometheus: Any) -> None:
    server, _ = prometheus
    deadline = time.monotonic() + READY_S
    while True:
        groups = server.http.get("/api/v1/rules").json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        if rules and all(rule.get("lastEvaluation", "").startswith("20") and
                         rule["health"] != "unknown" for rule in rules):
            break
        assert time.monotonic() < deadline, rules
        time.sleep(0.5)
    written = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]
    assert sorted(rule["name"] for rule in rules) == sorted(
        rule["alert"] for group in written for rule in group["rules"])
    assert {rule["health"] for rule in rules} == {"ok"}, \
        [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
