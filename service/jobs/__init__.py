"""Background scoring jobs: ``POST /v1/jobs`` and friends (routes in :mod:`rewardd.service.api.jobs`).

* :mod:`rewardd.service.jobs.store`: job records, requests, results and events, in memory (embedded
  mode: lost when the API process restarts) or in Redis (shared by pods, durable).
* :mod:`rewardd.service.jobs.runner`: runs jobs, publishes progress and finished groups, holds the
  tenant's slot and the job's lease, and resumes jobs whose pod died.
"""

from __future__ import annotations

from rewardd.service.jobs.runner import JobRunner
from rewardd.service.jobs.store import JobStore, MemoryJobStore, RedisJobStore

__all__ = ["JobRunner", "JobStore", "MemoryJobStore", "RedisJobStore"]
