"""Prometheus metrics: HTTP traffic, verifier outcomes, and per-batch reward/advantage summaries.

Metric names are part of the operational contract (dashboards scrape them); add, never
rename. With several uvicorn workers, ``rewardd serve`` points prometheus-client's
multiprocess mode at a shared directory so /metrics aggregates every worker.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest, multiprocess)
from prometheus_client import REGISTRY as DEFAULT_REGISTRY

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)

HTTP_REQUESTS = Counter("rewardd_http_requests_total", "HTTP requests by route and status.",
                        ["route", "method", "status"])
HTTP_LATENCY = Histogram("rewardd_http_request_duration_seconds",
                         "HTTP request latency by route and status.",
                         ["route", "method", "status"], buckets=LATENCY_BUCKETS)
HTTP_IN_FLIGHT = Gauge("rewardd_http_requests_in_flight", "HTTP requests being served.",
                       multiprocess_mode="livesum")
VERIFIER_DURATION = Histogram("rewardd_verifier_duration_seconds",
                              "Time inside one verifier call.", ["verifier"],
                              buckets=LATENCY_BUCKETS)
VERIFIER_OUTCOMES = Counter("rewardd_verifier_outcomes_total",
                            "Verifier calls by outcome (ok or the failure kind).",
                            ["verifier", "outcome"])
ROLLOUTS_SCORED = Counter("rewardd_rollouts_scored_total", "Rollouts scored.")
GROUPS_SCORED = Counter("rewardd_groups_scored_total", "Groups scored.")
BATCH_REWARD_MEAN = Gauge("rewardd_batch_reward_mean", "Mean reward of the last batch.",
                          multiprocess_mode="mostrecent")
BATCH_REWARD_STD = Gauge("rewardd_batch_reward_std", "Std of rewards of the last batch.",
                         multiprocess_mode="mostrecent")
BATCH_ADVANTAGE_MEAN = Gauge("rewardd_batch_advantage_mean",
                             "Mean rollout advantage of the last batch.",
                             multiprocess_mode="mostrecent")
BATCH_ADVANTAGE_STD = Gauge("rewardd_batch_advantage_std",
                            "Std of rollout advantages of the last batch.",
                            multiprocess_mode="mostrecent")
BATCH_ZERO_ADVANTAGE = Histogram("rewardd_batch_zero_advantage_fraction",
                                 "Per batch: fraction of rollouts with zero advantage.",
                                 buckets=(0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1))


def observe_verifier(verifier: str, outcome: str, seconds: float) -> None:
    VERIFIER_DURATION.labels(verifier).observe(seconds)
    VERIFIER_OUTCOMES.labels(verifier, outcome).inc()


def observe_batch(summary: dict[str, Any]) -> None:
    """Record one scored batch from its response summary."""
    ROLLOUTS_SCORED.inc(summary["rollouts"])
    GROUPS_SCORED.inc(summary["groups"])
    for gauge, key in ((BATCH_REWARD_MEAN, "reward_mean"), (BATCH_REWARD_STD, "reward_std"),
                       (BATCH_ADVANTAGE_MEAN, "advantage_mean"),
                       (BATCH_ADVANTAGE_STD, "advantage_std")):
        if summary.get(key) is not None:
            gauge.set(summary[key])
    if summary.get("zero_advantage_fraction") is not None:
        BATCH_ZERO_ADVANTAGE.observe(summary["zero_advantage_fraction"])


def render(multiproc_dir: str | None) -> tuple[bytes, str]:
    """The exposition text; aggregated over worker processes in multiprocess mode."""
    if multiproc_dir:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiproc_dir)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(DEFAULT_REGISTRY), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Pure ASGI middleware: count and time every HTTP request by route template and status.

    The route template (``/v1/verify/{verifier}``), not the raw path, is the label, so label
    cardinality stays bounded.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_with_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        HTTP_IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            HTTP_IN_FLIGHT.dec()
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            HTTP_REQUESTS.labels(label, scope["method"], str(status)).inc()
            HTTP_LATENCY.labels(label, scope["method"], str(status)).observe(elapsed)


__all__ = ["MetricsMiddleware", "observe_batch", "observe_verifier", "render"]
