"""The dashboard, the alert rules and the Prometheus configuration under deploy/, checked with
Prometheus's own promtool: the rules load, every dashboard expression parses (each written
as a recording rule, which promtool parses with Prometheus's PromQL parser), the alerts fire
on the series they are about (``promtool test rules``), and the committed dashboard is what
deploy/grafana/dashboard.py writes. A real Prometheus evaluating them against a real rewardd:
tests/deploy/test_prometheus.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, find_tool

pytestmark = pytest.mark.deploy

RULES = DEPLOY / "prometheus" / "rules.yml"
CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "rewardd.json"
PROVISIONING = DEPLOY / "grafana" / "provisioning"


def dashboard_module() -> Any:
    spec = importlib.util.spec_from_file_location("rewardd_dashboard",
                                                  DEPLOY / "grafana" / "dashboard.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def dashboard_expressions(rate_interval: str) -> list[str]:
    """The dashboard's PromQL with Grafana's ``$__rate_interval`` made concrete."""
    exprs = dashboard_module().expressions(json.loads(DASHBOARD.read_text()))
    return [expr.replace("$__rate_interval", rate_interval) for expr in exprs]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([find_tool("promtool"), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_alert_rules_load() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert {"RewarddHighErrorRate", "RewarddQueueBacklogOld", "RewarddNoConsumer",
            "RewarddJudgeFailureRate", "RewarddWorkersAbsent", "RewarddJobsStuck",
            "RewarddSandboxBelowFull"} <= set(alerts)


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    exprs = dashboard_expressions("5m")
    assert len(exprs) >= 40
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_committed_dashboard_is_what_the_generator_writes() -> None:
    assert DASHBOARD.read_text() == dashboard_module().render(), \
        "run .venv/bin/python deploy/grafana/dashboard.py and commit the JSON"
    board = json.loads(DASHBOARD.read_text())
    titles = {p["title"] for p in board["panels"]}
    assert {"Request rate by route", "Queue depth", "Workers per queue", "Sandbox verdicts",
            "Judge cost per hour", "Requests by tenant", "Zero-advantage fraction"} <= titles
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "rewardd.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"


def test_kubernetes_scrape_config_keeps_the_chart_pods_per_job() -> None:
    """Debian's promtool lacks Kubernetes discovery: the structure is checked here."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-kubernetes.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"rewardd-api", "rewardd-worker"}
    for name, component in (("rewardd-api", "api"), ("rewardd-worker", "worker-.+")):
        keeps = [(r["source_labels"], r["regex"]) for r in jobs[name]["relabel_configs"]
                 if r.get("action") == "keep"]
        assert (["__meta_kubernetes_pod_label_app_kubernetes_io_component"], component) in keeps
        assert jobs[name]["kubernetes_sd_configs"] == [{"role": "pod"}]


def test_scrape_config_is_valid(tmp_path: Path) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert {job["job_name"] for job in config["scrape_configs"]} == \
        {"rewardd-api", "rewardd-worker"}
    config["rule_files"] = [str(RULES)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = promtool("check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


SERIES = {
    'rewardd_workers{queue="sandbox", instance="api-0"}': "0x15",
    'rewardd_workers{queue="cpu", instance="api-0"}': "2x15",
    'rewardd_queue_depth{queue="sandbox", instance="api-0"}': "5x15",
    'rewardd_queue_depth{queue="cpu", instance="api-0"}': "5x15",
    'rewardd_sandbox_isolation{level="namespaces", instance="w-1"}': "1x15",
    'rewardd_sandbox_isolation{level="full", instance="w-1"}': "0x15",
    'rewardd_sandbox_isolation{level="full", instance="w-2"}': "1x15",
    'rewardd_queue_oldest_age_seconds{queue="cpu", instance="api-0"}': "0+60x15",
    'rewardd_http_requests_total{status="200", route="/v1/score"}': "0+90x15",
    'rewardd_http_requests_total{status="500", route="/v1/score"}': "0+10x15",
    'rewardd_records_dropped_total{reason="queue_full", instance="api-0"}': "0x5 10+10x9",
    'rewardd_canary_total{verifier="math", source="gsm8k", kind="accept", result="passed", '
    'instance="api-0"}': "0+4x15",
    'rewardd_canary_total{verifier="math", source="gsm8k", kind="accept", result="failed", '
    'instance="api-0"}': "0x9 1+1x5",
    'rewardd_canary_total{verifier="code", source="apps", kind="accept", result="passed", '
    'instance="api-0"}': "0+2x15",
    'rewardd_sentinel_alerts_total{signal="hedging", instance="api-0"}': "0x11 1x4",
}
"""Input series (one value a minute): no worker for sandbox while it has work, one worker at
isolation ``namespaces``, a cpu backlog aging a minute a minute, 10% of requests failing,
the run record dropping rollouts from minute 6, math's canaries failing from minute 10 (code's
always passing), the sentinel raising ``hedging`` at minute 12."""

EXPECTED: list[tuple[str, str, list[tuple[dict[str, str], str]]]] = [
    # (eval time, alert, [(labels, summary)])
    ("5m", "RewarddNoConsumer",
     [({"queue": "sandbox"}, "Queue sandbox has work and no worker consuming it")]),
    ("5m", "RewarddSandboxBelowFull",
     [({"instance": "w-1", "level": "namespaces"},
       "Worker w-1 runs untrusted code at isolation namespaces")]),
    ("8m", "RewarddQueueBacklogOld", []),  # older than 300 s, but not yet for 5 minutes
    ("12m", "RewarddQueueBacklogOld",
     [({"queue": "cpu"}, "Queue cpu: the oldest call has waited 12m 0s")]),
    ("15m", "RewarddHighErrorRate", [({}, "rewardd answers 10% of requests with 5xx")]),
    ("15m", "RewarddNoWorkers", []),
    ("5m", "RewarddRecordDropping", []),
    ("8m", "RewarddRecordDropping",
     [({"reason": "queue_full"}, "The run record is dropping rollouts (queue_full)")]),
    ("9m", "RewarddCanaryFailing", []),
    ("11m", "RewarddCanaryFailing",
     [({"verifier": "math", "source": "gsm8k"},
       "Verifier math fails its canaries on source gsm8k")]),
    ("11m", "RewarddSentinelAlert", []),
    ("13m", "RewarddSentinelAlert",
     [({"signal": "hedging"}, "The sentinel raised hedging on a training run")]),
]


def alert_tests() -> dict[str, Any]:
    """A ``promtool test rules`` file: :data:`EXPECTED` from :data:`SERIES`; descriptions
    are the rules' own with the labels filled in."""
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"]
             for r in g["rules"]}
    cases = []
    for at, alert, expected in EXPECTED:
        alerts = []
        for labels, summary in expected:
            description = rules[alert]["annotations"]["description"]
            for key, value in labels.items():
                description = description.replace(f"{{{{ $labels.{key} }}}}", value)
            alerts.append({"exp_labels": {**labels, **rules[alert]["labels"]},
                           "exp_annotations": {"summary": summary,
                                               "description": description}})
        cases.append({"eval_time": at, "alertname": alert, "exp_alerts": alerts})
    return {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m",
                       "input_series": [{"series": k, "values": v} for k, v in SERIES.items()],
                       "alert_rule_test": cases}]}


def test_alerts_fire_on_the_series_they_are_about(tmp_path: Path) -> None:
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(alert_tests()))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
