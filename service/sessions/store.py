"""Where sessions live: a small record, one document per group, and an event list.

Stored like jobs (:mod:`rewardd.service.jobs.store`): in the API process without Redis
(embedded mode), in Redis when ``REWARDD_STATE_URL`` or the broker is set, so that every API
pod sees every session and another pod resumes a session whose pod died. Events use the jobs'
encoding (:func:`rewardd.service.events.encode_event`): an event's id is its 1-based
position in the list, so ``Last-Event-ID`` resumes exactly on any pod.

Why a document per group under a lock rather than one Lua script per transition
(as jobs do): a session's transitions (a rollout arrives, a check settles, a group completes
and its result is computed with the advantage library) are Python logic over a whole group;
written once as read-modify-write of plain dicts, the memory and Redis stores share all of it
(:mod:`rewardd.service.sessions.manager`), and a group's document is small (its rollouts).

Redis keys, under ``rewardd:sess:<id>``: the record (JSON string), ``:groups`` (hash:
group id -> document JSON), ``:events`` (list), ``:deadlines`` (sorted set: group id by the
unix time its timeout falls), ``:lock`` and ``:lock:<sha256 of a group id>`` (the record's and each group's lock,
``SET NX PX`` with a token);
``rewardd:sessions:active`` (set of open or closing sessions, for every pod's sweeper),
``rewardd:sessions:tenant:<tenant>`` (set of the tenant's open sessions, for its limit),
``rewardd:sess-pod:<owner>`` (a pod's heartbeat: a check owned by a pod whose heartbeat
expired is run again by another pod), ``rewardd:sessions:inflight`` (hash of
``<tenant>\\x1f<owner>`` -> rollouts in flight: the tenant's limit holds across pods, and a
dead pod's counts are dropped) and ``:slots`` (a standing session's group generation per
prompt key). Active sessions' keys live :data:`ACTIVE_TTL_S`; a
finished session's get ``session_ttl_s``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hashlib
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import orjson

from rewardd.service.events import Event, decode_event

T = TypeVar("T")
GroupUpdate = Callable[[dict[str, Any] | None], Awaitable[tuple[dict[str, Any] | None, T,
                                                                list[bytes]]]]
"""``doc -> (new doc or None to leave it, the caller's result, events to append)``."""
MetaUpdate = Callable[[dict[str, Any]], Awaitable[tuple[bool, T, list[bytes]]]]
"""``record -> (changed, the caller's result, events to append)``; mutates the record."""

ACTIVE_TTL_S = 7 * 24 * 3600
HEARTBEAT_S = 4.0
"""A pod's heartbeat outlives its last renewal by this long."""
LOCK_MS = 10_000
LOCK_RETRY_S = 0.002


class SessionStore(abc.ABC):
    """Session records, group documents and events; every update is atomic per session."""

    durable = False

    def __init__(self, ttl_s: int) -> None:
        self.ttl_s = max(1, int(ttl_s))

    @abc.abstractmethod
    async def create(self, record: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    async def record(self, sid: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def locked(self, sid: str, gid: str | None = None
               ) -> contextlib.AbstractAsyncContextManager[None]:
        """The lock of the session's record, or of its group ``gid`` (across pods for
        Redis). One lock per group: groups complete in parallel (computing a group's
        numbers under one session-wide lock queued every other group's updates behind it,
        hundreds of milliseconds in a burst of completions)."""

    @abc.abstractmethod
    async def _write(self, sid: str, record: dict[str, Any] | None,
                     groups: dict[str, dict[str, Any]], events: list[bytes]) -> None:
        """Write under the lock: the record (None: unchanged), group documents, events."""

    @abc.abstractmethod
    async def groups(self, sid: str, ids: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Group documents (all, or those of ``ids`` that exist)."""

    @abc.abstractmethod
    async def events(self, sid: str, after: int = 0) -> list[Event]: ...

    @abc.abstractmethod
    async def last_event(self, sid: str) -> int: ...

    @abc.abstractmethod
    async def set_deadline(self, sid: str, gid: str, at: float | None) -> None:
        """When group ``gid`` times out (unix seconds); None: no longer."""

    @abc.abstractmethod
    async def due(self, sid: str, now: float) -> list[str]:
        """Groups whose deadline passed."""

    @abc.abstractmethod
    async def active(self) -> list[str]:
        """Sessions open or closing."""

    @abc.abstractmethod
    async def open_count(self, tenant: str) -> int: ...

    @abc.abstractmethod
    async def finish(self, sid: str, tenant: str) -> None:
        """The session ended: off the active lists, every key gets ``ttl_s``."""

    @abc.abstractmethod
    async def beat(self, owner: str) -> None:
        """This pod is alive (renewed every second)."""

    @abc.abstractmethod
    async def alive(self, owners: set[str]) -> set[str]:
        """Which of ``owners`` still beat."""

    @abc.abstractmethod
    async def reserve(self, tenant: str, owner: str, count: int, limit: int) -> bool:
        """Count ``count`` more rollouts in flight for ``tenant`` on pod ``owner``, unless
        the tenant's total over every live pod would pass ``limit`` (then False, nothing
        counted). One atomic step, so pods racing for the last places cannot overshoot."""

    @abc.abstractmethod
    async def release(self, tenant: str, owner: str, count: int) -> None:
        """``count`` of the tenant's rollouts counted on ``owner`` are no longer in flight."""

    async def reap(self) -> None:
        """Forget the in-flight counts of pods that stopped beating (Redis)."""

    @abc.abstractmethod
    async def slot(self, sid: str, name: str) -> int:
        """A small counter of the session (0 when never set): a standing session's current
        group generation of a prompt key."""

    @abc.abstractmethod
    async def set_slot(self, sid: str, name: str, value: int) -> None: ...

    @abc.abstractmethod
    async def bump(self, sid: str, name: str, by: int) -> int:
        """Add ``by`` to the counter ``name`` (a slot), atomically; its new value."""

    @abc.abstractmethod
    async def drop_groups(self, sid: str, gids: list[str]) -> None:
        """Forget completed groups (a standing session keeps its groups a while only)."""

    @abc.abstractmethod
    async def purge(self, sid: str) -> None:
        """Delete every key of the session (a standing session made anew)."""

    async def update_group(self, sid: str, gid: str, fn: GroupUpdate[T]) -> T:
        """Read group ``gid``'s document, let ``fn`` change it, write it (and ``fn``'s
        events), all under the group's lock."""
        async with self.locked(sid, gid):
            doc = (await self.groups(sid, [gid])).get(gid)
            new, result, events = await fn(doc)
            if new is not None or events:
                await self._write(sid, None, {gid: new} if new is not None else {}, events)
            return result

    async def update_record(self, sid: str, fn: MetaUpdate[T]) -> T | None:
        """The same for the session's record (under the record's lock); None when the
        session does not exist."""
        async with self.locked(sid):
            record = await self.record(sid)
            if record is None:
                return None
            changed, result, events = await fn(record)
            if changed or events:
                await self._write(sid, record if changed else None, {}, events)
            return result

    async def close(self) -> None:
        """Release connections."""


class MemoryStore(SessionStore):
    """Sessions in this process (embedded mode): lost when it stops."""

    def __init__(self, ttl_s: int) -> None:
        super().__init__(ttl_s)
        self._records: dict[str, dict[str, Any]] = {}
        self._groups: dict[str, dict[str, dict[str, Any]]] = {}
        self._events: dict[str, list[bytes]] = {}
        self._deadlines: dict[str, dict[str, float]] = {}
        self._expires: dict[str, float] = {}
        self._locks: dict[str, dict[str | None, asyncio.Lock]] = {}
        self._slots: dict[str, dict[str, int]] = {}
        self._inflight: dict[str, int] = {}

    def _prune(self) -> None:
        now = time.monotonic()
        for sid in [s for s, t in self._expires.items() if t < now]:
            self._forget(sid)

    def _forget(self, sid: str) -> None:
        for table in (self._records, self._groups, self._events, self._deadlines,
                      self._expires, self._locks, self._slots):
            table.pop(sid, None)

    async def create(self, record: dict[str, Any]) -> None:
        self._prune()
        sid = record["id"]
        self._records[sid] = dict(record)
        self._groups[sid], self._events[sid], self._deadlines[sid] = {}, [], {}

    async def record(self, sid: str) -> dict[str, Any] | None:
        record = self._records.get(sid)
        return dict(record) if record is not None else None

    def locked(self, sid: str, gid: str | None = None
               ) -> contextlib.AbstractAsyncContextManager[None]:
        locks = self._locks.setdefault(sid, {})
        return locks.setdefault(gid, asyncio.Lock())  # type: ignore[return-value]

    async def _write(self, sid: str, record: dict[str, Any] | None,
                     groups: dict[str, dict[str, Any]], events: list[bytes]) -> None:
        if sid not in self._records:
            return
        if record is not None:
            self._records[sid] = dict(record)
        self._groups[sid].update(groups)
        self._events[sid].extend(events)

    async def groups(self, sid: str, ids: list[str] | None = None) -> dict[str, dict[str, Any]]:
        # the stored documents themselves, not copies (a copy of every group per request
        # was most of a streaming session's CPU): callers read them, and change them only
        # inside update_group, under the group's lock
        table = self._groups.get(sid, {})
        if ids is None:
            return dict(table)
        return {gid: table[gid] for gid in ids if gid in table}

    async def events(self, sid: str, after: int = 0) -> list[Event]:
        return [decode_event(seq, raw) for seq, raw in
                enumerate(self._events.get(sid, [])[after:], start=after + 1)]

    async def last_event(self, sid: str) -> int:
        return len(self._events.get(sid, []))

    async def set_deadline(self, sid: str, gid: str, at: float | None) -> None:
        table = self._deadlines.setdefault(sid, {})
        if at is None:
            table.pop(gid, None)
        else:
            table[gid] = at

    async def due(self, sid: str, now: float) -> list[str]:
        return sorted(g for g, t in self._deadlines.get(sid, {}).items() if t <= now)

    async def active(self) -> list[str]:
        self._prune()
        return [sid for sid, r in self._records.items() if r["state"] in ("open", "closing")]

    async def open_count(self, tenant: str) -> int:
        return sum(1 for r in self._records.values() if r["tenant"] == tenant
                   and r["state"] in ("open", "closing") and not r.get("standing"))

    async def finish(self, sid: str, tenant: str) -> None:
        self._expires[sid] = time.monotonic() + self.ttl_s
        self._deadlines.pop(sid, None)

    async def beat(self, owner: str) -> None:
        pass

    async def alive(self, owners: set[str]) -> set[str]:
        return set(owners)  # one process: every owner is this one

    async def reserve(self, tenant: str, owner: str, count: int, limit: int) -> bool:
        if self._inflight.get(tenant, 0) + count > limit:
            return False
        self._inflight[tenant] = self._inflight.get(tenant, 0) + count
        return True

    async def release(self, tenant: str, owner: str, count: int) -> None:
        self._inflight[tenant] = max(0, self._inflight.get(tenant, 0) - count)

    async def slot(self, sid: str, name: str) -> int:
        return self._slots.get(sid, {}).get(name, 0)

    async def set_slot(self, sid: str, name: str, value: int) -> None:
        self._slots.setdefault(sid, {})[name] = value

    async def bump(self, sid: str, name: str, by: int) -> int:
        slots = self._slots.setdefault(sid, {})
        slots[name] = slots.get(name, 0) + by
        return slots[name]

    async def drop_groups(self, sid: str, gids: list[str]) -> None:
        table = self._groups.get(sid, {})
        for gid in gids:
            table.pop(gid, None)

    async def purge(self, sid: str) -> None:
        self._forget(sid)


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

    def __init__(self, client: Any, ttl_s: int) -> None:
        super().__init__(ttl_s)
        self.client = client
        self._unlock = client.register_script(_UNLOCK)
        self._reserve = client.register_script(_RESERVE)
        self._local: dict[str, asyncio.Lock] = {}  # one waiter per pod on a Redis lock

    async def create(self, record: dict[str, Any]) -> None:
        sid = record["id"]
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(key(sid), orjson.dumps(record), ex=ACTIVE_TTL_S)
            pipe.sadd(ACTIVE_SET, sid)
            if not record.get("standing"):  # server-made: not one of the tenant's
                pipe.sadd(TENANT_PREFIX + record["tenant"], sid)
            await pipe.execute()

    async def record(self, sid: str) -> dict[str, Any] | None:
        raw = await self.client.get(key(sid))
        return orjson.loads(raw) if raw is not None else None

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

    async def _write(self, sid: str, record: dict[str, Any] | None,
                     groups: dict[str, dict[str, Any]], events: list[bytes]) -> None:
        ttl = await self.client.ttl(key(sid))
        if ttl == -2:  # gone (expired or cancelled long ago)
            return
        ttl = ttl if ttl > 0 else ACTIVE_TTL_S
        async with self.client.pipeline(transaction=True) as pipe:
            if record is not None:
                pipe.set(key(sid), orjson.dumps(record), ex=ttl)
            if groups:
                pipe.hset(key(sid, "groups"),
                          mapping={gid: orjson.dumps(doc) for gid, doc in groups.items()})
                pipe.expire(key(sid, "groups"), ttl)
            if events:
                pipe.rpush(key(sid, "events"), *events)
                pipe.expire(key(sid, "events"), ttl)
            await pipe.execute()

    async def groups(self, sid: str, ids: list[str] | None = None) -> dict[str, dict[str, Any]]:
        if ids is None:
            raw = await self.client.hgetall(key(sid, "groups"))
            return {k.decode(): orjson.loads(v) for k, v in raw.items()}
        if not ids:
            return {}
        values = await self.client.hmget(key(sid, "groups"), ids)
        return {gid: orjson.loads(v) for gid, v in zip(ids, values) if v is not None}

    async def events(self, sid: str, after: int = 0) -> list[Event]:
        raw = await self.client.lrange(key(sid, "events"), after, -1)
        return [decode_event(seq, item) for seq, item in enumerate(raw, start=after + 1)]

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
            for part in ("", "groups", "events", "slots"):
                pipe.expire(key(sid, part), self.ttl_s)
            pipe.delete(key(sid, "deadlines"))
            await pipe.execute()

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

    async def bump(self, sid: str, name: str, by: int) -> int:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hincrby(key(sid, "slots"), name, by)
            pipe.expire(key(sid, "slots"), ACTIVE_TTL_S)
            value, _ = await pipe.execute()
        return int(value)

    async def drop_groups(self, sid: str, gids: list[str]) -> None:
        if gids:
            await self.client.hdel(key(sid, "groups"), *gids)

    async def purge(self, sid: str) -> None:
        await self.client.delete(*(key(sid, part) for part in
                                   ("", "groups", "events", "deadlines", "slots")))
