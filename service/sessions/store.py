"""Where sessions live: a small record, one record per group, and an event list.

Stored like jobs (:mod:`rewardd.service.jobs.store`): in the API process without Redis
(embedded mode, :class:`MemoryStore`), in Redis when ``REWARDD_STATE_URL`` or the broker is
set (:class:`~rewardd.service.sessions.redis_store.RedisStore`), so that every API pod sees
every session and another pod resumes a session whose pod died. Events use the jobs'
encoding (:func:`rewardd.service.events.encode_event`): an event's id is its 1-based
position in the list, so ``Last-Event-ID`` resumes exactly on any pod.

The store deals in typed records (:mod:`rewardd.service.sessions.records`): the session's
:class:`SessionRecord` and a :class:`GroupRecord` per group; Redis keeps their JSON
(``to_json`` / ``from_json``, the layout that module documents), the memory store the
records themselves.

Why a record per group under a lock rather than one Lua script per transition
(as jobs do): a session's transitions (a rollout arrives, a check settles, a group completes
and its result is computed with the advantage library) are Python logic over a whole group;
written once as read-modify-write of a record, the memory and Redis stores share all of it
(:mod:`rewardd.service.sessions.checking` and its neighbours), and a group's record is small
(its rollouts).

What the sweeper reads every second must not grow with what a session holds (issue #28: an
idle 200 MB session cost 45% of an API's CPU in Redis when the sweep read every group): each
store keeps, beside the groups, the owners of each group's unsettled work
(:meth:`SessionStore.pending`) and when each group completed
(:meth:`SessionStore.done_before`), written with the group, so the sweep reads those small
indices and never a group. What the store keeps per tenant is bounded
(:mod:`rewardd.service.sessions.quota`): :meth:`SessionStore.take` counts an add's groups and
bytes before it is stored, :meth:`SessionStore.finish` retains a bounded number of ended
sessions.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import time
from typing import Awaitable, Callable, TypeVar

from rewardd.service.events import Event, decode_event, decode_page
from rewardd.service.sessions.quota import Ledger, Refusal, StoreLimits
from rewardd.service.sessions.records import GroupRecord, SessionPhase, SessionRecord

T = TypeVar("T")
GroupUpdate = Callable[[GroupRecord | None], Awaitable[tuple[GroupRecord | None, T,
                                                             list[bytes]]]]
"""``group -> (the group to write, or None to leave it; the caller's result; events to
append)``; changes the group in place."""
MetaUpdate = Callable[[SessionRecord], Awaitable[tuple[bool, T, list[bytes]]]]
"""``record -> (changed, the caller's result, events to append)``; changes the record."""
ACTIVE_STATES = (SessionPhase.OPEN, SessionPhase.CLOSING)

ACTIVE_TTL_S = 7 * 24 * 3600
"""How long an active session's keys live (a durable store; a finished one's get
``session_ttl_s``)."""


class SessionStore(abc.ABC):
    """Session records, group documents and events; every update is atomic per session."""

    durable = False

    def __init__(self, ttl_s: int, limits: StoreLimits | None = None) -> None:
        self.ttl_s = max(1, int(ttl_s))
        self.limits = limits or StoreLimits()

    @abc.abstractmethod
    async def create(self, record: SessionRecord) -> None: ...

    @abc.abstractmethod
    async def record(self, sid: str) -> SessionRecord | None:
        """The session's record: a copy of its own, to read or change under the lock."""

    @abc.abstractmethod
    def locked(self, sid: str, gid: str | None = None
               ) -> contextlib.AbstractAsyncContextManager[None]:
        """The lock of the session's record, or of its group ``gid`` (across pods for
        Redis). One lock per group: groups complete in parallel (computing a group's
        numbers under one session-wide lock queued every other group's updates behind it,
        hundreds of milliseconds in a burst of completions)."""

    @abc.abstractmethod
    async def _write(self, sid: str, record: SessionRecord | None,
                     groups: dict[str, GroupRecord], events: list[bytes]) -> None:
        """Write under the lock: the record (None: unchanged), group records, events."""

    @abc.abstractmethod
    async def groups(self, sid: str, ids: list[str] | None = None) -> dict[str, GroupRecord]:
        """Group records (all, or those of ``ids`` that exist), to read; change one only
        inside :meth:`update_group`."""

    @abc.abstractmethod
    async def events(self, sid: str, after: int = 0, limit: int | None = None
                     ) -> list[Event]:
        """Events after id ``after``, in order; with ``limit``, one page of them: at most
        ``limit`` events and :data:`~rewardd.service.events.PAGE_BYTES` bytes (at least one
        event when there is one), what a stream reads at a time."""

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
        """The session ended: off the active lists, every key gets ``ttl_s``; one of the
        tenant's retained ended sessions (a client's session: the oldest past
        ``limits.retained_per_tenant`` are deleted at once)."""

    @abc.abstractmethod
    async def take(self, tenant: str, sid: str, groups: int, nbytes: int
                   ) -> tuple[Refusal, int]:
        """Count ``groups`` new groups and ``nbytes`` bytes more stored in the tenant's open
        session ``sid``, unless that passes a bound of :attr:`limits` (the tenant's oldest
        ended sessions are deleted first to make room): (the refusal, or
        ``Refusal.NONE`` with everything counted; the amount held against the bound).
        Atomic over every pod."""

    @abc.abstractmethod
    async def give(self, tenant: str, sid: str, groups: int, nbytes: int) -> None:
        """Uncount what :meth:`take` counted and was not stored after all."""

    @abc.abstractmethod
    def held(self) -> dict[tuple[str, str], int]:
        """(tenant, bound name) -> stored groups, bytes and retained ended sessions, for
        ``rewardd_tenant_stored`` (synchronous, thread-safe, one round trip at most)."""

    @abc.abstractmethod
    async def pending(self, sid: str) -> dict[str, set[str]]:
        """Group id -> the pods with unsettled work on it (groups with none are absent):
        read from a small index, never from the groups."""

    @abc.abstractmethod
    async def done_before(self, sid: str, before: float) -> list[str]:
        """Groups that completed before ``before`` (unix s), from a small index."""

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

    async def slots(self, sid: str, names: list[str]) -> dict[str, int]:
        """Several counters at once (0 for those never set): one round trip where the
        store allows (a per-sample request's placement reads every prompt key's)."""
        return {name: await self.slot(sid, name) for name in names}

    async def set_slots(self, sid: str, values: dict[str, int]) -> None:
        """Set several counters at once."""
        for name, value in values.items():
            await self.set_slot(sid, name, value)

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
        """Read group ``gid``'s record, let ``fn`` change it, write it (and ``fn``'s
        events), all under the group's lock."""
        async with self.locked(sid, gid):
            group = (await self.groups(sid, [gid])).get(gid)
            new, result, events = await fn(group)
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

    def __init__(self, ttl_s: int, limits: StoreLimits | None = None) -> None:
        super().__init__(ttl_s, limits)
        self._ledger = Ledger(self.limits)
        self._records: dict[str, SessionRecord] = {}
        self._groups: dict[str, dict[str, GroupRecord]] = {}
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
        record = self._records.get(sid)
        if record is not None:
            self._ledger.forget(record.tenant, sid)
        for table in (self._records, self._groups, self._events, self._deadlines,
                      self._expires, self._locks, self._slots):
            table.pop(sid, None)

    async def create(self, record: SessionRecord) -> None:
        self._prune()
        sid = record.id
        self._records[sid] = record.copy()
        self._groups[sid], self._events[sid], self._deadlines[sid] = {}, [], {}

    async def record(self, sid: str) -> SessionRecord | None:
        record = self._records.get(sid)
        return record.copy() if record is not None else None

    def locked(self, sid: str, gid: str | None = None
               ) -> contextlib.AbstractAsyncContextManager[None]:
        locks = self._locks.setdefault(sid, {})
        return locks.setdefault(gid, asyncio.Lock())  # type: ignore[return-value]

    async def _write(self, sid: str, record: SessionRecord | None,
                     groups: dict[str, GroupRecord], events: list[bytes]) -> None:
        if sid not in self._records:
            return
        if record is not None:
            self._records[sid] = record.copy()
        self._groups[sid].update(groups)
        self._events[sid].extend(events)

    async def groups(self, sid: str, ids: list[str] | None = None) -> dict[str, GroupRecord]:
        # the stored records themselves, not copies (a copy of every group per request
        # was most of a streaming session's CPU): callers read them, and change them only
        # inside update_group, under the group's lock
        table = self._groups.get(sid, {})
        if ids is None:
            return dict(table)
        return {gid: table[gid] for gid in ids if gid in table}

    async def events(self, sid: str, after: int = 0, limit: int | None = None
                     ) -> list[Event]:
        stored = self._events.get(sid, [])
        if limit is not None:
            return decode_page(stored[after:after + max(1, limit)], after)
        return [decode_event(seq, raw) for seq, raw in enumerate(stored[after:], start=after + 1)]

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
        return [sid for sid, r in self._records.items() if r.state in ACTIVE_STATES]

    async def open_count(self, tenant: str) -> int:
        return sum(1 for r in self._records.values() if r.tenant == tenant
                   and r.state in ACTIVE_STATES and not r.standing)

    async def finish(self, sid: str, tenant: str) -> None:
        self._expires[sid] = time.monotonic() + self.ttl_s
        self._deadlines.pop(sid, None)
        record = self._records.get(sid)
        if record is not None and not record.standing:
            for gone in self._ledger.ended(tenant, sid):
                self._forget(gone)

    async def take(self, tenant: str, sid: str, groups: int, nbytes: int
                   ) -> tuple[Refusal, int]:
        refusal, held, evicted = self._ledger.take(tenant, sid, groups, nbytes)
        for gone in evicted:
            self._forget(gone)
        return refusal, held

    async def give(self, tenant: str, sid: str, groups: int, nbytes: int) -> None:
        self._ledger.give(tenant, sid, groups, nbytes)

    def held(self) -> dict[tuple[str, str], int]:
        return self._ledger.usage()

    async def pending(self, sid: str) -> dict[str, set[str]]:
        # the groups are in this process: no decoding to avoid, a pass over them is cheap
        found = {gid: g.pending_owners() for gid, g in self._groups.get(sid, {}).items()}
        return {gid: owners for gid, owners in found.items() if owners}

    async def done_before(self, sid: str, before: float) -> list[str]:
        return [gid for gid, g in self._groups.get(sid, {}).items()
                if g.done and g.done_at is not None and g.done_at < before]

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

    async def slots(self, sid: str, names: list[str]) -> dict[str, int]:
        table = self._slots.get(sid, {})
        return {name: table.get(name, 0) for name in names}

    async def set_slots(self, sid: str, values: dict[str, int]) -> None:
        self._slots.setdefault(sid, {}).update(values)

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
