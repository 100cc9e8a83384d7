"""Sessions in Redis, shared by every API pod (:class:`RedisStore`; the interface and the
reasons are :mod:`rewardd.service.sessions.store`'s).

Redis keys, under ``rewardd:sess:<id>``: the record (JSON string), ``:groups`` (hash:
group id -> the group's JSON), ``:events`` (list), ``:deadlines`` (sorted set: group id by the
unix time its timeout falls), ``:lock`` and ``:lock:<sha256 of a group id>`` (the record's
and each group's lock, ``SET NX PX`` with a token);
``rewardd:sessions:active`` (set of open or closing sessions, for every pod's sweeper),
``rewardd:sessions:tenant:<tenant>`` (set of the tenant's open sessions, for its limit),
``rewardd:sess-pod:<owner>`` (a pod's heartbeat: a check owned by a pod whose heartbeat
expired is run again by another pod), ``rewardd:sessions:inflight`` (hash of
``<tenant>\\x1f<owner>`` -> rollouts in flight: the tenant's limit holds across pods, and a
dead pod's counts are dropped) and ``:slots`` (a standing session's group generation per
prompt key), ``:pending`` (hash: group id -> the pods with unsettled work on it, joined
by ``\x1f``; groups with none are absent) and ``:done`` (sorted set: group id by when it
completed): the sweeper's indices, written with the group, so that a sweep reads them and
never a group (an idle session costs the same whatever it holds); ``:indexed`` marks a
session whose indices are kept (one an older pod stored gets them built once, from its
groups, when first swept). Active sessions' keys live
:data:`ACTIVE_TTL_S`; a finished session's get ``session_ttl_s``. The per-tenant counts of
what is stored are :mod:`rewardd.service.sessions.redis_quota`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from typing import TYPE_CHECKING, Any, AsyncIterator

import orjson

from rewardd.service.events import Event, read_redis_list
from rewardd.service.sessions.records import GroupRecord, SessionRecord
from rewardd.service.sessions.quota import Refusal, StoreLimits
from rewardd.service.sessions.redis_quota import SESSION_PARTS, RedisLedger
from rewardd.service.sessions.store import ACTIVE_TTL_S, SessionStore

if TYPE_CHECKING:
    import redis.asyncio

HEARTBEAT_S = 4.0
"""A pod's heartbeat outlives its last renewal by this long."""
LOCK_MS = 10_000
LOCK_RETRY_S = 0.002

PREFIX = "rewardd:sess:"
ACTIVE_SET = "rewardd:sessions:active"
TENANT_PREFIX = "rewardd:sessions:tenant:"
POD_PREFIX = "rewardd:sess-pod:"
INFLIGHT = "rewardd:sessions:inflight"
"""Hash ``<tenant>\\x1f<owner>`` -> rollouts that pod has in flight for the tenant."""
SEP = "\x1f"

_RESERVE = """
local total = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, #ARGV[1]) == ARGV[1] then total = total + tonumber(all[i + 1]) end
end
if total + tonumber(ARGV[3]) > tonumber(ARGV[4]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1] .. ARGV[2], ARGV[3])
return 1
"""

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def key(sid: str, part: str = "") -> str:
    return f"{PREFIX}{sid}{':' + part if part else ''}"


class RedisStore(SessionStore):
    """Sessions in Redis, shared by every API pod (see the module docstring for the keys)."""

    durable = True

    def __init__(self, client: redis.asyncio.Redis, ttl_s: int,
                 limits: StoreLimits | None = None, url: str | None = None) -> None:
        super().__init__(ttl_s, limits)
        self.client = client
        self.ledger = RedisLedger(client, PREFIX, self.limits, url)
        self._unlock = client.register_script(_UNLOCK)
        self._reserve = client.register_script(_RESERVE)
        self._local: dict[str, asyncio.Lock] = {}  # one waiter per pod on a Redis lock

    async def create(self, record: SessionRecord) -> None:
        sid = record.id
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(key(sid), orjson.dumps(record.to_json()), ex=ACTIVE_TTL_S)
            pipe.set(key(sid, "indexed"), b"1", ex=ACTIVE_TTL_S)
            pipe.sadd(ACTIVE_SET, sid)
            if not record.standing:  # server-made: not one of the tenant's
                pipe.sadd(TENANT_PREFIX + record.tenant, sid)
            await pipe.execute()

    async def record(self, sid: str) -> SessionRecord | None:
        raw = await self.client.get(key(sid))
        return SessionRecord.from_json(orjson.loads(raw)) if raw is not None else None

    @contextlib.asynccontextmanager
    async def locked(self, sid: str, gid: str | None = None  # type: ignore[override]
                     ) -> AsyncIterator[None]:
        name = key(sid, "lock" if gid is None else
                   "lock:" + hashlib.sha256(gid.encode()).hexdigest()[:32])
        local = self._local.setdefault(name, asyncio.Lock())
        async with local:
            token = uuid.uuid4().hex
            deadline = time.monotonic() + LOCK_MS / 1000
            while not await self.client.set(name, token, nx=True, px=LOCK_MS):
                if time.monotonic() > deadline:  # a holder that died: its lock expired
                    raise TimeoutError(f"session {sid}: lock not acquired")
                await asyncio.sleep(LOCK_RETRY_S)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    await self._unlock(keys=[name], args=[token])
        if not local.locked() and self._local.get(name) is local:
            self._local.pop(name, None)

    async def _write(self, sid: str, record: SessionRecord | None,
                     groups: dict[str, GroupRecord], events: list[bytes]) -> None:
        ttl = await self.client.ttl(key(sid))
        if ttl == -2:  # gone (expired or cancelled long ago)
            return
        ttl = ttl if ttl > 0 else ACTIVE_TTL_S
        async with self.client.pipeline(transaction=True) as pipe:
            if record is not None:
                pipe.set(key(sid), orjson.dumps(record.to_json()), ex=ttl)
            if groups:
                pipe.hset(key(sid, "groups"), mapping={
                    gid: orjson.dumps(group.to_json()) for gid, group in groups.items()})
                pipe.expire(key(sid, "groups"), ttl)
                self._index(pipe, sid, groups, ttl)
            if events:
                pipe.rpush(key(sid, "events"), *events)
                pipe.expire(key(sid, "events"), ttl)
            await pipe.execute()

    @staticmethod
    def _index(pipe: redis.asyncio.client.Pipeline, sid: str,
               groups: dict[str, GroupRecord], ttl: int) -> None:
        """The sweeper's indices of the groups written (see the module docstring)."""
        pending = {gid: SEP.join(sorted(g.pending_owners())) for gid, g in groups.items()}
        busy = {gid: owners for gid, owners in pending.items() if owners}
        if busy:
            pipe.hset(key(sid, "pending"), mapping=busy)
            pipe.expire(key(sid, "pending"), ttl)
        if len(busy) < len(pending):
            pipe.hdel(key(sid, "pending"), *(gid for gid in pending if gid not in busy))
        done = {gid: g.done_at or time.time() for gid, g in groups.items() if g.done}
        if done:
            pipe.zadd(key(sid, "done"), done)
            pipe.expire(key(sid, "done"), ttl)

    async def _indexed(self, sid: str, part: str, read: str, *args: object) -> Any:
        """``read`` (a Redis command) of the index ``part``, with the session's marker in
        the same round trip; a session without one (an older pod's) is indexed first."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.exists(key(sid, "indexed"))
            getattr(pipe, read)(key(sid, part), *args)
            marked, raw = await pipe.execute()
        if marked or not await self.client.exists(key(sid)):
            return raw
        groups = await self.groups(sid)  # once per such session
        async with self.client.pipeline(transaction=True) as pipe:
            self._index(pipe, sid, groups, ACTIVE_TTL_S)
            pipe.set(key(sid, "indexed"), b"1", ex=ACTIVE_TTL_S)
            getattr(pipe, read)(key(sid, part), *args)
            *_, raw = await pipe.execute()
        return raw

    async def pending(self, sid: str) -> dict[str, set[str]]:
        raw = await self._indexed(sid, "pending", "hgetall")
        return {gid.decode(): set(owners.decode().split(SEP))
                for gid, owners in raw.items()}

    async def done_before(self, sid: str, before: float) -> list[str]:
        raw = await self._indexed(sid, "done", "zrangebyscore", "-inf", f"({before}")
        return [m.decode() for m in raw]

    async def groups(self, sid: str, ids: list[str] | None = None) -> dict[str, GroupRecord]:
        if ids is None:
            raw = await self.client.hgetall(key(sid, "groups"))
            return {k.decode(): GroupRecord.from_json(orjson.loads(v)) for k, v in raw.items()}
        if not ids:
            return {}
        values = await self.client.hmget(key(sid, "groups"), ids)
        return {gid: GroupRecord.from_json(orjson.loads(v))
                for gid, v in zip(ids, values) if v is not None}

    async def events(self, sid: str, after: int = 0, limit: int | None = None
                     ) -> list[Event]:
        return await read_redis_list(self.client, key(sid, "events"), after, limit)

    async def last_event(self, sid: str) -> int:
        return int(await self.client.llen(key(sid, "events")))

    async def set_deadline(self, sid: str, gid: str, at: float | None) -> None:
        if at is None:
            await self.client.zrem(key(sid, "deadlines"), gid)
        else:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zadd(key(sid, "deadlines"), {gid: at})
                pipe.expire(key(sid, "deadlines"), ACTIVE_TTL_S)
                await pipe.execute()

    async def due(self, sid: str, now: float) -> list[str]:
        raw = await self.client.zrangebyscore(key(sid, "deadlines"), "-inf", now)
        return [m.decode() for m in raw]

    async def _live(self, members_of: str) -> list[str]:
        """Members of the set ``members_of`` whose session still exists (the others,
        expired while active, are dropped from it)."""
        ids = sorted(m.decode() for m in await self.client.smembers(members_of))
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.exists(key(sid))
            flags = await pipe.execute()
        gone = [sid for sid, flag in zip(ids, flags) if not flag]
        if gone:
            await self.client.srem(members_of, *gone)
        return [sid for sid, flag in zip(ids, flags) if flag]

    async def active(self) -> list[str]:
        return await self._live(ACTIVE_SET)

    async def open_count(self, tenant: str) -> int:
        return len(await self._live(TENANT_PREFIX + tenant))

    async def finish(self, sid: str, tenant: str) -> None:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.srem(ACTIVE_SET, sid)
            pipe.srem(TENANT_PREFIX + tenant, sid)
            for part in ("", "groups", "events", "slots", "pending", "done", "indexed"):
                pipe.expire(key(sid, part), self.ttl_s)
            pipe.delete(key(sid, "deadlines"))
            _, clients, *_ = await pipe.execute()
        if clients:  # one of the tenant's own sessions (a standing one is not in its set)
            await self.ledger.ended(tenant, sid, time.time())

    async def take(self, tenant: str, sid: str, groups: int, nbytes: int
                   ) -> tuple[Refusal, int]:
        return await self.ledger.take(tenant, sid, groups, nbytes)

    async def give(self, tenant: str, sid: str, groups: int, nbytes: int) -> None:
        await self.ledger.give(tenant, sid, groups, nbytes)

    def held(self) -> dict[tuple[str, str], int]:
        return self.ledger.usage()

    async def beat(self, owner: str) -> None:
        await self.client.set(POD_PREFIX + owner, b"1", px=int(HEARTBEAT_S * 1000))

    async def alive(self, owners: set[str]) -> set[str]:
        ordered = sorted(owners)
        if not ordered:
            return set()
        async with self.client.pipeline(transaction=False) as pipe:
            for owner in ordered:
                pipe.exists(POD_PREFIX + owner)
            flags = await pipe.execute()
        return {owner for owner, flag in zip(ordered, flags) if flag}

    async def reserve(self, tenant: str, owner: str, count: int, limit: int) -> bool:
        return bool(await self._reserve(keys=[INFLIGHT],
                                        args=[tenant + SEP, owner, count, limit]))

    async def release(self, tenant: str, owner: str, count: int) -> None:
        await self.client.hincrby(INFLIGHT, tenant + SEP + owner, -count)

    async def reap(self) -> None:
        fields = [f.decode() for f in await self.client.hkeys(INFLIGHT)]
        owners = {f.rpartition(SEP)[2] for f in fields}
        dead = owners - await self.alive(owners)
        gone = [f for f in fields if f.rpartition(SEP)[2] in dead]
        if gone:
            await self.client.hdel(INFLIGHT, *gone)

    async def slot(self, sid: str, name: str) -> int:
        raw = await self.client.hget(key(sid, "slots"), name)
        return int(raw) if raw is not None else 0

    async def set_slot(self, sid: str, name: str, value: int) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(key(sid, "slots"), name, value)
            pipe.expire(key(sid, "slots"), ACTIVE_TTL_S)
            await pipe.execute()

    async def slots(self, sid: str, names: list[str]) -> dict[str, int]:
        if not names:
            return {}
        values = await self.client.hmget(key(sid, "slots"), names)
        return {name: int(raw) if raw is not None else 0 for name, raw in zip(names, values)}

    async def set_slots(self, sid: str, values: dict[str, int]) -> None:
        if not values:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(key(sid, "slots"), mapping=values)
            pipe.expire(key(sid, "slots"), ACTIVE_TTL_S)
            await pipe.execute()

    async def bump(self, sid: str, name: str, by: int) -> int:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hincrby(key(sid, "slots"), name, by)
            pipe.expire(key(sid, "slots"), ACTIVE_TTL_S)
            value, _ = await pipe.execute()
        return int(value)

    async def drop_groups(self, sid: str, gids: list[str]) -> None:
        if gids:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hdel(key(sid, "groups"), *gids)
                pipe.hdel(key(sid, "pending"), *gids)
                pipe.zrem(key(sid, "done"), *gids)
                await pipe.execute()

    async def purge(self, sid: str) -> None:
        await self.client.delete(*(key(sid, part) for part in SESSION_PARTS))

    async def close(self) -> None:
        self.ledger.close()
