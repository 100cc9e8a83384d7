"""The session manager: rollouts in, checks out to the executors, groups published on
completion, the batch computed at close. One per API process (the app's ``Services.sessions``).

:class:`SessionManager` is the facade the routes, the trainer protocols and the tests use
(the interface is in the package docstring); the work is in its parts, one job each, over
the pod's shared state (:class:`~rewardd.service.sessions.pod.Pod`) and the store:

* :mod:`~rewardd.service.sessions.intake`: open (and standing) sessions, take rollouts in;
* :mod:`~rewardd.service.sessions.checking`: run checks, settle them, complete groups;
* :mod:`~rewardd.service.sessions.lifecycle`: wait on groups, close, cancel, state, events;
* :mod:`~rewardd.service.sessions.sweep`: timeouts, expiry, a dead pod's work;
* :mod:`~rewardd.service.sessions.waiters`: many waiters on a standing session's groups.

A session's state is typed records (:mod:`~rewardd.service.sessions.records`) in the store
(:mod:`~rewardd.service.sessions.store`): a group's record is the whole truth about it, and
every transition is one read-modify-write of it under the group's lock.

Errors: ``SessionNotFound`` (404), ``SessionConflict`` (409), ``SessionBusy`` (429),
``RequestInvalid`` (422 naming the field).
"""

from __future__ import annotations

from typing import AsyncIterator, Mapping

from rewardd.service.events import HEARTBEAT_S, Event
from rewardd.service.models import SessionSpec
from rewardd.service.runtime import Runtime
from rewardd.service.sessions.checking import Checker, GroupRef
from rewardd.service.sessions.errors import SessionNotFound
from rewardd.service.sessions.intake import GroupsIn, Intake, parse, rollouts_of
from rewardd.service.sessions.lifecycle import Lifecycle
from rewardd.service.sessions.pod import Pod
from rewardd.service.sessions.records import GroupReason, JsonObject
from rewardd.service.sessions.store import SessionStore
from rewardd.service.sessions.sweep import Sweeper
from rewardd.service.sessions.waiters import GroupWaiters
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant


def _name(tenant: Tenant | str) -> str:
    return tenant if isinstance(tenant, str) else tenant.name


class SessionManager:
    """Streaming sessions of this API process; see the package docstring for the interface.
    ``tenant`` is a :class:`Tenant` or a tenant name everywhere."""

    def __init__(self, runtime: Runtime, store: SessionStore) -> None:
        self.pod = Pod(runtime, store)
        self.checker = Checker(self.pod)
        self.intake = Intake(self.pod, self.checker)
        self.lifecycle = Lifecycle(self.pod, self.checker)
        self.sweeper = Sweeper(self.pod, self.checker, self.lifecycle)
        self.waiters = GroupWaiters(self.pod)

    @property
    def runtime(self) -> Runtime:
        return self.pod.runtime

    @property
    def store(self) -> SessionStore:
        return self.pod.store

    @property
    def owner(self) -> str:
        """This pod's id on the checks it runs (``host:pid:nonce``)."""
        return self.pod.owner

    @property
    def settings(self) -> Settings:
        return self.pod.settings

    async def start(self) -> None:
        await self.sweeper.start()

    async def stop(self) -> None:
        """Stop the sweeper and this pod's checks (a durable store leaves them to others)."""
        await self.sweeper.stop()

    async def sweep(self, orphans: bool = False) -> None:
        """Group timeouts, idle sessions, closings left by a dead pod, orphaned checks."""
        await self.sweeper.sweep(orphans)

    async def open(self, tenant: Tenant | str, spec: SessionSpec | Mapping[str, object]) -> str:
        """A new session of ``tenant``; its id. 422 for a bad spec, 429 at the tenant's
        limit of open sessions."""
        if not isinstance(spec, SessionSpec):
            spec = parse(SessionSpec, spec)
        return await self.intake.open(_name(tenant), spec)

    async def add(self, tenant: Tenant | str, session_id: str, groups: GroupsIn
                  ) -> dict[str, int]:
        """Take rollouts (the /v1/score ``groups`` shape, partial); their checks start now.
        ``{"accepted", "duplicates"}``. 404 unknown session, 409 a session or group that is
        no longer open or a resent rollout with other content, 422 bad input, 429 limits."""
        body = rollouts_of(groups)
        taken = await self.add_rollouts(tenant, session_id, body)
        total = sum(len(g.rollouts) for g in body.groups)
        return {"accepted": len(taken), "duplicates": total - len(taken)}

    async def add_rollouts(self, tenant: Tenant | str, session_id: str, groups: GroupsIn
                           ) -> set[tuple[str, str]]:
        """:meth:`add`, answering which rollouts it took: (group id, rollout id) of each
        (a resent one is not; nor one whose group completed while it was being stored)."""
        return await self.intake.add_rollouts(_name(tenant), session_id, groups)

    async def close_group(self, tenant: Tenant | str, session_id: str,
                          group_id: str) -> JsonObject | None:
        """Complete a group from what arrived (once those checks settle); its event when it
        is complete already, else None. 404 for a group never seen."""
        record = await self.pod.own(_name(tenant), session_id)
        ref = GroupRef(session_id, record.tenant, self.pod.spec(record), group_id)
        known, event = await self.checker.close_group(ref, GroupReason.CLOSED)
        if not known:
            raise SessionNotFound(f"no group {group_id!r} in session {session_id}")
        return event

    async def wait_group(self, tenant: Tenant | str, session_id: str, group_id: str,
                         wait_s: float) -> JsonObject | None:
        """The group's object once complete (with final advantages once the session closed),
        waiting up to ``wait_s``; None if still incomplete (or not seen) by then."""
        return await self.lifecycle.wait_group(_name(tenant), session_id, group_id, wait_s)

    async def owned(self, tenant: Tenant | str, session_id: str) -> None:
        """Nothing if ``tenant`` has this session; else 404."""
        await self.pod.own(_name(tenant), session_id)

    async def known_group(self, session_id: str, group_id: str) -> bool:
        return bool(await self.store.groups(session_id, [group_id]))

    async def close(self, tenant: Tenant | str, session_id: str) -> JsonObject:
        """End the step: open groups complete from what arrived, then the batch's numbers
        (batch-level estimators too). The ``closed`` event's data: ``{"session_id",
        "state", "error", "summary", "result"}`` (``result``: the /v1/score response)."""
        return await self.lifecycle.close(_name(tenant), session_id)

    async def cancel(self, tenant: Tenant | str, session_id: str) -> JsonObject:
        """Drop the session (its checks stop); its state afterwards."""
        return await self.lifecycle.cancel(_name(tenant), session_id)

    async def status(self, tenant: Tenant | str, session_id: str) -> JsonObject:
        return await self.lifecycle.status(_name(tenant), session_id)

    def events(self, tenant: Tenant | str, session_id: str, after: int,
               heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[Event | None]:
        """Stored events after ``after`` as they come (``None``: a heartbeat after
        ``heartbeat_s`` of silence); ends after the ``closed`` event."""
        return self.lifecycle.events(_name(tenant), session_id, after, heartbeat_s)

    async def last_event(self, session_id: str) -> int:
        """For ``Last-Event-ID`` checks (:func:`rewardd.service.events.resume_after`)."""
        return await self.store.last_event(session_id)

    async def standing(self, tenant: Tenant | str, session_id: str,
                       spec: SessionSpec) -> None:
        """Make sure the server's own session ``session_id`` (32 hex digits the caller
        derives, the same on every pod) is open with ``spec``: a *standing* session, for
        routes whose clients never open or close one (the per-sample trainer protocols).

        It never closes (each group's numbers are final when it completes, computed as
        /v1/score on that group alone), publishes no events (its callers wait on their
        groups), does not count against the tenant's open sessions, forgets completed
        groups after :data:`~rewardd.service.sessions.sweep.STANDING_KEEP_S`, and like any
        session expires when idle; the next call makes it anew."""
        await self.intake.standing(_name(tenant), session_id, spec)

    async def group_done(self, session_id: str, group_id: str, timeout: float
                         ) -> JsonObject | None:
        """A standing session's group's event once it is done; None if the session stops
        being open first; ``TimeoutError`` after ``timeout``. Every waiter of this pod on a
        session shares one store read per tick (:mod:`~rewardd.service.sessions.waiters`):
        the trainer protocols hold hundreds at once."""
        return await self.waiters.done(session_id, group_id, timeout)

    async def changed(self, session_id: str, timeout: float) -> None:
        """Return when this pod changes the session, or after ``timeout`` (another pod's
        changes are seen by reading the store again)."""
        await self.pod.wait_change(session_id, timeout)
