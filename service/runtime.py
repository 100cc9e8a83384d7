"""What request logic runs on: settings, API keys, run state, tenant limits, the shared-state
Redis and the executor, typed and built once per app.

The job runner, the session manager and the trainer protocols each take the one
:class:`Runtime` of their app instead of reading attributes off ``app.state``: what a piece
needs is then in its constructor's signature, and an app built twice (two pods in one test
process) never mixes them. The executor is the one late part: an app may be built without
starting workers (to render its OpenAPI document, or for a test), so it is attached when the
app's lifespan starts it (:func:`start_executor`), and reading it before is a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rewardd.service import metrics
from rewardd.service.budgets import TenantBudgets
from rewardd.service.limits import Limiter, MemoryLimiter, RedisLimiter
from rewardd.service.records.recorder import Recorder
from rewardd.service.runstate import MemoryRunStore, RedisRunStore, RunStore
from rewardd.service.settings import Settings
from rewardd.service.tenancy import KeyRing, load_keys
from rewardd.service.verdict_cache import VerdictCache
from rewardd.workers.executor import Executor

if TYPE_CHECKING:
    import redis.asyncio

REDIS_CONNECTIONS = 128
"""Connections of one API process to its shared-state Redis; more concurrent commands wait."""
REDIS_CONNECTION_WAIT_S = 30.0
"""How long a command waits for a free connection before it fails (a 503 with Retry-After)."""


@dataclass(eq=False, kw_only=True)
class Runtime:
    """The parts every service of one app shares."""

    settings: Settings
    keys: KeyRing
    """API keys and their tenants (empty: authentication is off)."""
    runs: RunStore
    """Per-run state of stateful estimators (each tenant reads it through ``for_tenant``)."""
    limiter: Limiter
    """Per-tenant slots of work in flight."""
    budgets: TenantBudgets
    """Per-tenant bounds on what this process holds for a tenant (streams, parked requests)."""
    records: Recorder
    """The run record (opened on first use; each tenant records through ``for_tenant``)."""
    verdicts: VerdictCache
    """The verdict cache (each request reads it through ``view``, keyed by its tenant)."""
    redis: redis.asyncio.Redis | None = None
    """The shared-state client (jobs, sessions, limits across pods); None: all in process."""
    _executor: Executor | None = field(default=None, repr=False)

    @property
    def executor(self) -> Executor:
        """Where verifier calls run; attached when the app's lifespan starts it."""
        if self._executor is None:
            raise RuntimeError("the executor is not started yet: the app's lifespan starts it "
                               "(use the app inside `with TestClient(app)` or run it under "
                               "uvicorn), or pass one to create_app(executor=...)")
        return self._executor

    @property
    def started_executor(self) -> Executor | None:
        """The executor if one is attached (what /metrics reads without requiring one)."""
        return self._executor

    def attach_executor(self, executor: Executor | None) -> None:
        self._executor = executor


def build_runtime(settings: Settings, executor: Executor | None = None) -> Runtime:
    """The runtime the settings describe. State lives in Redis when ``REWARDD_STATE_URL`` or
    the broker is set, so every API pod sees the same runs, jobs and slots; else in this
    process. A bad key file stops the start here, with the reason (``KeysInvalid``)."""
    keys = load_keys(settings)
    records = Recorder(settings, metrics.count_records_dropped, metrics.count_records_written)
    url = settings.state_redis_url
    if not url:
        return Runtime(settings=settings, keys=keys, runs=MemoryRunStore(settings.run_state_ttl_s),
                       records=records, verdicts=VerdictCache.of(settings, None), limiter=MemoryLimiter(settings.retry_after_s),
                       budgets=TenantBudgets(settings.retry_after_s), _executor=executor)
    import redis
    import redis.asyncio

    options = {"socket_connect_timeout": 5, "socket_timeout": 30, "health_check_interval": 30,
               "retry_on_timeout": True}
    # redis-py's pool refuses the 101st concurrent command (MaxConnectionsError, a 503 to
    # the client): hundreds of per-sample trainer requests in flight on one pod did that.
    # A blocking pool queues them for a free connection instead.
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=REDIS_CONNECTIONS, timeout=REDIS_CONNECTION_WAIT_S, **options)
    client = redis.asyncio.Redis(connection_pool=pool)
    runs = RedisRunStore(redis.Redis.from_url(url, **options), settings.run_state_ttl_s)
    return Runtime(settings=settings, keys=keys, runs=runs, records=records,
                   verdicts=VerdictCache.of(settings, client), limiter=RedisLimiter(client, settings.retry_after_s),
                   budgets=TenantBudgets(settings.retry_after_s), redis=client,
                   _executor=executor)


async def start_executor(settings: Settings) -> Executor:
    """The executor the settings ask for: Celery workers when a broker is set, else an
    embedded process pool. Each is imported only when chosen: the embedded pool's module
    starts no Celery, and the distributed one's loads Celery and kombu."""
    if settings.broker_url:
        from rewardd.workers.distributed import CeleryExecutor

        # Workers may start before or after the API: /readyz says when one answers.
        return CeleryExecutor(settings)
    from rewardd.workers.embedded import EmbeddedExecutor

    executor = EmbeddedExecutor(settings.pool_size, settings.plugin_modules)
    # Start the workers now, not on the first request (the forkserver imports sympy).
    await executor.ready(wait_s=120.0)
    return executor
