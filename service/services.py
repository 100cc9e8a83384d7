"""The app's services in one typed container, and how the edges reach it.

Built once by the app factory (:func:`build_services`), kept as the app's single state
attribute, and handed to REST routes through the :data:`ServicesDep` dependency and to the
gRPC servicer through its constructor. Nothing else reads ``app.state``: a route's, a job's
or a session's needs are in the types, and a test builds the same object the server does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from starlette.types import ASGIApp

from rewardd.service import metrics
from rewardd.service.compat.scorer import CompatScorer
from rewardd.service.jobs.service import JobService
from rewardd.service.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from rewardd.service.limits import Limiter
from rewardd.service.records.recorder import Recorder
from rewardd.service.runstate import RunStore
from rewardd.service.runtime import Runtime, build_runtime
from rewardd.service.sessions.manager import SessionManager
from rewardd.service.sessions.redis_store import RedisStore
from rewardd.service.sessions.quota import StoreLimits
from rewardd.service.sessions.store import MemoryStore, SessionStore
from rewardd.service.settings import Settings
from rewardd.service.tenancy import KeyRing
from rewardd.service.verdict_cache import VerdictCache
from rewardd.workers.executor import Executor


@dataclass(eq=False, kw_only=True)
class Services:
    """Everything the API serves from: the shared runtime and the services built on it."""

    runtime: Runtime
    jobs: JobService
    """Background jobs: their store (memory, or Redis across pods) and this process's
    runner, which also resumes a dead pod's jobs."""
    sessions: SessionManager
    """Streaming sessions (and the trainer protocols' standing ones)."""
    compat: CompatScorer
    """The per-sample trainer protocols' scoring (OpenRLHF, slime, NeMo-Gym)."""
    grpc_port: int | None = None
    """The bound gRPC port once the lifespan started gRPC (``REWARDD_GRPC_PORT``)."""

    # the runtime's parts, as every route reads them
    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def keys(self) -> KeyRing:
        return self.runtime.keys

    @property
    def runs(self) -> RunStore:
        return self.runtime.runs

    @property
    def limiter(self) -> Limiter:
        return self.runtime.limiter

    @property
    def records(self) -> Recorder:
        return self.runtime.records

    @property
    def executor(self) -> Executor:
        return self.runtime.executor

    @property
    def verdicts(self) -> VerdictCache:
        return self.runtime.verdicts


def build_services(settings: Settings, executor: Executor | None = None) -> Services:
    """The services the settings describe: in Redis when shared state is configured, else
    in this process. Exports ``rewardd_jobs{state}`` from the job store and
    ``rewardd_tenant_stored{tenant,bound}`` from the session store."""
    runtime = build_runtime(settings, executor)
    if runtime.redis is None:
        jobs: JobStore = MemoryJobStore(settings.job_ttl_s)
        session_store: SessionStore = MemoryStore(settings.session_ttl_s,
                                                  StoreLimits.of(settings))
    else:
        jobs = RedisJobStore(runtime.redis, settings.job_ttl_s, url=settings.state_redis_url)
        session_store = RedisStore(runtime.redis, settings.session_ttl_s,
                                   StoreLimits.of(settings), url=settings.state_redis_url)
    metrics.register_job_counter(jobs.counts)
    metrics.register_budgets(runtime.budgets.usage)
    metrics.register_stored(session_store.held)
    sessions = SessionManager(runtime, session_store)
    return Services(runtime=runtime, jobs=JobService(runtime, jobs),
                    sessions=sessions, compat=CompatScorer(runtime, sessions))


def install(app: FastAPI, services: Services) -> None:
    """Keep ``services`` as the app's state (the one attribute the app carries)."""
    app.state.services = services


def of_app(app: ASGIApp) -> Services | None:
    """The services of an app built by :func:`rewardd.service.app.create_app`, else None
    (route matching sees the ASGI app of the scope)."""
    state = getattr(app, "state", None)
    return getattr(state, "services", None)


def services(request: Request) -> Services:
    """FastAPI dependency: the services of the app serving ``request``."""
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services)]
"""A route parameter typed ``ServicesDep`` receives the app's :class:`Services`."""
