"""A bound on one judge backend's requests in flight across every worker process, in Redis.

Each process bounds its own requests (``max_concurrency``), but a fleet of N worker processes
then sends up to N times that, and a hosted judge answers the surplus with 429s. With
``fleet_max_concurrency`` set, every request also holds a slot in one Redis sorted set per
backend: a slot is a lease whose score is the time it lapses (the request's timeout plus a
margin), so the slots of a worker that died free themselves. Taking a slot is one Lua script
(drop lapsed leases, count, add) on Redis's own clock, so two processes never both take the
last one. A request that finds no slot waits, polling with backoff.

When Redis cannot be reached the bound falls back to the per-process one (logged): judging
goes on, perhaps with some 429s that the client then retries, rather than stopping.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

WAIT_MIN_S = 0.005
WAIT_MAX_S = 0.1
LEASE_MARGIN_S = 5.0

_TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return 1
"""


def check_redis_url(url: str, what: str) -> None:
    """ValueError unless ``url`` is a Redis URL (checked when a backend is built, so that a
    typo is a configuration error rather than a silent fallback at the first request)."""
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"{what} {url!r} must start with redis://, rediss:// or unix://")


def state_url(environ: dict[str, str] | None = None) -> str | None:
    """Where fleet slots live: REWARDD_JUDGE_STATE_URL, else the service's state Redis
    (REWARDD_STATE_URL), else the broker (REWARDD_BROKER_URL)."""
    env = os.environ if environ is None else environ
    for name in ("REWARDD_JUDGE_STATE_URL", "REWARDD_STATE_URL", "REWARDD_BROKER_URL"):
        if env.get(name):
            return env[name]
    return None


class FleetSlots:
    """At most ``limit`` leases on ``key`` at once, across processes."""

    def __init__(self, url: str, key: str, limit: int, lease_s: float) -> None:
        if limit < 1:
            raise ValueError(f"fleet_max_concurrency must be at least 1, not {limit}")
        check_redis_url(url, "the fleet bound's Redis URL")
        self.url, self.key, self.limit = url, key, limit
        self.lease_s = lease_s + LEASE_MARGIN_S
        self._client: Any = None
        self._take: Any = None
        self._pid: int | None = None
        self._warned = False

    def _ensure(self) -> None:
        """A client of this process's event loop (made again after a fork)."""
        if self._client is None or self._pid != os.getpid():
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(self.url, socket_connect_timeout=2,
                                                   socket_timeout=5)
            self._take = self._client.register_script(_TAKE)
            self._pid = os.getpid()

    async def acquire(self, token: str) -> bool:
        """Take a slot under ``token`` (from :func:`new_lease_token`) once one is free: True;
        False when Redis is unreachable (no fleet bound for this request). Release the token
        whatever this returns or raises: a slot taken just before a cancellation is freed."""
        wait = WAIT_MIN_S
        while True:
            try:
                self._ensure()
                if await self._take(keys=[self.key], args=[token, self.limit, self.lease_s]):
                    return True
            except Exception as exc:  # Redis down: the per-process bound still holds
                if not self._warned:
                    log.warning("judge fleet slots at %s unavailable (%s: %s); bounding "
                                "per process only", self.key, type(exc).__name__, exc)
                    self._warned = True
                return False
            await asyncio.sleep(wait)
            wait = min(wait * 2, WAIT_MAX_S)

    async def release(self, token: str | None) -> None:
        if token is None or self._client is None:
            return
        try:
            await self._client.zrem(self.key, token)
        except Exception:  # the lease lapses by itself
            pass


def new_lease_token() -> str:
    return uuid.uuid4().hex
