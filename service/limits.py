"""Per-tenant limits on work in flight: requests that spend workers or CPU, and jobs.

One tenant's burst must not take every worker from the others. Every request of a route in
:data:`SLOT_ROUTES` (each spends verifier workers or notable CPU in the API process) and
each running job holds a *slot* of its tenant; past ``Tenant.max_concurrent_jobs`` slots a
new request gets 429 with ``Retry-After`` and nothing is started, not even reading its body.
The slot is taken before the body is read because reading and validating a batch is work
too (a large msgpack body decodes and validates for seconds); a refusal then costs the API
nothing. Catalogue, run-state and job-status reads take no slot: they are dictionary
lookups, and a trainer polling its job must never be refused because its batches run.

One pool of slots per tenant rather than one per route: the scarce resource (workers, API
CPU) is shared by all routes, and a tenant limited to 2 must not get 2 per route (10 in all)
by spreading its calls.

Two stores of slots, one interface:

* :class:`MemoryLimiter`: in this process (embedded use, one API process).
* :class:`RedisLimiter`: one sorted set per tenant in Redis, shared by every API pod. A slot
  is a *lease*: its score is the time it expires, renewed while the work runs, so the slots
  of a pod that died free themselves within :data:`LEASE_S` instead of blocking the tenant
  for ever. Acquiring is one Lua script (drop expired leases, count, add), so two pods can
  never both take the last slot; its clock is Redis's (``TIME``), not the pods'.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import uuid
from typing import Any, AsyncIterator

from rewardd.service.errors import Busy
from rewardd.service.tenancy import Tenant
from rewardd.workers import fairness

LEASE_S = 30.0
"""How long a slot outlives the last renewal (a dead pod's slots free themselves then)."""

RENEW_EVERY_S = LEASE_S / 3

SLOT_ROUTES = ("/v1/score", "/v1/rewards", "/v1/advantages", "/v1/verify/{verifier}",
               "/v1/jobs")
"""Routes whose requests hold a tenant slot (a job holds one until it finishes)."""


class TenantBusy(Busy):
    """The tenant is at its limit of work in flight; the route answers 429 with Retry-After."""

    def __init__(self, tenant: Tenant, retry_after_s: int) -> None:
        super().__init__(
            f"tenant {tenant.name!r} already has {tenant.max_concurrent_jobs} requests "
            "(score, rewards, advantages, verify) or jobs running (its limit); retry after "
            f"{retry_after_s} s, or ask the operator to raise max_concurrent_jobs "
            "(REWARDD_TENANT_MAX_CONCURRENT_JOBS)", tenant=tenant.name,
            retry_after_s=retry_after_s)


class Limiter(abc.ABC):
    """Slots of work in flight, per tenant."""

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s

    @abc.abstractmethod
    async def acquire(self, tenant: Tenant, slot: str, force: bool = False) -> bool:
        """Take ``slot`` (or renew it if held); False at the limit. ``force`` takes it
        regardless (a job resumed by another pod keeps the slot it was admitted with)."""

    @abc.abstractmethod
    async def release(self, tenant: Tenant, slot: str) -> None: ...

    @abc.abstractmethod
    async def in_use(self, tenant: Tenant) -> int:
        """Slots the tenant holds now."""

    async def admit(self, tenant: Tenant, slot: str) -> None:
        """Take ``slot`` or raise :class:`TenantBusy`."""
        if not await self.acquire(tenant, slot):
            raise TenantBusy(tenant, self.retry_after_s)

    async def keep(self, tenant: Tenant, slot: str) -> None:
        """Renew ``slot`` until cancelled (a background task while the work runs)."""
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            with contextlib.suppress(Exception):  # a missed renewal is retried next time
                await self.acquire(tenant, slot, force=True)

    @contextlib.asynccontextmanager
    async def hold(self, tenant: Tenant, slot: str | None = None) -> AsyncIterator[str]:
        """Hold a slot for the duration of the block (429 via TenantBusy if none is free).

        The block is also one *flow* of the executors' fair queue
        (:mod:`rewardd.workers.fairness`, flow id = the slot id): every request holding a
        slot gets an equal share of the verifier workers, whatever its size."""
        slot = slot or uuid.uuid4().hex
        await self.admit(tenant, slot)
        renew = asyncio.create_task(self.keep(tenant, slot))
        try:
            with fairness.flow(tenant.name, slot):
                yield slot
        finally:
            renew.cancel()
            with contextlib.suppress(Exception):
                await self.release(tenant, slot)

    async def close(self) -> None:
        """Release connections."""


class MemoryLimiter(Limiter):
    """Slots in this process: exact, and gone with it."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(retry_after_s)
        self._slots: dict[str, set[str]] = {}

    async def acquire(self, tenant: Tenant, slot: str, force: bool = False) -> bool:
        held = self._slots.setdefault(tenant.name, set())
        if force or slot in held or len(held) < tenant.max_concurrent_jobs:
            held.add(slot)
            return True
        return False

    async def release(self, tenant: Tenant, slot: str) -> None:
        self._slots.get(tenant.name, set()).discard(slot)

    async def in_use(self, tenant: Tenant) -> int:
        return len(self._slots.get(tenant.name, ()))


_ACQUIRE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if held or ARGV[3] == '1' or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], t + tonumber(ARGV[4]), ARGV[1])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[4])) + 1)
  return 1
end
return 0
"""

_COUNT = """
local now = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(now[1]) + tonumber(now[2]) / 1e6)
return redis.call('ZCARD', KEYS[1])
"""


class RedisLimiter(Limiter):
    """Slots as leases in one Redis sorted set per tenant, shared by all API pods."""

    def __init__(self, client: Any, retry_after_s: int, lease_s: float = LEASE_S) -> None:
        super().__init__(retry_after_s)
        self.client = client
        self.lease_s = lease_s
        self._acquire = client.register_script(_ACQUIRE)
        self._count = client.register_script(_COUNT)

    @staticmethod
    def key(tenant: Tenant) -> str:
        return f"rewardd:slots:{tenant.name}"

    async def acquire(self, tenant: Tenant, slot: str, force: bool = False) -> bool:
        ok = await self._acquire(keys=[self.key(tenant)],
                                 args=[slot, tenant.max_concurrent_jobs, int(force),
                                       self.lease_s])
        return bool(ok)

    async def release(self, tenant: Tenant, slot: str) -> None:
        await self.client.zrem(self.key(tenant), slot)

    async def in_use(self, tenant: Tenant) -> int:
        return int(await self._count(keys=[self.key(tenant)]))


STATE_RETRY_AFTER_S = 5
"""Retry-After (seconds) of a 503 for unreachable Redis: a restart or failover takes seconds,
and a shorter hint would make every trainer hammer a Redis that is coming back."""


def state_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "Redis (state or broker) cannot be reached" wherever a route
    meets them: redis-py's connection and timeout errors (a restarting Redis's ``LOADING``
    reply is one), and kombu's, which wraps them when a Celery publish fails. Every route
    answers them with :func:`state_unavailable_detail` as a JSON 503, never a bare 500."""
    import kombu.exceptions
    import redis.exceptions

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            kombu.exceptions.OperationalError)


def state_unavailable_detail(exc: BaseException) -> str:
    """What is down and what to do, without the URL (it may hold a password)."""
    return (f"rewardd cannot reach its Redis (tenant limits, jobs, run state or the verifier "
            f"broker: REWARDD_STATE_URL / REWARDD_BROKER_URL): {type(exc).__name__}: "
            f"{str(exc)[:200] or 'no detail'}. Nothing of this request was run; retry after "
            f"{STATE_RETRY_AFTER_S} s. Operators: check that Redis is up and reachable from "
            "the API pods.")
