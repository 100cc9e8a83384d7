"""Prometheus metrics of distributed execution: Celery tasks by state, their duration and
retries. :class:`~rewardd.workers.distributed.CeleryExecutor` records them in the API
process; :mod:`rewardd.service.metrics` exposes them with the rest.

They live here, below the service, so the executor never imports the API layer. Names are
part of the operational contract (dashboards scrape them): add, never rename.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)
"""Seconds; shared by every latency histogram of rewardd."""

TASK_DURATION = Histogram("rewardd_task_duration_seconds",
                          "Celery tasks (one group through one verifier): from publishing to "
                          "the API reading the stored result (queueing, transit, the checks).",
                          ["queue", "verifier"], buckets=LATENCY_BUCKETS)
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
