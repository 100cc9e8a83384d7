"""Background scoring jobs: ``POST /v1/jobs`` and friends (routes in :mod:`rewardd.service.api.jobs`).

* :mod:`rewardd.service.jobs.store`: job records, requests, results and events, in memory (embedded
  mode: lost when the API process restarts) or in Redis (shared by pods, durable).
* :mod:`rewardd.service.jobs.runner`: runs jobs, publishes progress and finished groups, holds the
  tenant's slot and the job's lease, and resumes jobs whose pod died.
"""

from __future__ import annotations

from typing import Any

from rewardd.service import metrics
from rewardd.service.jobs.runner import JobRunner
from rewardd.service.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from rewardd.service.settings import Settings


def make_store(settings: Settings, client: Any) -> JobStore:
    """Redis when the app has a shared-state client (``app.state.redis``), else memory."""
    if client is None:
        return MemoryJobStore(settings.job_ttl_s)
    return RedisJobStore(client, settings.job_ttl_s, url=settings.state_redis_url)


def install(app: Any) -> None:
    """``app.state.jobs`` (the store) and ``app.state.job_runner``; exports
    ``rewardd_jobs{state}`` from the store. Call after ``app.state.redis`` is set; the app's
    lifespan calls ``job_runner.start()`` (the sweeper) and ``job_runner.close()``."""
    state = app.state
    state.jobs = make_store(state.settings, state.redis)
    state.job_runner = JobRunner(state, state.jobs)
    metrics.register_job_counter(state.jobs.counts)


__all__ = ["JobRunner", "JobStore", "MemoryJobStore", "RedisJobStore", "install", "make_store"]
