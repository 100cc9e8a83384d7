"""Prometheus metrics of distributed execution: Celery tasks by state, their duration and
retries. :class:`~rewardd.workers.distributed.CeleryExecutor` records them in the API
process; :mod:`rewardd.service.metrics` exposes them with the rest.

They live here, below the service, so the executor never imports the API layer. Names are
part of the operational contract (dashboards scrape them): add, never rename.
"""

from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)
"""Seconds; shared by every request and verifier latency histogram of rewardd."""

TASK_BUCKETS = (*LATENCY_BUCKETS, 300, 600, 900, 1800, 3600)
"""Seconds; tasks and queue waits. Past 120 s up to the longest a task may exist: a
message may wait REWARDD_QUEUE_TIMEOUT_S (3600 s by default) in its queue and run up to
REWARDD_VISIBILITY_TIMEOUT_S (900 s); with the request buckets a quantile of a backed-up
queue would read "120" however long the wait."""

TASK_DURATION = Histogram("rewardd_task_duration_seconds",
                          "Celery tasks (one group through one verifier): from publishing to "
                          "the API reading the stored result (queueing, transit, the checks).",
                          ["queue", "verifier"], buckets=TASK_BUCKETS)
TASK_RETRIES = Counter("rewardd_task_retries_total",
                       "Celery tasks run again: reason=replay, a group task that failed as a "
                       "whole and was replayed one sample per task (counted once per task); "
                       "reason=worker_lost, redeliveries after a worker process or machine died.",
                       ["queue", "reason"])
TASKS = Counter("rewardd_tasks_total",
                "Celery tasks settled, by state: success, failure (the task raised: time "
                "limit, worker lost past the budget), expired (no result by the deadline, or "
                "expired in its queue), unavailable (broker or backend unreachable, executor "
                "closed).", ["queue", "state"])

BUILD_INFO = Gauge("rewardd_build_info", "1, labelled with the running release and its role "
                   "(api or worker).", ["version", "python", "role"], multiprocess_mode="max")


def set_build_info(role: str) -> None:
    """Set ``rewardd_build_info`` for this process's role (the API at import of its metrics,
    a worker when its exporter starts)."""
    try:
        version = metadata.version("rewardd")
    except metadata.PackageNotFoundError:
        version = "unknown"
    BUILD_INFO.labels(version, platform.python_version(), role).set(1)
