"""The session store's per-tenant bounds in Redis (:mod:`rewardd.service.sessions.quota` says
what they are): each step one Lua script, so pods racing for a tenant's last room cannot
overshoot, and deleting an evicted session happens in the same step as uncounting it.

Keys, per tenant: ``rewardd:sessions:held-groups:<tenant>`` and ``...:held-bytes:<tenant>``
(hashes: session id -> groups, bytes stored), ``rewardd:sessions:ended:<tenant>`` (sorted
set: the tenant's retained ended sessions by when they ended); ``rewardd:sessions:holders``
(set of tenants with counts, for the metrics). A counted session whose record is gone
(expired after ``REWARDD_SESSION_TTL_S``) is uncounted the next time its tenant's counts are
summed; the sums run over the tenant's stored sessions only, which these bounds keep few.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from rewardd.service.sessions.quota import BYTES, GROUPS, RETAINED, Refusal, StoreLimits

if TYPE_CHECKING:
    import redis
    import redis.asyncio

HELD_GROUPS = "rewardd:sessions:held-groups:"
HELD_BYTES = "rewardd:sessions:held-bytes:"
ENDED = "rewardd:sessions:ended:"
HOLDERS = "rewardd:sessions:holders"
COUNTS_TTL_S = 7 * 24 * 3600
"""A tenant's counts outlive its last change by this long (then it has nothing stored)."""
SESSION_PARTS = ("", "groups", "events", "deadlines", "slots", "pending", "done", "indexed")
"""A session's keys (:mod:`rewardd.service.sessions.redis_store`), deleted on eviction."""

# KEYS: held-groups, held-bytes, ended; ARGV[1]: the session key prefix
_COMMON = """
local prefix = ARGV[1]
local function drop(sid)
  redis.call('HDEL', KEYS[1], sid)
  redis.call('HDEL', KEYS[2], sid)
  redis.call('ZREM', KEYS[3], sid)
  local base = prefix .. sid
  redis.call('DEL', base, base .. ':groups', base .. ':events', base .. ':deadlines',
             base .. ':slots', base .. ':pending', base .. ':done', base .. ':indexed')
end
local function live_sum(hash)
  local total = 0
  local all = redis.call('HGETALL', hash)
  for i = 1, #all, 2 do
    if redis.call('EXISTS', prefix .. all[i]) == 1 then
      total = total + tonumber(all[i + 1])
    else
      drop(all[i])
    end
  end
  return total
end
"""

# ARGV: prefix, sid, groups, bytes, max groups/session, max groups/tenant, max bytes/tenant,
# tenant, counts ttl; KEYS[4]: the holders set
_TAKE = _COMMON + """
local sid, g_add, b_add = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local own = tonumber(redis.call('HGET', KEYS[1], sid) or '0')
if own + g_add > tonumber(ARGV[5]) then return {1, own} end
local g, b = live_sum(KEYS[1]), live_sum(KEYS[2])
local max_g, max_b = tonumber(ARGV[6]), tonumber(ARGV[7])
while g + g_add > max_g or b + b_add > max_b do
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0)
  if #oldest == 0 then break end
  g = g - tonumber(redis.call('HGET', KEYS[1], oldest[1]) or '0')
  b = b - tonumber(redis.call('HGET', KEYS[2], oldest[1]) or '0')
  drop(oldest[1])
end
if g + g_add > max_g then return {2, g} end
if b + b_add > max_b then return {3, b} end
redis.call('HINCRBY', KEYS[1], sid, g_add)
redis.call('HINCRBY', KEYS[2], sid, b_add)
redis.call('EXPIRE', KEYS[1], ARGV[9])
redis.call('EXPIRE', KEYS[2], ARGV[9])
redis.call('SADD', KEYS[4], ARGV[8])
return {0, 0}
"""

# ARGV: prefix, sid, groups, bytes
_GIVE = """
for i = 1, 2 do
  local n = tonumber(redis.call('HGET', KEYS[i], ARGV[2]) or '-1')
  if n >= 0 then
    redis.call('HSET', KEYS[i], ARGV[2], math.max(0, n - tonumber(ARGV[2 + i])))
  end
end
return 1
"""

# ARGV: prefix, sid, now, max retained, tenant, counts ttl; KEYS[4]: the holders set
_ENDED = _COMMON + """
for _, sid in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  if redis.call('EXISTS', prefix .. sid) == 0 then drop(sid) end
end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
while redis.call('ZCARD', KEYS[3]) > tonumber(ARGV[4]) do
  drop(redis.call('ZRANGE', KEYS[3], 0, 0)[1])
end
redis.call('EXPIRE', KEYS[3], ARGV[6])
redis.call('SADD', KEYS[4], ARGV[5])
return 1
"""

# KEYS[1]: holders; ARGV: prefix, held-groups prefix, held-bytes prefix, ended prefix
_USAGE = """
local out = {}
for _, tenant in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local sums = {}
  for j, hash in ipairs({ARGV[2] .. tenant, ARGV[3] .. tenant}) do
    local total = 0
    local all = redis.call('HGETALL', hash)
    for i = 1, #all, 2 do
      if redis.call('EXISTS', ARGV[1] .. all[i]) == 1 then
        total = total + tonumber(all[i + 1])
      end
    end
    sums[j] = total
  end
  table.insert(out, tenant)
  table.insert(out, sums[1])
  table.insert(out, sums[2])
  table.insert(out, redis.call('ZCARD', ARGV[4] .. tenant))
end
return out
"""


class RedisLedger:
    """The per-tenant counts of a :class:`~rewardd.service.sessions.redis_store.RedisStore`
    (see the module docstring)."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str, limits: StoreLimits,
                 url: str | None) -> None:
        self.client = client
        self.prefix = prefix
        self.limits = limits
        self.url = url
        self._take = client.register_script(_TAKE)
        self._give = client.register_script(_GIVE)
        self._ended = client.register_script(_ENDED)
        self._sync: redis.Redis | None = None
        self._sync_lock = threading.Lock()

    @staticmethod
    def keys(tenant: str) -> list[str]:
        return [HELD_GROUPS + tenant, HELD_BYTES + tenant, ENDED + tenant, HOLDERS]

    async def take(self, tenant: str, sid: str, groups: int, nbytes: int
                   ) -> tuple[Refusal, int]:
        lim = self.limits
        code, held = await self._take(keys=self.keys(tenant), args=[
            self.prefix, sid, groups, nbytes, lim.groups_per_session, lim.groups_per_tenant,
            lim.bytes_per_tenant, tenant, COUNTS_TTL_S])
        return Refusal(int(code)), int(held)

    async def give(self, tenant: str, sid: str, groups: int, nbytes: int) -> None:
        await self._give(keys=self.keys(tenant)[:2], args=[self.prefix, sid, groups, nbytes])

    async def ended(self, tenant: str, sid: str, now: float) -> None:
        await self._ended(keys=self.keys(tenant), args=[
            self.prefix, sid, now, self.limits.retained_per_tenant, tenant, COUNTS_TTL_S])

    def usage(self) -> dict[tuple[str, str], int]:
        """Every tenant's stored groups, bytes and retained ended sessions: one script on a
        synchronous client (the metrics scrape runs in a thread)."""
        with self._sync_lock:
            if self._sync is None:
                if self.url is None:
                    return {}
                import redis

                self._sync = redis.Redis.from_url(self.url, socket_connect_timeout=1,
                                                  socket_timeout=1)
                self._usage = self._sync.register_script(_USAGE)
        flat = self._usage(keys=[HOLDERS], args=[self.prefix, HELD_GROUPS, HELD_BYTES, ENDED])
        out: dict[tuple[str, str], int] = {}
        for i in range(0, len(flat), 4):
            tenant = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
            out[(tenant, GROUPS)] = int(flat[i + 1])
            out[(tenant, BYTES)] = int(flat[i + 2])
            out[(tenant, RETAINED)] = int(flat[i + 3])
        return out

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
