"""Many waiters on the groups of one standing session, answered by one watcher per session.

The per-sample trainer protocols hold one request per sample, hundreds at once, each waiting
for its sample's group (:mod:`rewardd.service.compat.groups`). A poll per request
(:meth:`Lifecycle.wait_group`'s way, fine for the long polls of ``GET .../groups/{id}``) would
read the store hundreds of times per tick; here every waiter of a session on this pod shares
one task that reads every waited group and the session's record once per change this pod
makes or per :data:`~rewardd.service.sessions.pod.POLL_S` (another pod's changes), and
resolves each group's one future, which all of that group's requests await.

A group's waiters get its event once it is done (on any pod), None once the session is no
longer open (expired, or lost by its store) before that, or the store's error. Only
standing sessions are waited on this way: one that is closed or closing does not come back.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from rewardd.service.sessions.pod import POLL_S, Pod
from rewardd.service.sessions.records import JsonObject, SessionPhase

T = TypeVar("T")

READ_COST_S = 1e-5
"""Seconds between the watcher's reads per group waited (at most POLL_S): one group waited
is read again at once, 8,000 at most every 80 ms."""


def settle(future: asyncio.Future[T], out: T | BaseException) -> None:
    """Resolve ``future`` with ``out`` (raise it when it is an error), unless it is done."""
    if future.done():
        return
    if isinstance(out, BaseException):
        future.set_exception(out)
    else:
        future.set_result(out)


class GroupWaiters:
    """This pod's waiters on groups, one watcher per session (see the module docstring)."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self._waited: dict[str, dict[str, asyncio.Future[JsonObject | None]]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}

    async def done(self, sid: str, gid: str, timeout: float) -> JsonObject | None:
        """Group ``gid``'s event once it is done; None if the session stopped being open
        first. ``TimeoutError`` after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        waited = self._waited.setdefault(sid, {})
        future = waited.get(gid)
        if future is None:
            future = waited[gid] = loop.create_future()
        watcher = self._watchers.get(sid)
        if watcher is None or watcher.done():
            self._watchers[sid] = loop.create_task(self._watch(sid))
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            if waited.get(gid) is future and future.done():
                waited.pop(gid, None)

    async def _watch(self, sid: str) -> None:
        """Resolve this pod's waiters of session ``sid`` as their groups complete (on any
        pod): one read of every waited group per change this pod sees or per poll."""
        waited = self._waited.setdefault(sid, {})
        store = self.pod.store
        loop = asyncio.get_running_loop()
        last = -POLL_S
        while waited:
            await self.pod.wait_change(sid, POLL_S)
            # a read costs O(groups waited), and a burst of checks is a change each: the
            # reads are spaced by their cost (8,000 groups waited and read at each of their
            # 8,000 checks was 64 M lookups, 20 s of the API's CPU; issue 28)
            gap = min(POLL_S, len(waited) * READ_COST_S) - (loop.time() - last)
            if gap > 0:
                await asyncio.sleep(gap)
            last = loop.time()
            gids = [gid for gid, f in waited.items() if not f.done()]
            for gid in [gid for gid, f in waited.items() if f.done()]:
                waited.pop(gid, None)
            if not gids:
                continue
            try:
                groups = await store.groups(sid, gids)
                record = await store.record(sid)
            except Exception as exc:  # the store is down: each waiter answers it
                for gid in gids:
                    settle(waited.pop(gid), exc)
                continue
            for gid in gids:
                group = groups.get(gid)
                if group is not None and group.done:
                    settle(waited.pop(gid), group.event)
                elif record is None or record.state != SessionPhase.OPEN:
                    settle(waited.pop(gid), None)
