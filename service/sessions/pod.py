"""This API process's share of the sessions: what one pod holds that the store does not.

Everything a session *is* lives in the store (:mod:`rewardd.service.sessions.store`), where
every pod sees it. What stays here is the pod's own: its owner id (written on the checks it
runs, so another pod can tell when they are orphaned), the check tasks it runs per session,
the events that wake its waiters when it changes a session, and the specs it has parsed. The
manager's parts (intake, checking, lifecycle, sweeper) share one :class:`Pod`, so none of
them holds state of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from typing import Any, Coroutine

from rewardd.service.eventfeed import Feeds
from rewardd.service.models import SessionSpec
from rewardd.service.runtime import Runtime
from rewardd.service.sessions.errors import SessionNotFound
from rewardd.service.sessions.records import SessionRecord
from rewardd.service.sessions.store import SessionStore
from rewardd.service.settings import Settings

POLL_S = 0.1
"""Waiters (events, long polls) re-read the store this often; this pod's own publications
wake them at once."""


def valid_id(sid: str) -> bool:
    return len(sid) == 32 and all(c in "0123456789abcdef" for c in sid)


class Pod:
    """The process-local side of the sessions (see the module docstring)."""

    def __init__(self, runtime: Runtime, store: SessionStore) -> None:
        self.runtime = runtime
        self.store = store
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.pruned: dict[str, float] = {}
        """When the sweeper last pruned each standing session (unix s)."""
        self._tasks: dict[str, set[asyncio.Task[None]]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._specs: dict[str, SessionSpec] = {}
        self.feeds: Feeds[bool | None] = Feeds(lambda: POLL_S)
        """This pod's event streams of each session, one store probe per session per tick
        (state: whether the session ended, None once it is gone)."""

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    # ---- the session's checks -------------------------------------------------------------

    def spawn(self, sid: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (checks of session ``sid``) as a task of this pod."""
        task = asyncio.get_running_loop().create_task(work)
        tasks = self._tasks.setdefault(sid, set())
        tasks.add(task)

        def forget(done: asyncio.Task[None]) -> None:
            tasks.discard(done)
            if not tasks and self._tasks.get(sid) is tasks:
                del self._tasks[sid]

        task.add_done_callback(forget)

    def cancel(self, sid: str) -> None:
        """Stop this pod's checks of session ``sid`` (it ended)."""
        for task in list(self._tasks.get(sid, ())):
            task.cancel()

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every check this pod runs (to stop them)."""
        return [task for tasks in self._tasks.values() for task in tasks]

    # ---- records --------------------------------------------------------------------------

    async def own(self, tenant: str, sid: str) -> SessionRecord:
        """The session's record if ``tenant`` has it; else 404 (another tenant's sessions
        do not exist for it)."""
        record = await self.store.record(sid) if valid_id(sid) else None
        if record is None or record.tenant != tenant:
            raise SessionNotFound(f"no session {sid!r}")
        return record

    def spec(self, record: SessionRecord) -> SessionSpec:
        """The session's spec, parsed once per pod."""
        spec = self._specs.get(record.id)
        if spec is None:
            spec = self._specs[record.id] = SessionSpec.model_validate(record.spec)
        return spec

    def remember(self, sid: str, spec: SessionSpec) -> None:
        self._specs[sid] = spec

    def forget(self, sid: str) -> None:
        """The session ended: drop what this pod kept of it."""
        self._specs.pop(sid, None)
        self.pruned.pop(sid, None)

    # ---- waking waiters -------------------------------------------------------------------

    def notify(self, sid: str) -> None:
        """This pod changed the session: wake its waiters here at once."""
        self.feeds.poke(sid)
        event = self._changed.pop(sid, None)
        if event is not None:
            event.set()

    async def wait_change(self, sid: str, timeout: float) -> None:
        """Return when this pod changes the session, or after ``timeout`` (another pod's
        changes are seen by reading the store again)."""
        event = self._changed.setdefault(sid, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
