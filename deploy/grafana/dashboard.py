"""Writes deploy/grafana/dashboards/rewardd.json, the rewardd Grafana dashboard.

Why a generator: the dashboard is ~40 panels of the same few shapes (a rate by a label, a
quantile of a histogram, a shared gauge read with ``max``); written by hand in Grafana's JSON
each would be 60 lines of layout noise, and a reviewer could not see the PromQL for the
boilerplate. Here every panel is one line: title, unit, expressions. Run it after changing a
panel (``.venv/bin/python deploy/grafana/dashboard.py``); tests/deploy/test_observability.py
fails while the committed JSON differs from what it writes.

Conventions the expressions follow (see docs/operations.md, "Observability"): series that
describe the shared broker or the shared job store (queue depth and age, unacknowledged
tasks, workers, jobs) are the same on every API pod and are read with ``max by``; counters
and per-process gauges are summed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "rewardd.json"
RATE = "$__rate_interval"


def q95(metric: str, by: str) -> str:
    return f"histogram_quantile(0.95, sum by ({by}, le) (rate({metric}_bucket[{RATE}])))"


def rate(metric: str, by: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector}[{RATE}]))"


# (row title, [(panel title, unit, [(expr, legend)], description)])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]], str]]]] = [
    ("Requests", [
        ("Request rate by route", "reqps",
         [(rate("rewardd_http_requests_total", "route", '{route!="/metrics"}'), "{{route}}")],
         "HTTP requests per second by route template (scrapes left out)."),
        ("Latency p95 by route", "s",
         [(q95("rewardd_http_request_duration_seconds", "route"), "{{route}}")],
         "95th percentile of request latency by route."),
        ("Errors by route", "reqps",
         [(rate("rewardd_http_requests_total", "route, status", '{status=~"5.."}'),
           "{{route}} {{status}}"),
          (rate("rewardd_http_requests_total", "route, status", '{status=~"4.."}'),
           "{{route}} {{status}}")],
         "4xx (the caller's input, 401, 429 at a tenant's limit) and 5xx per second."),
        ("Requests in flight", "short",
         [("sum(rewardd_http_requests_in_flight)", "in flight")], "Over every API process."),
    ]),
    ("Tenants", [
        ("Requests by tenant", "reqps",
         [(rate("rewardd_http_requests_total", "tenant", '{route!="/metrics"}'), "{{tenant}}")],
         "Configured tenants; 'none' is requests without a valid key (401, probes)."),
        ("Latency p95 by tenant", "s",
         [(q95("rewardd_http_request_duration_seconds", "tenant"), "{{tenant}}")], ""),
        ("Rejected (429) and failed (5xx) by tenant", "reqps",
         [(rate("rewardd_http_requests_total", "tenant, status", '{status=~"429|5.."}'),
           "{{tenant}} {{status}}")], "429: the tenant is at its concurrency limit."),
    ]),
    ("Queues and workers", [
        ("Queue depth", "short",
         [("max by (queue) (rewardd_queue_depth)", "{{queue}}")],
         "Messages waiting in the broker (shared: max over API pods)."),
        ("Oldest waiting message", "s",
         [("max by (queue) (rewardd_queue_oldest_age_seconds)", "{{queue}}")],
         "How long the oldest message of each queue has waited for a worker."),
        ("Pending in the API's fair queue", "short",
         [("sum by (queue) (rewardd_calls_pending)", "pending {{queue}}"),
          ("sum by (queue) (rewardd_calls_in_broker)", "published {{queue}}")],
         "Tasks waiting for their queue's window in the API processes, and in it."),
        ("Workers per queue", "short",
         [("max by (queue) (rewardd_workers)", "{{queue}}")],
         "Workers consuming each queue (census; 0 also when the census fails: see sources)."),
        ("Unacknowledged tasks", "short",
         [("max by (queue) (rewardd_tasks_unacked)", "{{queue}}")],
         "Delivered and not acknowledged: running, or held by a worker that died."),
        ("Oldest unacknowledged task", "s",
         [("max by (queue) (rewardd_tasks_unacked_oldest_age_seconds)", "{{queue}}")],
         "Past REWARDD_VISIBILITY_TIMEOUT_S the broker redelivers it."),
        ("Task latency p95 (publish to result)", "s",
         [(q95("rewardd_task_duration_seconds", "queue"), "{{queue}}")], ""),
        ("Queue wait p95 (workers)", "s",
         [(q95("rewardd_worker_queue_wait_seconds", "queue"), "{{queue}}")],
         "From publication to a worker starting the task."),
        ("Tasks settled by state", "ops",
         [(rate("rewardd_tasks_total", "queue, state"), "{{queue}} {{state}}"),
          (rate("rewardd_task_retries_total", "queue, reason"), "retry {{queue}} {{reason}}")],
         ""),
        ("Jobs by state", "short", [("max by (state) (rewardd_jobs)", "{{state}}")],
         "Shared job store: max over API pods."),
        ("Metric sources answering", "short",
         [("min by (source) (rewardd_metrics_source_up)", "{{source}}")],
         "1: the API read the source at its last scrape; 0: its series read 0."),
    ]),
    ("Verifiers", [
        ("Outcomes by verifier", "ops",
         [(rate("rewardd_verifier_outcomes_total", "verifier, outcome"),
           "{{verifier}} {{outcome}}")], "ok, or the typed failure kind."),
        ("Verifier duration p95", "s",
         [(q95("rewardd_verifier_duration_seconds", "verifier"), "{{verifier}}")], ""),
        ("Rollouts and groups scored", "ops",
         [("sum(rate(rewardd_rollouts_scored_total[$__rate_interval]))", "rollouts"),
          ("sum(rate(rewardd_groups_scored_total[$__rate_interval]))", "groups")], ""),
    ]),
    ("Judges", [
        ("Judge calls by result", "ops",
         [(rate("rewardd_judge_calls_total", "backend, model, result"),
           "{{backend}} {{model}} {{result}}")], "answered, cached, failed."),
        ("Judge tokens", "short",
         [(rate("rewardd_judge_tokens_total", "model, kind"), "{{model}} {{kind}}")],
         "Tokens per second by kind (prompt, completion)."),
        ("Judge cost per hour", "currencyUSD",
         [("sum by (backend, model) (increase(rewardd_judge_cost_usd_total[1h]))",
           "{{backend}} {{model}}")], "From the backends' configured prices."),
        ("Judge retries", "ops",
         [(rate("rewardd_judge_retries_total", "backend, model"), "{{backend}} {{model}}")],
         "429, 5xx and timeouts retried."),
    ]),
    ("Rewards and advantages", [
        ("Reward of the last batch", "short",
         [("avg(rewardd_batch_reward_mean)", "mean"),
          ("avg(rewardd_batch_reward_mean) + avg(rewardd_batch_reward_std)", "mean + std"),
          ("avg(rewardd_batch_reward_mean) - avg(rewardd_batch_reward_std)", "mean - std")],
         "Per API process the last batch's mean and std; averaged over processes."),
        ("Advantage of the last batch", "short",
         [("avg(rewardd_batch_advantage_mean)", "mean"),
          ("avg(rewardd_batch_advantage_std)", "std")], ""),
        ("Zero-advantage fraction", "percentunit",
         [("sum(rate(rewardd_batch_zero_advantage_fraction_sum[$__rate_interval])) / "
           "sum(rate(rewardd_batch_zero_advantage_fraction_count[$__rate_interval]))",
           "mean per batch"),
          ("histogram_quantile(0.9, sum by (le) "
           "(rate(rewardd_batch_zero_advantage_fraction_bucket[$__rate_interval])))", "p90")],
         "Rollouts whose advantage is 0 (groups with equal rewards teach nothing)."),
    ]),
    ("Workers and sandbox", [
        ("Sandbox verdicts", "ops",
         [(rate("rewardd_sandbox_verdicts_total", "verdict"), "{{verdict}}")],
         "Per test of a code sample."),
        ("Sandbox isolation by worker", "short",
         [("max by (instance, level) (rewardd_sandbox_isolation)", "{{instance}} {{level}}"),
          (rate("rewardd_sandbox_runs_total", "level"), "runs/s at {{level}}")],
         "1 for the level each sandbox worker reaches; anything but full is degraded."),
        ("Worker tasks by state", "ops",
         [(rate("rewardd_worker_tasks_total", "instance, state"), "{{instance}} {{state}}")], ""),
        ("Worker outcomes by verifier", "ops",
         [(rate("rewardd_worker_outcomes_total", "verifier, outcome"),
           "{{verifier}} {{outcome}}")], ""),
        ("Worker run time p95", "s",
         [(q95("rewardd_worker_task_duration_seconds", "verifier"), "{{verifier}}")], ""),
        ("Resident memory per worker process", "bytes",
         [("max by (instance) (rewardd_worker_process_resident_bytes)", "max {{instance}}"),
          ("sum by (instance) (rewardd_worker_process_resident_bytes)", "sum {{instance}}")],
         "Largest process and the worker's total."),
        ("Model load time", "s",
         [("max by (instance, verifier) (rewardd_model_load_seconds)",
           "{{instance}} {{verifier}}")], "Each verifier's warm-up at worker start."),
        ("Releases running", "short",
         [("count by (version, role) (rewardd_build_info)", "{{role}} {{version}}")], ""),
    ]),
]


def panel(pid: int, x: int, y: int, title: str, unit: str, targets: list[tuple[str, str]],
          description: str) -> dict[str, Any]:
    return {
        "id": pid, "type": "timeseries", "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(targets)],
    }


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row, items in ROWS:
        panels.append({"id": pid, "type": "row", "title": row, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, (title, unit, targets, description) in enumerate(items):
            panels.append(panel(pid, (i % 3) * 8, y + (i // 3) * 8, title, unit, targets,
                                description))
            pid += 1
        y += ((len(items) + 2) // 3) * 8
    return {
        "uid": "rewardd", "title": "rewardd", "tags": ["rewardd"], "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "30s", "timezone": "utc",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "label": "Prometheus",
                                 "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard (its panels' targets)."""
    return [target["expr"] for p in dashboard["panels"] for target in p.get("targets", ())]


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
