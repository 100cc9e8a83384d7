"""The session manager: rollouts in, checks out to the executors, groups published on
completion, the batch computed at close. One per API process (``app.state.sessions``).

A group's document (:mod:`rewardd.service.sessions.store`) is the whole truth about it::

    {"group_id", "index", "first" (unix s), "prompt", "reference", "data_source",
     "state": "open" | "closing" | "done", "reason": None | "full" | "closed" | "timeout",
     "failed", "whole_owner", "whole_done", "event" (the published group object),
     "rollouts": [{"id", "digest", "body", "owner", "checked", "cells": {name: outcome}}]}

A rollout's per-sample components are checked on arrival (one call per arriving part of a
group and component, under the session's fair-queue flow); group-level verifiers (arenas)
run once the group is assembled (``group_size`` rollouts, or closed, or timed out). A group
is done when it is assembled and every cell is settled; the transition and its ``group``
event are one write under the group's lock, so an event is never lost nor sent twice.

Pod death (Redis store): each pod beats every :data:`SWEEP_EVERY_S`; a rollout (or a
group-level call) whose owner stopped beating is claimed, under the lock, by the next pod
that sweeps, and checked again (checks are idempotent). Deadlines of group timeouts are
in the store, so any pod fires them; a session left ``closing`` by a dead pod is finished by
the next sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from typing import Any, AsyncIterator, Sequence

import orjson
from fastapi import HTTPException
from pydantic import ValidationError

from rewardd.advantages.checks import resolved_num_tokens
from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service import pipeline
from rewardd.service.cancellation import stop_if_cancelled
from rewardd.service.jobs.store import Event, encode_event
from rewardd.service.limits import TenantBusy
from rewardd.service.models import (Group, RewardSpec, Rollout, ScoreRequest, SessionRollouts,
                                    SessionSpec)
from rewardd.service.sessions.locality import group_local
from rewardd.service.sessions.results import group_event, session_result
from rewardd.service.sessions.store import SessionStore
from rewardd.service.tenancy import Tenant
from rewardd.verifiers.base import FailureKind, Outcome, Sample
from rewardd.workers import fairness
from rewardd.workers.executor import VerifyCall, keeps_group_whole

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 0.25
"""Group timeouts, idle sessions and (Redis) orphaned checks are looked for this often."""
POLL_S = 0.1
"""Waiters (events, long polls) re-read the store this often; this pod's own publications
wake them at once."""
HEARTBEAT_S = 15.0
STANDING_KEEP_S = 300.0
"""A standing session's completed group is kept this long (see :meth:`SessionManager.standing`)."""
OPEN, CLOSING, CLOSED, CANCELLED, EXPIRED = "open", "closing", "closed", "cancelled", "expired"
ENDED = frozenset({CLOSED, CANCELLED, EXPIRED})


class SessionNotFound(HTTPException):
    def __init__(self, what: str) -> None:
        super().__init__(404, what)


class SessionConflict(HTTPException):
    def __init__(self, what: str) -> None:
        super().__init__(409, what)


class SessionBusy(TenantBusy):
    """A tenant at its limit of open sessions or rollouts in flight (429)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        Exception.__init__(self, message)
        self.retry_after_s = retry_after_s


def _name(tenant: Tenant | str) -> str:
    return tenant if isinstance(tenant, str) else tenant.name


def _digest(rollout: Rollout) -> str:
    data = orjson.dumps(rollout.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()


def _valid_id(sid: str) -> bool:
    return len(sid) == 32 and all(c in "0123456789abcdef" for c in sid)


def check_spec(spec: SessionSpec, settings: Any) -> None:
    """The /v1/score checks of the spec's rewards and advantage (422 naming the field), run
    on a probe group: errors about the probe's own rollouts are not the spec's."""
    probe = Group(group_id="probe", rollouts=[
        Rollout(rollout_id=str(i), completion="", num_tokens=1) for i in range(2)])
    req = ScoreRequest(run_id=spec.run_id, step=spec.step, evaluation=spec.evaluation,
                       groups=[probe], rewards=spec.rewards, advantage=spec.advantage)
    try:
        pipeline.check_request(req, settings)
    except RequestInvalid as exc:
        own = [e for e in exc.errors if tuple(e["loc"][:2]) != ("body", "groups")]
        if own:
            raise RequestInvalid(own) from None


class SessionManager:
    """Streaming sessions of this API process; see the package docstring for the interface."""

    def __init__(self, state: Any, store: SessionStore) -> None:
        self.state = state
        self.store = store
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._tasks: dict[str, set[asyncio.Task]] = {}
        self._pruned: dict[str, float] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._specs: dict[str, SessionSpec] = {}
        self._sweeper: asyncio.Task | None = None

    @property
    def settings(self) -> Any:
        return self.state.settings

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop(self) -> None:
        """Stop the sweeper and this pod's checks (a durable store leaves them to others)."""
        tasks = [t for ts in self._tasks.values() for t in ts]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
            self._sweeper = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # ---- the interface --------------------------------------------------------------------

    async def open(self, tenant: Tenant | str, spec: SessionSpec | dict[str, Any]) -> str:
        """A new session of ``tenant``; its id. 422 for a bad spec, 429 at the tenant's
        limit of open sessions."""
        if not isinstance(spec, SessionSpec):
            spec = _parse(SessionSpec, spec)
        await asyncio.to_thread(check_spec, spec, self.settings)
        name = _name(tenant)
        limit = self.settings.session_max_open
        if await self.store.open_count(name) >= limit:
            raise SessionBusy(f"tenant {name!r} already has {limit} sessions open (its limit, "
                              "REWARDD_SESSION_MAX_OPEN); close one, or retry later",
                              self.settings.retry_after_s)
        sid, now = uuid.uuid4().hex, time.time()
        await self.store.create({"id": sid, "tenant": name, "state": OPEN,
                                 "spec": spec.model_dump(mode="json", exclude_unset=True),
                                 "created": now, "touched": now, "error": None})
        self._specs[sid] = spec
        return sid

    async def add(self, tenant: Tenant | str, session_id: str,
                  groups: Sequence[dict[str, Any]] | SessionRollouts) -> dict[str, int]:
        """Take rollouts (the /v1/score ``groups`` shape, partial); their checks start now.
        ``{"accepted", "duplicates"}``. 404 unknown session, 409 a session or group that is
        no longer open or a resent rollout with other content, 422 bad input, 429 limits."""
        body = groups if isinstance(groups, SessionRollouts) else _parse(
            SessionRollouts, {"groups": list(groups)})
        taken = await self.add_rollouts(tenant, session_id, body)
        total = sum(len(g.rollouts) for g in body.groups)
        return {"accepted": len(taken), "duplicates": total - len(taken)}

    async def add_rollouts(self, tenant: Tenant | str, session_id: str,
                           groups: Sequence[dict[str, Any]] | SessionRollouts
                           ) -> set[tuple[str, str]]:
        """:meth:`add`, answering which rollouts it took: (group id, rollout id) of each
        (a resent one is not; nor one whose group completed while it was being stored)."""
        name = _name(tenant)
        record = await self._own(name, session_id)
        if record["state"] != OPEN:
            raise SessionConflict(f"session {session_id} is {record['state']}: it takes no "
                                  "more rollouts")
        body = groups if isinstance(groups, SessionRollouts) else _parse(
            SessionRollouts, {"groups": list(groups)})
        spec = self._spec(record)
        known = await self.store.groups(session_id, [g.group_id for g in body.groups])
        await asyncio.to_thread(self._check_rollouts, spec, body, known)
        plan = self._plan(spec, body, known)
        fresh = sum(len(new) for _, new in plan)
        limit = self.settings.session_max_inflight
        if fresh and not await self.store.reserve(name, self.owner, fresh, limit):
            raise SessionBusy(f"tenant {name!r} would have more than {limit} rollouts being "
                              "checked (REWARDD_SESSION_MAX_INFLIGHT, over every API pod); "
                              "retry once some groups completed", self.settings.retry_after_s)
        new_groups = sum(1 for g, _ in plan if g.group_id not in known)
        accepted: set[tuple[str, str]] = set()
        try:
            # first-sight order from a counter, and the idle clock moved at most once a
            # second: no session-wide lock per request (hundreds of per-sample requests
            # queued on it)
            index = await self.store.bump(session_id, GROUPS_SEEN, new_groups) - new_groups
            if time.time() - record["touched"] >= TOUCH_EVERY_S:
                await self.store.update_record(session_id, _touch)
            for group, new in plan:
                if not new:
                    continue
                if group.group_id not in known:
                    index += 1
                taken, full = await self._append(session_id, spec, group, new, index - 1)
                accepted.update((group.group_id, r["id"]) for r in taken)
                if taken:
                    self._spawn(session_id, self._check(session_id, name, spec,
                                                        group.group_id, taken, whole=False,
                                                        urgent=full))
        finally:
            if fresh > len(accepted):  # reserved for rollouts that were not taken
                await self.store.release(name, self.owner, fresh - len(accepted))
        return accepted

    async def close_group(self, tenant: Tenant | str, session_id: str,
                          group_id: str) -> dict[str, Any] | None:
        """Complete a group from what arrived (once those checks settle); its event when it
        is complete already, else None. 404 for a group never seen."""
        record = await self._own(_name(tenant), session_id)
        spec = self._spec(record)
        done = await self._close_group(session_id, spec, group_id, "closed")
        if done is _MISSING:
            raise SessionNotFound(f"no group {group_id!r} in session {session_id}")
        return done

    async def wait_group(self, tenant: Tenant | str, session_id: str, group_id: str,
                         wait_s: float) -> dict[str, Any] | None:
        """The group's object once complete (with final advantages once the session closed),
        waiting up to ``wait_s``; None if still incomplete (or not seen) by then."""
        name = _name(tenant)
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            record = await self._own(name, session_id)
            doc = (await self.store.groups(session_id, [group_id])).get(group_id)
            if doc is not None and doc["state"] == "done":
                if record["state"] == CLOSED:
                    return await self._final_group(session_id, doc)
                return doc["event"]
            if record["state"] in ENDED and record["state"] != CLOSED:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await self._wait_change(session_id, min(left, POLL_S))

    async def owned(self, tenant: Tenant | str, session_id: str) -> None:
        """Nothing if ``tenant`` has this session; else 404."""
        await self._own(_name(tenant), session_id)

    async def known_group(self, session_id: str, group_id: str) -> bool:
        return bool(await self.store.groups(session_id, [group_id]))

    async def close(self, tenant: Tenant | str, session_id: str) -> dict[str, Any]:
        """End the step: open groups complete from what arrived, then the batch's numbers
        (batch-level estimators too). The ``closed`` event's data: ``{"session_id",
        "state", "error", "summary", "result"}`` (``result``: the /v1/score response)."""
        name = _name(tenant)
        record = await self._own(name, session_id)
        if record["state"] == OPEN:
            async def closing(rec: dict[str, Any]) -> tuple[bool, None, list[bytes]]:
                changed = rec["state"] == OPEN
                if changed:
                    rec["state"], rec["touched"] = CLOSING, time.time()
                return changed, None, []

            await self.store.update_record(session_id, closing)
        while True:
            ended = await self._ended_payload(session_id)
            if ended is not None:
                return ended
            if await self._finish_closing(session_id):
                continue
            await self._wait_change(session_id, POLL_S)

    async def cancel(self, tenant: Tenant | str, session_id: str) -> dict[str, Any]:
        """Drop the session (its checks stop); its state afterwards."""
        await self._own(_name(tenant), session_id)
        await self._end(session_id, CANCELLED, None)
        return await self.status(tenant, session_id)

    async def status(self, tenant: Tenant | str, session_id: str) -> dict[str, Any]:
        record = await self._own(_name(tenant), session_id)
        docs = await self.store.groups(session_id)
        from rewardd.service.jobs.store import iso

        return {"session_id": session_id, "state": record["state"], "groups": len(docs),
                "completed_groups": sum(1 for d in docs.values() if d["state"] == "done"),
                "rollouts": sum(len(d["rollouts"]) for d in docs.values()),
                "created_at": iso(record["created"]), "error": record.get("error")}

    async def events(self, tenant: Tenant | str, session_id: str, after: int,
                     heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[Event | None]:
        """Stored events after ``after`` as they come (``None``: a heartbeat after
        ``heartbeat_s`` of silence); ends after the ``closed`` event."""
        await self._own(_name(tenant), session_id)
        loop = asyncio.get_running_loop()
        quiet = loop.time()
        while True:
            record = await self.store.record(session_id)
            for event in await self.store.events(session_id, after):
                yield event
                after, quiet = event.seq, loop.time()
                if event.kind == "closed":
                    return
            if record is None or record["state"] in ENDED:
                return
            if loop.time() - quiet >= heartbeat_s:
                yield None
                quiet = loop.time()
            await self._wait_change(session_id, POLL_S)

    async def last_event(self, session_id: str) -> int:
        """For ``Last-Event-ID`` checks (:func:`rewardd.service.api.jobs.resume_after`)."""
        return await self.store.last_event(session_id)

    async def standing(self, tenant: Tenant | str, session_id: str,
                       spec: SessionSpec) -> None:
        """Make sure the server's own session ``session_id`` (32 hex digits the caller
        derives, the same on every pod) is open with ``spec``: a *standing* session, for
        routes whose clients never open or close one (the per-sample trainer protocols).

        It never closes (each group's numbers are final when it completes, computed as
        /v1/score on that group alone), publishes no events (its callers wait on their
        groups), does not count against the tenant's open sessions, forgets completed
        groups after :data:`STANDING_KEEP_S`, and like any session expires when idle; the
        next call makes it anew."""
        record = await self.store.record(session_id)
        if record is not None and record["state"] == OPEN:
            return
        async with self.store.locked(session_id):
            record = await self.store.record(session_id)
            if record is not None and record["state"] == OPEN:
                return
            if record is not None:  # an expired one: its groups are gone for good
                await self.store.purge(session_id)
            now = time.time()
            await self.store.create({"id": session_id, "tenant": _name(tenant), "state": OPEN,
                                     "standing": True,
                                     "spec": spec.model_dump(mode="json", exclude_unset=True),
                                     "created": now, "touched": now, "error": None})
            self._specs[session_id] = spec

    # ---- adding ---------------------------------------------------------------------------

    def _check_rollouts(self, spec: SessionSpec, body: SessionRollouts,
                        known: dict[str, dict[str, Any]]) -> None:
        """/v1/score's validation of the request's groups as the batch will hold them."""
        groups = []
        for g in body.groups:
            doc = known.get(g.group_id, {})
            groups.append(Group.model_construct(
                group_id=g.group_id, rollouts=g.rollouts, data_source=g.data_source,
                prompt=g.prompt if g.prompt is not None else doc.get("prompt", ""),
                reference=g.reference if g.reference is not None else doc.get("reference", {})))
        req = ScoreRequest.model_construct(run_id=spec.run_id, step=spec.step,
                                           evaluation=spec.evaluation, groups=groups,
                                           rewards=spec.rewards, advantage=spec.advantage)
        try:
            pipeline.check_request(req, self.settings)
        except RequestInvalid as exc:
            # parts of groups differ in size by nature; a profile's equal-size rule is the
            # session's group_size (checked when the session opened)
            kept = [e for e in exc.errors if tuple(e["loc"]) != PROFILE_LOC]
            if kept:
                raise RequestInvalid(kept) from None

    def _plan(self, spec: SessionSpec, body: SessionRollouts,
              known: dict[str, dict[str, Any]]) -> list[tuple[Any, list[tuple[Rollout, str]]]]:
        """Per group, its new rollouts with their digests; 409 / 422 before anything is
        stored when a resend conflicts or a group would exceed its size."""
        plan = []
        for gi, g in enumerate(body.groups):
            doc = known.get(g.group_id)
            seen = {r["id"]: r["digest"] for r in doc["rollouts"]} if doc else {}
            if doc is not None:
                for field in ("prompt", "reference"):
                    sent = getattr(g, field)
                    if sent is not None and sent != doc[field]:
                        raise SessionConflict(f"group {g.group_id!r}: {field} differs from "
                                              "the one it was first sent with")
            new = []
            for rollout in g.rollouts:
                digest = _digest(rollout)
                if rollout.rollout_id in seen:
                    if seen[rollout.rollout_id] != digest:
                        raise SessionConflict(
                            f"rollout {rollout.rollout_id!r} of group {g.group_id!r} was "
                            "already received with different content")
                    continue
                new.append((rollout, digest))
            if new and doc is not None and doc["state"] != "open":
                raise SessionConflict(f"group {g.group_id!r} is complete ({doc['reason']}): "
                                      "it takes no more rollouts")
            if len(seen) + len(new) > spec.group_size:
                raise RequestInvalid([error(
                    ("body", "groups", gi, "rollouts"),
                    f"group {g.group_id!r} would have {len(seen) + len(new)} rollouts; the "
                    f"session's group_size is {spec.group_size}")])
            plan.append((g, new))
        return plan

    async def _append(self, sid: str, spec: SessionSpec, group: Any,
                      new: list[tuple[Rollout, str]], index: int
                      ) -> tuple[list[dict[str, Any]], bool]:
        """Store the new rollouts; (those taken, whether the group now has all of them)."""
        timeout = spec.group_timeout_s

        async def put(doc: dict[str, Any] | None
                      ) -> tuple[dict[str, Any] | None, tuple[list[dict[str, Any]], bool],
                                 list[bytes]]:
            if doc is None:
                doc = {"group_id": group.group_id, "index": index, "first": time.time(),
                       "prompt": group.prompt or "", "reference": group.reference or {},
                       "data_source": group.data_source, "state": "open", "reason": None,
                       "failed": False, "whole_owner": None, "whole_done": False,
                       "event": None, "rollouts": []}
                if timeout is not None:
                    await self.store.set_deadline(sid, group.group_id, doc["first"] + timeout)
            if doc["state"] != "open":  # completed meanwhile (a race with a close)
                return None, ([], False), []
            seen = {r["id"] for r in doc["rollouts"]}
            taken = []
            for rollout, digest in new:
                if rollout.rollout_id in seen or len(doc["rollouts"]) >= spec.group_size:
                    continue
                entry = {"id": rollout.rollout_id, "digest": digest, "owner": self.owner,
                         "checked": False, "cells": {},
                         "body": rollout.model_dump(mode="json", exclude_unset=True)}
                doc["rollouts"].append(entry)
                taken.append(entry)
            return doc, (taken, len(doc["rollouts"]) >= spec.group_size), []

        return await self.store.update_group(sid, group.group_id, put)

    # ---- checking -------------------------------------------------------------------------

    def _spawn(self, sid: str, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks = self._tasks.setdefault(sid, set())
        tasks.add(task)

        def forget(done: asyncio.Task) -> None:
            tasks.discard(done)
            if not tasks and self._tasks.get(sid) is tasks:
                del self._tasks[sid]

        task.add_done_callback(forget)

    async def _check(self, sid: str, tenant: str, spec: SessionSpec, gid: str,
                     rollouts: list[dict[str, Any]], whole: bool,
                     counted: bool = True, urgent: bool = False) -> None:
        """Run the per-sample (or, ``whole``, the group-level) components over ``rollouts``
        and settle their cells. ``urgent``: these checks are all their group still waits
        for (it is whole), so a group's event waits on them alone."""
        try:
            specs = [s for s in spec.rewards if keeps_group_whole(s.verifier) == whole]
            cells: dict[str, dict[str, Any]] = {r["id"]: {} for r in rollouts}
            if specs:
                doc = (await self.store.groups(sid, [gid])).get(gid)
                if doc is None:
                    return
                try:
                    cells = await self._verify(sid, tenant, spec, specs, doc, rollouts,
                                               whole, urgent or whole)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the executor broke: typed cells, never a hang
                    log.exception("session %s: checks of group %r could not run", sid, gid)
                    failed = Outcome.failure(FailureKind.unavailable, "the check could not "
                                             f"run: {type(exc).__name__}: {exc}").to_dict()
                    cells = {r["id"]: {s.name: failed for s in specs} for r in rollouts}
            await self._settle(sid, spec, gid, cells, whole)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: checks of group %r failed", sid, gid)
        finally:
            if counted and not whole:
                with contextlib.suppress(Exception):  # a dead store: its counts go too
                    await self.store.release(tenant, self.owner, len(rollouts))

    async def _verify(self, sid: str, tenant: str, spec: SessionSpec,
                      specs: list[RewardSpec], doc: dict[str, Any],
                      rollouts: list[dict[str, Any]], whole: bool,
                      urgent: bool) -> dict[str, dict[str, Any]]:
        samples = []
        for r in rollouts:
            rollout = Rollout.model_validate(r["body"])
            samples.append(Sample(completion=rollout.completion or "", prompt=doc["prompt"],
                                  num_tokens=resolved_num_tokens(rollout)))
        context = pipeline.BatchContext(spec.run_id, spec.step, spec.evaluation)
        calls = [VerifyCall(s.verifier, tuple(samples), doc["reference"], s.params,
                            pipeline.call_timeout(s.timeout_s, self.settings),
                            context.for_group(doc["group_id"]) if whole else None)
                 for s in specs]
        # the session is one flow of the fair queue; the checks that complete a group go first
        # within its share, taking their group's waiting checks along (fairness.flow)
        with fairness.flow(tenant, sid, urgent=urgent, group=doc["group_id"]):
            results = await pipeline.run_calls(calls, self.state.executor)
        return {r["id"]: {s.name: results[k].items[i].outcome.to_dict()
                          for k, s in enumerate(specs)} for i, r in enumerate(rollouts)}

    async def _settle(self, sid: str, spec: SessionSpec, gid: str,
                      cells: dict[str, dict[str, Any]], whole: bool) -> None:
        async def settle(doc: dict[str, Any] | None
                         ) -> tuple[dict[str, Any] | None, bool, list[bytes]]:
            if doc is None or doc["state"] == "done":
                return None, False, []
            for r in doc["rollouts"]:
                if r["id"] in cells:
                    r["cells"].update(cells[r["id"]])
                    r["checked"] = r["checked"] or not whole
            if whole:
                doc["whole_done"] = True
            launch, events = await self._advance(sid, spec, doc)
            return doc, launch, events

        launch = await self.store.update_group(sid, gid, settle)
        self._after(sid, spec, gid, launch)

    def _after(self, sid: str, spec: SessionSpec, gid: str, launch: Any) -> None:
        """Wake this pod's waiters; start the group-level checks an update asked for."""
        self._notify(sid)
        if launch:
            self._spawn(sid, self._check_whole(sid, spec, gid))

    async def _check_whole(self, sid: str, spec: SessionSpec, gid: str) -> None:
        doc = (await self.store.groups(sid, [gid])).get(gid)
        record = await self.store.record(sid)
        if doc is not None and record is not None:
            await self._check(sid, record["tenant"], spec, gid, doc["rollouts"], whole=True)

    async def _advance(self, sid: str, spec: SessionSpec, doc: dict[str, Any]
                       ) -> tuple[bool, list[bytes]]:
        """Under the lock: start the group-level checks once assembled; complete the group
        once every cell settled. (launch group-level checks?, events to publish)."""
        if len(doc["rollouts"]) < spec.group_size and doc["state"] != "closing":
            return False, []
        whole = any(keeps_group_whole(s.verifier) for s in spec.rewards)
        launch = whole and doc["whole_owner"] is None
        if launch:
            doc["whole_owner"] = self.owner
        if all(r["checked"] for r in doc["rollouts"]) and (not whole or doc["whole_done"]):
            doc["reason"] = doc["reason"] or "full"
            return launch, await self._complete(sid, spec, doc)
        return launch, []

    async def _complete(self, sid: str, spec: SessionSpec, doc: dict[str, Any]) -> list[bytes]:
        record = await self.store.record(sid)
        standing = bool(record and record.get("standing"))
        # a standing session never closes: each group is a whole batch of its own, with the
        # tenant's run state (as /v1/score on that one group)
        runs = self.state.runs.for_tenant(record["tenant"]) if standing and record else None
        event = await asyncio.to_thread(group_event, spec, doc,
                                        standing or group_local(spec.advantage), runs)
        if spec.group_timeout_s is not None:
            await self.store.set_deadline(sid, doc["group_id"], None)
        # state and event together, with no await between: the memory store's readers see
        # the live document
        doc["state"], doc["event"], doc["done_at"] = "done", event, time.time()
        if record is None or record["state"] in ENDED or standing:
            return []  # a standing session's waiters read the group, not events
        return [encode_event("group", doc["event"])]

    async def _close_group(self, sid: str, spec: SessionSpec, gid: str, reason: str) -> Any:
        fail = reason == "timeout" and spec.on_group_timeout == "fail"

        async def shut(doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, Any,
                                                             list[bytes]]:
            if doc is None:
                return None, (_MISSING, False), []
            if doc["state"] == "done":
                return None, (doc["event"], False), []
            if doc["state"] == "closing":
                return None, (None, False), []
            doc["reason"] = reason
            if fail:
                doc["failed"] = True
                events = await self._complete(sid, spec, doc)
                return doc, (doc["event"], False), events
            doc["state"] = "closing"
            launch, events = await self._advance(sid, spec, doc)
            return doc, (doc["event"], launch), events

        event, launch = await self.store.update_group(sid, gid, shut)
        self._after(sid, spec, gid, launch)
        return event

    # ---- ending ---------------------------------------------------------------------------

    async def _ended_payload(self, sid: str) -> dict[str, Any] | None:
        record = await self.store.record(sid)
        if record is None:
            raise SessionNotFound(f"session {sid} expired")
        if record["state"] not in ENDED:
            return None
        last = await self.store.last_event(sid)
        for event in await self.store.events(sid, max(0, last - 1)):
            if event.kind == "closed":
                return orjson.loads(event.data)
        return {"session_id": sid, "state": record["state"], "error": record.get("error"),
                "summary": None, "result": None}

    async def _finish_closing(self, sid: str) -> bool:
        """Close every open group of a closing session; once all are done, compute the
        batch and publish ``closed`` (whoever gets the lock first; the others see it).
        True once the session is closed."""
        record = await self.store.record(sid)
        if record is None or record["state"] != CLOSING:
            return record is not None and record["state"] in ENDED
        spec = self._spec(record)
        docs = await self.store.groups(sid)
        for gid, doc in docs.items():
            if doc["state"] == "open":
                await self._close_group(sid, spec, gid, "closed")
        if any(doc["state"] != "done" for doc in (await self.store.groups(sid)).values()):
            return False
        runs = self.state.runs.for_tenant(record["tenant"])

        async def finish(rec: dict[str, Any]) -> tuple[bool, bool, list[bytes]]:
            if rec["state"] != CLOSING:
                return False, False, []
            final = await self.store.groups(sid)
            if any(doc["state"] != "done" for doc in final.values()):
                return False, False, []
            result = await asyncio.to_thread(session_result, spec, list(final.values()), runs)
            rec["state"], rec["touched"] = CLOSED, time.time()
            payload = {"session_id": sid, "state": CLOSED, "error": None,
                       "summary": result["summary"], "result": result}
            return True, True, [encode_event("closed", payload)]

        if await self.store.update_record(sid, finish):
            await self.store.finish(sid, record["tenant"])
            self._specs.pop(sid, None)
            self._pruned.pop(sid, None)
            self._notify(sid)
        return True

    async def _end(self, sid: str, state: str, reason: str | None) -> None:
        async def end(rec: dict[str, Any]) -> tuple[bool, bool, list[bytes]]:
            if rec["state"] in ENDED:
                return False, False, []
            rec["state"], rec["error"] = state, reason
            payload = {"session_id": sid, "state": state, "error": reason, "summary": None,
                       "result": None}
            return True, True, [encode_event("closed", payload)]

        record = await self.store.record(sid)
        if record is not None and await self.store.update_record(sid, end):
            await self.store.finish(sid, record["tenant"])
            self._specs.pop(sid, None)
            self._pruned.pop(sid, None)
            for task in list(self._tasks.get(sid, ())):
                task.cancel()
            self._notify(sid)

    async def _final_group(self, sid: str, doc: dict[str, Any]) -> dict[str, Any]:
        ended = await self._ended_payload(sid)
        result = (ended or {}).get("result") or {}
        for group in result.get("groups", []):
            if group["group_id"] == doc["group_id"]:
                return {**doc["event"], **group, "final": True}
        return doc["event"]

    # ---- sweeping -------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        beat = 0.0
        while True:
            try:
                now = time.monotonic()
                if self.store.durable and now - beat >= 1.0:
                    beat = now
                    await self.store.beat(self.owner)
                    await self.sweep(orphans=True)
                else:
                    await self.sweep(orphans=False)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("session sweeper failed; retrying", exc_info=True)
            stop_if_cancelled()  # a cancel the Redis client swallowed (service/cancellation.py)
            await asyncio.sleep(SWEEP_EVERY_S)

    async def sweep(self, orphans: bool = False) -> None:
        """Group timeouts, idle sessions, closings left by a dead pod, orphaned checks."""
        now = time.time()
        for sid in await self.store.active():
            record = await self.store.record(sid)
            if record is None:
                continue
            idle = self.settings.session_idle_timeout_s
            if record["state"] == OPEN and now - record["touched"] > idle:
                await self._end(sid, EXPIRED, f"no request for {idle:g} s "
                                "(REWARDD_SESSION_IDLE_TIMEOUT_S)")
                continue
            spec = self._spec(record)
            for gid in await self.store.due(sid, now):
                await self.store.set_deadline(sid, gid, None)
                await self._close_group(sid, spec, gid, "timeout")
            prune = record.get("standing") and now - self._pruned.get(sid, 0.0) >= 1.0
            if prune or orphans:
                docs = await self.store.groups(sid)  # one read for both passes
                if prune:
                    self._pruned[sid] = now
                    await self._prune(sid, docs, now)
                if orphans:
                    await self._resume(sid, record, spec, docs)
                    if record["state"] == CLOSING:
                        await self._finish_closing(sid)
        if orphans:
            await self.store.reap()

    async def _prune(self, sid: str, docs: dict[str, dict[str, Any]], now: float) -> None:
        """A standing session forgets its groups :data:`STANDING_KEEP_S` after they
        completed (their waiters have read them by then)."""
        old = [gid for gid, d in docs.items()
               if d["state"] == "done" and d.get("done_at", now) < now - STANDING_KEEP_S]
        await self.store.drop_groups(sid, old)

    async def _resume(self, sid: str, record: dict[str, Any], spec: SessionSpec,
                      every: dict[str, dict[str, Any]]) -> None:
        """Claim and re-run the checks of the session's groups (``every``) whose pod died."""
        docs = [d for d in every.values() if d["state"] != "done"]
        owners = {r["owner"] for d in docs for r in d["rollouts"] if not r["checked"]}
        owners |= {d["whole_owner"] for d in docs if d["whole_owner"] and not d["whole_done"]}
        dead = owners - await self.store.alive(owners) - {self.owner}
        if not dead:
            return
        for doc in docs:
            async def claim(d: dict[str, Any] | None) -> tuple[Any, Any, list[bytes]]:
                if d is None or d["state"] == "done":
                    return None, ([], False), []
                taken = [r for r in d["rollouts"] if not r["checked"] and r["owner"] in dead]
                for r in taken:
                    r["owner"] = self.owner
                whole = d["whole_owner"] in dead and not d["whole_done"]
                if whole:
                    d["whole_owner"] = self.owner
                return (d if taken or whole else None), (taken, whole), []

            taken, whole = await self.store.update_group(sid, doc["group_id"], claim)
            if taken:
                log.warning("session %s: resuming %d checks of group %r whose API pod died",
                            sid, len(taken), doc["group_id"])
                self._spawn(sid, self._check(sid, record["tenant"], spec, doc["group_id"],
                                             taken, whole=False, counted=False))
            if whole:
                self._spawn(sid, self._check_whole(sid, spec, doc["group_id"]))

    # ---- helpers --------------------------------------------------------------------------

    async def _own(self, tenant: str, sid: str) -> dict[str, Any]:
        record = await self.store.record(sid) if _valid_id(sid) else None
        if record is None or record["tenant"] != tenant:
            raise SessionNotFound(f"no session {sid!r}")
        return record

    def _spec(self, record: dict[str, Any]) -> SessionSpec:
        spec = self._specs.get(record["id"])
        if spec is None:
            spec = self._specs[record["id"]] = SessionSpec.model_validate(record["spec"])
        return spec

    async def changed(self, session_id: str, timeout: float) -> None:
        """Return when this pod changes the session, or after ``timeout`` (another pod's
        changes are seen by reading the store again)."""
        await self._wait_change(session_id, timeout)

    def _notify(self, sid: str) -> None:
        event = self._changed.pop(sid, None)
        if event is not None:
            event.set()

    async def _wait_change(self, sid: str, timeout: float) -> None:
        event = self._changed.setdefault(sid, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


_MISSING: Any = object()

PROFILE_LOC = ("body", "advantage", "profile")

GROUPS_SEEN = "@groups"
"""The session's counter (:meth:`SessionStore.bump`) of groups seen: each group's index."""
TOUCH_EVERY_S = 1.0
"""A session's ``touched`` (its idle clock) is written at most this often."""


async def _touch(rec: dict[str, Any]) -> tuple[bool, None, list[bytes]]:
    rec["touched"] = time.time()
    return True, None, []


def _parse(model: Any, data: Any) -> Any:
    """``model`` from plain data (the in-process interface); a 422 naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestInvalid([error(("body", *e["loc"]), e["msg"], e["type"])
                              for e in exc.errors()]) from None
