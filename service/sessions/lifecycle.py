"""A session's life after its rollouts: waiting on groups, the close and its batch, cancel,
expiry, its state and its event stream.

The close is safe on any pod and against a pod that dies midway: the session turns
``closing`` (one write), every open group is closed from what arrived, and once all are done
whoever first takes the record's lock computes the batch and publishes ``closed``
(:meth:`Lifecycle.finish_closing`); the others, and the sweeper of a pod that finds a closing
session whose pod died, see it done. Ending (cancel, expiry) is one write of the record with
its ``closed`` event, after which the session's keys get ``session_ttl_s``.
"""

from __future__ import annotations

import asyncio
import functools
import contextlib
import time
from typing import AsyncIterator

import orjson

from rewardd.advantages.table import FlatBatch
from rewardd.service import audit, pipeline
from rewardd.service.eventfeed import Changed
from rewardd.service.models import SessionSpec
from rewardd.service.events import HEARTBEAT_S, Event, encode_event
from rewardd.service.sessions.checking import Checker, GroupRef
from rewardd.service.sessions.errors import SessionNotFound
from rewardd.service.sessions.pod import POLL_S, Pod
from rewardd.service.sessions.records import (GroupPhase, GroupReason, GroupRecord, JsonObject,
                                              SessionPhase, SessionRecord)
from rewardd.service.sessions.results import answered_groups, group_model, session_result
from rewardd.service.timestamps import iso
from rewardd.workers import fairness
from rewardd.workers.executor import CallResult


def closed_payload(sid: str, state: SessionPhase, error: str | None) -> JsonObject:
    """The ``closed`` event's data for a session that ended without a batch."""
    return {"session_id": sid, "state": state.value, "error": error, "summary": None,
            "result": None}


class Lifecycle:
    """Waits, closes, ends and reports sessions (see the module docstring)."""

    def __init__(self, pod: Pod, checker: Checker) -> None:
        self.pod = pod
        self.checker = checker

    async def wait_group(self, tenant: str, sid: str, gid: str, wait_s: float
                         ) -> JsonObject | None:
        """The group's object once complete (with final advantages once the session closed),
        waiting up to ``wait_s``; None if still incomplete (or not seen) by then."""
        pod = self.pod
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            record = await pod.own(tenant, sid)
            group = (await pod.store.groups(sid, [gid])).get(gid)
            if group is not None and group.done:
                if record.state == SessionPhase.CLOSED:
                    return await self._final_group(sid, group)
                return group.event
            if record.state.ended and record.state != SessionPhase.CLOSED:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await pod.wait_change(sid, min(left, POLL_S))

    async def close(self, tenant: str, sid: str) -> JsonObject:
        """End the step: open groups complete from what arrived, then the batch's numbers
        (batch-level estimators too): the ``closed`` event's data."""
        pod = self.pod
        record = await pod.own(tenant, sid)
        if record.state == SessionPhase.OPEN:
            async def closing(rec: SessionRecord) -> tuple[bool, None, list[bytes]]:
                changed = rec.state == SessionPhase.OPEN
                if changed:
                    rec.state, rec.touched = SessionPhase.CLOSING, time.time()
                return changed, None, []

            await pod.store.update_record(sid, closing)
        while True:
            ended = await self._ended_payload(sid)
            if ended is not None:
                return ended
            if await self.finish_closing(sid):
                continue
            await pod.wait_change(sid, POLL_S)

    async def cancel(self, tenant: str, sid: str) -> JsonObject:
        """Drop the session (its checks stop); its state afterwards."""
        await self.pod.own(tenant, sid)
        await self.end(sid, SessionPhase.CANCELLED, None)
        return await self.status(tenant, sid)

    async def status(self, tenant: str, sid: str) -> JsonObject:
        record = await self.pod.own(tenant, sid)
        groups = (await self.pod.store.groups(sid)).values()
        return {"session_id": sid, "state": record.state.value, "groups": len(groups),
                "completed_groups": sum(1 for g in groups if g.done),
                "rollouts": sum(len(g.rollouts) for g in groups),
                "created_at": iso(record.created), "error": record.error}

    async def events(self, tenant: str, sid: str, after: int,
                     heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[Event | None]:
        """Stored events after ``after`` as they come (``None``: a heartbeat after
        ``heartbeat_s`` of silence); ends after the ``closed`` event.

        Every stream of the session in this process shares one probe of the store per
        change or :data:`POLL_S`, and reads the history in pages
        (:mod:`rewardd.service.eventfeed`): a late reader that never reads holds one page."""
        pod = self.pod
        await pod.own(tenant, sid)
        store = pod.store

        async def probe() -> tuple[int, bool | None]:
            record = await store.record(sid)  # before the count: an ended state read here
            last = await store.last_event(sid)  # has its closed event counted
            return last, record.state.ended if record is not None else None

        async def read(start: int, limit: int) -> list[Event]:
            return await store.events(sid, start, limit)

        follow = pod.feeds.follow(sid, probe, read, after, heartbeat_s,
                                  lambda event: event.kind == "closed")
        async with contextlib.aclosing(follow) as items:  # leave the feed as we end
            async for item in items:
                if not isinstance(item, Changed):
                    yield item
                elif item.state is None or item.state:  # gone, or ended without `closed`
                    return

    async def finish_closing(self, sid: str) -> bool:
        """Close every open group of a closing session; once all are done, compute the
        batch and publish ``closed`` (whoever gets the lock first; the others see it).
        True once the session is closed."""
        pod, store = self.pod, self.pod.store
        record = await store.record(sid)
        if record is None or record.state != SessionPhase.CLOSING:
            return record is not None and record.state.ended
        spec = pod.spec(record)
        for gid, group in (await store.groups(sid)).items():
            if group.state == GroupPhase.OPEN:
                await self.checker.close_group(GroupRef(sid, record.tenant, spec, gid),
                                               GroupReason.CLOSED)
        if any(not group.done for group in (await store.groups(sid)).values()):
            return False
        runs = pod.runtime.runs.for_tenant(record.tenant)
        closed: list[tuple[list[GroupRecord], JsonObject]] = []
        audited = await self._audit(sid, record.tenant, spec)

        async def finish(rec: SessionRecord) -> tuple[bool, bool, list[bytes]]:
            if rec.state != SessionPhase.CLOSING:
                return False, False, []
            final = await store.groups(sid)
            if any(not group.done for group in final.values()):
                return False, False, []
            result = await asyncio.to_thread(session_result, spec, list(final.values()), runs)
            if audited is not None and audited[0] == [g["group_id"] for g in result["groups"]]:
                audit.apply(result, spec.audit, audited[1], audited[2])  # beside, as in a batch
            closed[:] = [(answered_groups(list(final.values())), result)]
            rec.state, rec.touched = SessionPhase.CLOSED, time.time()
            payload = {"session_id": sid, "state": SessionPhase.CLOSED.value, "error": None,
                       "summary": result["summary"], "result": result}
            return True, True, [encode_event("closed", payload)]

        if await store.update_record(sid, finish):
            await store.finish(sid, record.tenant)
            pod.forget(sid)
            pod.notify(sid)
            if closed and spec.run_id is not None:  # the pod whose close applied records it
                answered, result = closed[0]
                record_batch = pod.runtime.records.for_tenant(record.tenant)
                await asyncio.to_thread(functools.partial(
                    record_batch, spec.run_id, spec.step,
                    [group_model(group) for group in answered], result,
                    rewards=spec.rewards, evaluation=spec.evaluation))
        return True

    async def _audit(self, sid: str, tenant: str, spec: SessionSpec
                     ) -> tuple[list[str], list[audit.AuditCall], list[CallResult]] | None:
        """The session's audit components (docs/audit.md) over the groups its close answers
        for, run before the close is written (their checks must not run under its lock):
        the groups' ids in order, the calls and their results. None without ``audit``."""
        if not spec.audit:
            return None
        kept = answered_groups(list((await self.pod.store.groups(sid)).values()))
        flat = FlatBatch.of([group_model(group) for group in kept])
        batch = pipeline.BatchContext(spec.run_id, spec.step, spec.evaluation)
        calls = pipeline.plan_audits(spec, flat, self.pod.settings, batch)
        with fairness.flow(tenant, sid):  # beside: uncached and uncounted, as in a batch
            results = await pipeline.run_calls([], self.pod.runtime.executor,
                                               beside=[c.call for c in calls]) if calls else []
        return [group.group_id for group in kept], calls, results

    async def end(self, sid: str, state: SessionPhase, reason: str | None) -> None:
        """End the session without a batch (cancelled, expired): its checks stop."""
        pod, store = self.pod, self.pod.store

        async def end(rec: SessionRecord) -> tuple[bool, bool, list[bytes]]:
            if rec.state.ended:
                return False, False, []
            rec.state, rec.error = state, reason
            return True, True, [encode_event("closed", closed_payload(sid, state, reason))]

        record = await store.record(sid)
        if record is not None and await store.update_record(sid, end):
            await store.finish(sid, record.tenant)
            pod.forget(sid)
            pod.cancel(sid)
            pod.notify(sid)

    async def _ended_payload(self, sid: str) -> JsonObject | None:
        record = await self.pod.store.record(sid)
        if record is None:
            raise SessionNotFound(f"session {sid} expired")
        if not record.state.ended:
            return None
        last = await self.pod.store.last_event(sid)
        for event in await self.pod.store.events(sid, max(0, last - 1)):
            if event.kind == "closed":
                ended: JsonObject = orjson.loads(event.data)
                return ended
        return closed_payload(sid, record.state, record.error)

    async def _final_group(self, sid: str, group: GroupRecord) -> JsonObject | None:
        """A done group of a closed session, with its final advantages from the batch."""
        ended = await self._ended_payload(sid) or {}
        result = ended.get("result")
        for final in result.get("groups", []) if isinstance(result, dict) else []:
            if isinstance(final, dict) and final["group_id"] == group.group_id:
                return {**(group.event or {}), **final, "final": True}
        return group.event
