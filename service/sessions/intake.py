"""Sessions opened and rollouts taken in: validation, idempotence, the tenant's limits, and
each group's record written before its checks start.

An add is checked whole before anything is stored: /v1/score's validation of the groups as
the batch will hold them, then per group its new rollouts (a resend with the same content is
a duplicate, with other content a 409; a group may not pass ``group_size``), then the
tenant's rollouts in flight are reserved over every pod (:meth:`SessionStore.reserve`) and
the groups and bytes to be stored counted against the tenant's bounds
(:meth:`SessionStore.take`, :mod:`rewardd.service.sessions.quota`). Only then is each
group's part appended under the group's lock and its checks started
(:mod:`rewardd.service.sessions.checking`).

The conflict checks run twice: on what was read before (so a bad add stores nothing), and
again under each group's lock as its part is appended, where they are atomic: of two
concurrent resends of one rollout id with different content, exactly one is taken and the
other is a 409 (issue #28: both got 200 when the second saw the first only under the lock
and counted it a duplicate). A multi-group add that loses such a race keeps the groups
appended before the conflicting one.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Mapping, Sequence, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from rewardd.advantages.checks import resolved_num_tokens, tokens_needed_for
from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service import pipeline
from rewardd.service.models import (Group, Rollout, ScoreRequest, SessionGroup, SessionRollouts,
                                    SessionSpec)
from rewardd.service.sessions.checking import Checker, CheckJob, GroupRef
from rewardd.service.sessions.errors import SessionBusy, SessionConflict
from rewardd.service.sessions.pod import Pod
from rewardd.service.sessions.quota import Refusal, refusal_error
from rewardd.service.sessions.records import (GroupPhase, GroupRecord, RolloutEntry,
                                              SessionPhase, SessionRecord)
from rewardd.service.settings import Settings

M = TypeVar("M", bound=BaseModel)

PROFILE_LOC = ("body", "advantage", "profile")

GROUPS_SEEN = "@groups"
"""The session's counter (:meth:`SessionStore.bump`) of groups seen: each group's index."""
TOKENS_SEEN = "@tokens"
"""The session's counter of tokens taken, when its answer carries per-token advantages."""
TOUCH_EVERY_S = 1.0
"""A session's ``touched`` (its idle clock) is written at most this often."""

GroupsIn = Sequence[Mapping[str, object]] | SessionRollouts
"""Rollouts to add: the parsed body, or its ``groups`` as plain data (in-process callers)."""

NewRollout = tuple[Rollout, str, int]
"""A rollout to store, its digest and its size (bytes of its canonical JSON)."""
Plan = list[tuple[SessionGroup, list[NewRollout]]]
"""Per group of an add, its new rollouts with their digests and sizes."""


def parse(model: type[M], data: object) -> M:
    """``model`` from plain data (the in-process interface); a 422 naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestInvalid([error(("body", *e["loc"]), e["msg"], e["type"])
                              for e in exc.errors()]) from None


def rollouts_of(groups: GroupsIn) -> SessionRollouts:
    """The body of an add (a 422 naming the field for plain data that does not parse)."""
    if isinstance(groups, SessionRollouts):
        return groups
    return parse(SessionRollouts, {"groups": list(groups)})


def check_spec(spec: SessionSpec, settings: Settings) -> None:
    """The /v1/score checks of the spec's rewards and advantage (422 naming the field), run
    on a probe group: errors about the probe's own rollouts are not the spec's."""
    probe = Group(group_id="probe", rollouts=[
        Rollout(rollout_id=str(i), completion="", num_tokens=1) for i in range(2)])
    req = ScoreRequest(run_id=spec.run_id, step=spec.step, evaluation=spec.evaluation,
                       groups=[probe], rewards=spec.rewards, advantage=spec.advantage,
                       audit=spec.audit)
    try:
        pipeline.check_request(req, settings)
    except RequestInvalid as exc:
        own = [e for e in exc.errors if tuple(e["loc"][:2]) != ("body", "groups")]
        if own:
            raise RequestInvalid(own) from None


def digest_and_size(rollout: Rollout) -> tuple[str, int]:
    """sha256 of the rollout's canonical JSON, and its length: what the store counts."""
    data = orjson.dumps(rollout.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest(), len(data)


def group_bytes(group: SessionGroup) -> int:
    """What a new group's record counts beside its rollouts: its prompt and reference."""
    return len((group.prompt or "").encode()) + len(orjson.dumps(group.reference or {}))


def conflict_of(group_id: str, rollout_id: str) -> SessionConflict:
    return SessionConflict(f"rollout {rollout_id!r} of group {group_id!r} was already "
                           "received with different content")


def check_group_fields(sent: SessionGroup, group: GroupRecord) -> None:
    """409 when a resent group's prompt or reference differs from the stored one."""
    for field, stored in (("prompt", group.prompt), ("reference", group.reference)):
        value = getattr(sent, field)
        if value is not None and value != stored:
            raise SessionConflict(f"group {sent.group_id!r}: {field} differs from the one "
                                  "it was first sent with")


def new_record(sid: str, tenant: str, spec: SessionSpec, standing: bool = False
               ) -> SessionRecord:
    now = time.time()
    return SessionRecord(id=sid, tenant=tenant, state=SessionPhase.OPEN,
                         spec=spec.model_dump(mode="json", exclude_unset=True), created=now,
                         touched=now, standing=standing)


async def _touch(record: SessionRecord) -> tuple[bool, None, list[bytes]]:
    record.touched = time.time()
    return True, None, []


class Intake:
    """Opens sessions and takes rollouts in (see the module docstring)."""

    def __init__(self, pod: Pod, checker: Checker) -> None:
        self.pod = pod
        self.checker = checker

    async def open(self, tenant: str, spec: SessionSpec) -> str:
        """A new session of ``tenant``; its id. 422 for a bad spec, 429 at the tenant's
        limit of open sessions."""
        settings, store = self.pod.settings, self.pod.store
        await asyncio.to_thread(check_spec, spec, settings)
        limit = settings.session_max_open
        if await store.open_count(tenant) >= limit:
            raise SessionBusy(f"tenant {tenant!r} already has {limit} sessions open (its "
                              "limit, REWARDD_SESSION_MAX_OPEN); close one, or retry later",
                              tenant=tenant, retry_after_s=settings.retry_after_s)
        sid = uuid.uuid4().hex
        await store.create(new_record(sid, tenant, spec))
        self.pod.remember(sid, spec)
        return sid

    async def standing(self, tenant: str, sid: str, spec: SessionSpec) -> None:
        """Make sure the server's own session ``sid`` is open with ``spec`` (see
        :meth:`SessionManager.standing`)."""
        store = self.pod.store
        record = await store.record(sid)
        if record is not None and record.state == SessionPhase.OPEN:
            return
        async with store.locked(sid):
            record = await store.record(sid)
            if record is not None and record.state == SessionPhase.OPEN:
                return
            if record is not None:  # an expired one: its groups are gone for good
                await store.purge(sid)
            await store.create(new_record(sid, tenant, spec, standing=True))
            self.pod.remember(sid, spec)

    async def add_rollouts(self, tenant: str, sid: str, groups: GroupsIn
                           ) -> set[tuple[str, str]]:
        """Store the rollouts and start their checks; (group id, rollout id) of each taken
        (a resent one is not; nor one whose group completed while it was being stored)."""
        pod, store = self.pod, self.pod.store
        record = await pod.own(tenant, sid)
        if record.state != SessionPhase.OPEN:
            raise SessionConflict(f"session {sid} is {record.state}: it takes no more "
                                  "rollouts")
        body = rollouts_of(groups)
        spec = pod.spec(record)
        known = await store.groups(sid, [g.group_id for g in body.groups])
        await asyncio.to_thread(self._check_rollouts, spec, body, known)
        plan = self._plan(spec, body, known)
        fresh = sum(len(new) for _, new in plan)
        limit = pod.settings.session_max_inflight
        if fresh and not await store.reserve(tenant, pod.owner, fresh, limit):
            raise SessionBusy(f"tenant {tenant!r} would have more than {limit} rollouts being "
                              "checked (REWARDD_SESSION_MAX_INFLIGHT, over every API pod); "
                              "retry once some groups completed", tenant=tenant,
                              retry_after_s=pod.settings.retry_after_s)
        new_groups = sum(1 for g, _ in plan if g.group_id not in known)
        accepted: set[tuple[str, str]] = set()
        counted, stored = (0, 0), [0, 0]  # (groups, bytes) counted by the store, and stored
        try:
            if fresh and not record.standing:  # the server's own are not the tenant's
                counted = await self._count(tenant, sid, plan, known)
            await self._count_answer_tokens(sid, spec, plan)  # refused: counted given back
            # first-sight order from a counter, and the idle clock moved at most once a
            # second: no session-wide lock per request (hundreds of per-sample requests
            # queued on it)
            index = await store.bump(sid, GROUPS_SEEN, new_groups) - new_groups
            if time.time() - record.touched >= TOUCH_EVERY_S:
                await store.update_record(sid, _touch)
            for group, new in plan:
                if not new:
                    continue
                if group.group_id not in known:
                    index += 1
                ref = GroupRef(sid, tenant, spec, group.group_id)
                taken, full, created = await self._append(ref, group, new, index - 1)
                accepted.update((group.group_id, r.id) for r in taken)
                sizes = {rollout.rollout_id: size for rollout, _, size in new}
                stored[0] += created
                stored[1] += sum(sizes[r.id] for r in taken) + (
                    group_bytes(group) if created else 0)
                if taken:
                    self.checker.start(CheckJob(ref, taken, urgent=full))
        finally:
            if fresh > len(accepted):  # reserved for rollouts that were not taken
                await store.release(tenant, pod.owner, fresh - len(accepted))
            if counted[0] > stored[0] or counted[1] > stored[1]:  # counted, not stored
                await store.give(tenant, sid, max(0, counted[0] - stored[0]),
                                 max(0, counted[1] - stored[1]))
        return accepted

    async def _count(self, tenant: str, sid: str, plan: Plan,
                     known: dict[str, GroupRecord]) -> tuple[int, int]:
        """Count the add's new groups and bytes against the tenant's bounds of what the
        store keeps (:mod:`~rewardd.service.sessions.quota`); raise the typed refusal."""
        fresh = [(g, new) for g, new in plan if new]
        groups = sum(1 for g, _ in fresh if g.group_id not in known)
        nbytes = sum(size for _, new in fresh for _, _, size in new) + sum(
            group_bytes(g) for g, _ in fresh if g.group_id not in known)
        store = self.pod.store
        refusal, held = await store.take(tenant, sid, groups, nbytes)
        if refusal != Refusal.NONE:
            asked = groups if refusal != Refusal.TENANT_BYTES else nbytes
            raise refusal_error(refusal, held, asked, tenant=tenant, sid=sid,
                                limits=store.limits,
                                retry_after_s=self.pod.settings.retry_after_s)
        return groups, nbytes

    async def _count_answer_tokens(self, sid: str, spec: SessionSpec, plan: Plan) -> None:
        """The close answers with every group's per-token advantages (output dense or rle):
        the session's tokens are counted over its adds (an atomic counter, over every pod)
        and an add that would take them past ``REWARDD_MAX_DENSE_TOKENS`` is a 422, so many
        small adds cannot build the answer one request may not. A rollout counted and then
        not taken (its group completed meanwhile) stays counted: the bound errs on refusing."""
        output = tokens_needed_for(spec.advantage)
        tokens = sum(resolved_num_tokens(r) or 0 for _, new in plan for r, _, _ in new)
        if output is None or not tokens:
            return
        limit = self.pod.settings.max_dense_tokens
        total = await self.pod.store.bump(sid, TOKENS_SEEN, tokens)
        if total > limit:
            await self.pod.store.bump(sid, TOKENS_SEEN, -tokens)
            raise RequestInvalid([error(("body", "groups"), f"session {sid} would answer with "
                                        f"{total} tokens, over the limit of {limit} "
                                        f"(REWARDD_MAX_DENSE_TOKENS) for output {output!r}; "
                                        "close it and open another, or use output 'scalar'")])

    def _check_rollouts(self, spec: SessionSpec, body: SessionRollouts,
                        known: dict[str, GroupRecord]) -> None:
        """/v1/score's validation of the request's groups as the batch will hold them."""
        groups = []
        for g in body.groups:
            seen = known.get(g.group_id)
            groups.append(Group.model_construct(
                group_id=g.group_id, rollouts=g.rollouts, data_source=g.data_source,
                source=g.source if g.source is not None else (seen.source if seen else None),
                prompt=g.prompt if g.prompt is not None else (seen.prompt if seen else ""),
                reference=g.reference if g.reference is not None else (
                    seen.reference if seen else {})))
        req = ScoreRequest.model_construct(run_id=spec.run_id, step=spec.step,
                                           evaluation=spec.evaluation, groups=groups,
                                           rewards=spec.rewards, advantage=spec.advantage)
        try:
            pipeline.check_request(req, self.pod.settings)
        except RequestInvalid as exc:
            # parts of groups differ in size by nature; a profile's equal-size rule is the
            # session's group_size (checked when the session opened)
            kept = [e for e in exc.errors if tuple(e["loc"]) != PROFILE_LOC]
            if kept:
                raise RequestInvalid(kept) from None

    @staticmethod
    def _plan(spec: SessionSpec, body: SessionRollouts, known: dict[str, GroupRecord]) -> Plan:
        """Per group, its new rollouts with their digests; 409 / 422 before anything is
        stored when a resend conflicts or a group would exceed its size."""
        plan = []
        for gi, g in enumerate(body.groups):
            group = known.get(g.group_id)
            seen = {r.id: r.digest for r in group.rollouts} if group else {}
            if group is not None:
                check_group_fields(g, group)
            new = []
            for rollout in g.rollouts:
                sent_digest, size = digest_and_size(rollout)
                if rollout.rollout_id in seen:
                    if seen[rollout.rollout_id] != sent_digest:
                        raise conflict_of(g.group_id, rollout.rollout_id)
                    continue
                new.append((rollout, sent_digest, size))
            if new and group is not None and group.state != GroupPhase.OPEN:
                raise SessionConflict(f"group {g.group_id!r} is complete ({group.reason}): "
                                      "it takes no more rollouts")
            if len(seen) + len(new) > spec.group_size:
                raise RequestInvalid([error(
                    ("body", "groups", gi, "rollouts"),
                    f"group {g.group_id!r} would have {len(seen) + len(new)} rollouts; the "
                    f"session's group_size is {spec.group_size}")])
            plan.append((g, new))
        return plan

    async def _append(self, ref: GroupRef, sent: SessionGroup, new: list[NewRollout],
                      index: int) -> tuple[list[RolloutEntry], bool, bool]:
        """Store the new rollouts; (those taken, whether the group now has all of them,
        whether this made the group). 409 (nothing stored) when, under the group's lock, a
        rollout id is already there with other content."""
        store, owner, size = self.pod.store, self.pod.owner, ref.spec.group_size
        timeout = ref.spec.group_timeout_s

        async def put(group: GroupRecord | None
                      ) -> tuple[GroupRecord | None, tuple[list[RolloutEntry], bool, bool],
                                 list[bytes]]:
            created = group is None
            if group is not None:  # the conflict checks again, atomic under the lock
                check_group_fields(sent, group)
                stored = {r.id: r.digest for r in group.rollouts}
                for rollout, rollout_digest, _ in new:
                    if stored.get(rollout.rollout_id, rollout_digest) != rollout_digest:
                        raise conflict_of(sent.group_id, rollout.rollout_id)
            if group is None:
                group = GroupRecord(group_id=sent.group_id, index=index, first=time.time(),
                                    prompt=sent.prompt or "", reference=sent.reference or {},
                                    data_source=sent.data_source, source=sent.source)
                if timeout is not None:
                    await store.set_deadline(ref.session_id, sent.group_id,
                                             group.first + timeout)
            if group.state != GroupPhase.OPEN:  # completed meanwhile (a race with a close)
                return None, ([], False, False), []
            seen = {r.id for r in group.rollouts}
            taken = []
            for rollout, rollout_digest, _ in new:
                if rollout.rollout_id in seen or len(group.rollouts) >= size:
                    continue
                entry = RolloutEntry(id=rollout.rollout_id, digest=rollout_digest, owner=owner,
                                     body=rollout.model_dump(mode="json", exclude_unset=True))
                group.rollouts.append(entry)
                seen.add(entry.id)
                taken.append(entry)
            return group, (taken, len(group.rollouts) >= size, created), []

        return await store.update_group(ref.session_id, ref.group_id, put)
