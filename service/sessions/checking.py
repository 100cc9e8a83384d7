"""A group's checks, from the executor back to its record, and the group's completion.

A rollout's per-sample components are checked on arrival (one call per arriving part of a
group and component, under the session's fair-queue flow); group-level verifiers (arenas)
run once the group is assembled (``group_size`` rollouts, or closed, or timed out). A group
is done when it is assembled and every cell is settled; the transition and its ``group``
event are one write under the group's lock (:meth:`SessionStore.update_group`), so an event
is never lost nor sent twice. Checks are idempotent: a pod that takes over a dead pod's
checks (:mod:`rewardd.service.sessions.sweep`) runs them again through :meth:`Checker.start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from rewardd.service import pipeline
from rewardd.service.events import encode_event
from rewardd.service.models import RewardSpec, SessionSpec
from rewardd.service.sessions.locality import group_local
from rewardd.service.sessions.pod import Pod
from rewardd.service.sessions.records import (GroupPhase, GroupReason, GroupRecord, JsonObject,
                                              RolloutEntry)
from rewardd.service.sessions.results import group_event
from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.workers import fairness
from rewardd.workers.executor import keeps_group_whole

log = logging.getLogger(__name__)

Cells = dict[str, dict[str, JsonObject]]
"""Rollout id -> component name -> outcome: what a check settles."""


@dataclass(frozen=True, slots=True)
class GroupRef:
    """One group of one session, with what work on the group needs of its session."""

    session_id: str
    tenant: str
    spec: SessionSpec
    group_id: str


@dataclass(frozen=True, slots=True)
class CheckJob:
    """Checks of some of a group's rollouts: the per-sample components of rollouts just
    taken (or claimed from a dead pod), or with ``whole`` the group-level components of the
    assembled group."""

    group: GroupRef
    rollouts: list[RolloutEntry]
    whole: bool = False
    counted: bool = True
    """The rollouts are counted in the tenant's rollouts in flight: released when settled
    (a dead pod's claimed checks were counted by that pod)."""
    urgent: bool = False
    """These checks are all their group still waits for (it is whole), so the group's event
    waits on them alone: they go first within the session's share of the fair queue."""


class Checker:
    """Runs checks and settles their cells into the group's record (module docstring)."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod

    def start(self, job: CheckJob) -> None:
        self.pod.spawn(job.group.session_id, self._check(job))

    async def _check(self, job: CheckJob) -> None:
        """Run the job's components over its rollouts and settle their cells."""
        ref, store = job.group, self.pod.store
        try:
            specs = [s for s in ref.spec.rewards if keeps_group_whole(s.verifier) == job.whole]
            cells: Cells = {r.id: {} for r in job.rollouts}
            if specs:
                group = (await store.groups(ref.session_id, [ref.group_id])).get(ref.group_id)
                if group is None:
                    return
                try:
                    cells = await self._verify(job, specs, group)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the executor broke: typed cells, never a hang
                    log.exception("session %s: checks of group %r could not run",
                                  ref.session_id, ref.group_id)
                    failed = Outcome.failure(FailureKind.unavailable, "the check could not "
                                             f"run: {type(exc).__name__}: {exc}").to_dict()
                    cells = {r.id: {s.name: failed for s in specs} for r in job.rollouts}
            await self._settle(ref, cells, job.whole)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: checks of group %r failed", ref.session_id, ref.group_id)
        finally:
            if job.counted and not job.whole:
                with contextlib.suppress(Exception):  # a dead store: its counts go too
                    await store.release(ref.tenant, self.pod.owner, len(job.rollouts))

    async def _verify(self, job: CheckJob, specs: list[RewardSpec], group: GroupRecord
                      ) -> Cells:
        spec = job.group.spec
        planner = pipeline.CallPlanner.of(
            specs, self.pod.settings, pipeline.BatchContext(spec.run_id, spec.step,
                                                            spec.evaluation))
        calls = planner.calls(group.group_id, group.prompt, group.reference,
                              [r.rollout() for r in job.rollouts])
        # the session is one flow of the fair queue; the checks that complete a group go first
        # within its share, taking their group's waiting checks along (fairness.flow)
        with fairness.flow(job.group.tenant, job.group.session_id,
                           urgent=job.urgent or job.whole, group=group.group_id):
            results = await pipeline.run_calls(
                calls, self.pod.runtime.executor,
                cache=self.pod.runtime.verdicts.view(job.group.tenant))
        return {r.id: {s.name: results[k].items[i].outcome.to_dict()
                       for k, s in enumerate(specs)} for i, r in enumerate(job.rollouts)}

    async def _settle(self, ref: GroupRef, cells: Cells, whole: bool) -> None:
        async def settle(group: GroupRecord | None
                         ) -> tuple[GroupRecord | None, bool, list[bytes]]:
            if group is None or group.done:
                return None, False, []
            for r in group.rollouts:
                if r.id in cells:
                    r.cells.update(cells[r.id])
                    r.checked = r.checked or not whole
            if whole:
                group.whole_done = True
            launch, events = await self.advance(ref, group)
            return group, launch, events

        launch = await self.pod.store.update_group(ref.session_id, ref.group_id, settle)
        self._after(ref, launch)

    def _after(self, ref: GroupRef, launch: bool) -> None:
        """Wake this pod's waiters; start the group-level checks an update asked for."""
        self.pod.notify(ref.session_id)
        if launch:
            self.pod.spawn(ref.session_id, self.check_whole(ref))

    async def check_whole(self, ref: GroupRef) -> None:
        """The group-level checks of an assembled group."""
        group = (await self.pod.store.groups(ref.session_id, [ref.group_id])).get(ref.group_id)
        if group is not None:
            await self._check(CheckJob(ref, group.rollouts, whole=True))

    async def advance(self, ref: GroupRef, group: GroupRecord) -> tuple[bool, list[bytes]]:
        """Under the group's lock: start the group-level checks once assembled; complete the
        group once every cell settled. (launch group-level checks?, events to publish)."""
        spec = ref.spec
        if len(group.rollouts) < spec.group_size and group.state != GroupPhase.CLOSING:
            return False, []
        whole = any(keeps_group_whole(s.verifier) for s in spec.rewards)
        launch = whole and group.whole_owner is None
        if launch:
            group.whole_owner = self.pod.owner
        if all(r.checked for r in group.rollouts) and (not whole or group.whole_done):
            group.reason = group.reason or GroupReason.FULL
            return launch, await self._complete(ref, group)
        return launch, []

    async def _complete(self, ref: GroupRef, group: GroupRecord) -> list[bytes]:
        store, spec = self.pod.store, ref.spec
        record = await store.record(ref.session_id)
        standing = bool(record and record.standing)
        # a standing session never closes: each group is a whole batch of its own, with the
        # tenant's run state (as /v1/score on that one group)
        runs = (self.pod.runtime.runs.for_tenant(record.tenant)
                if standing and record is not None else None)
        event = await asyncio.to_thread(group_event, spec, group,
                                        standing or group_local(spec.advantage), runs)
        if spec.group_timeout_s is not None:
            await store.set_deadline(ref.session_id, group.group_id, None)
        # state and event together, with no await between: the memory store's readers see
        # the live record
        group.state, group.event, group.done_at = GroupPhase.DONE, event, time.time()
        if record is None or record.state.ended or standing:
            return []  # a standing session's waiters read the group, not events
        return [encode_event("group", event)]

    async def close_group(self, ref: GroupRef, reason: GroupReason
                          ) -> tuple[bool, JsonObject | None]:
        """Complete the group from what arrived (once those checks settle): (whether the
        group exists, its event if it is complete already)."""
        fail = reason == GroupReason.TIMEOUT and ref.spec.on_group_timeout == "fail"

        async def shut(group: GroupRecord | None
                       ) -> tuple[GroupRecord | None, tuple[bool, JsonObject | None, bool],
                                  list[bytes]]:
            if group is None:
                return None, (False, None, False), []
            if group.done:
                return None, (True, group.event, False), []
            if group.state == GroupPhase.CLOSING:
                return None, (True, None, False), []
            group.reason = reason
            if fail:
                group.failed = True
                events = await self._complete(ref, group)
                return group, (True, group.event, False), events
            group.state = GroupPhase.CLOSING
            launch, events = await self.advance(ref, group)
            return group, (True, group.event, launch), events

        known, event, launch = await self.pod.store.update_group(ref.session_id, ref.group_id,
                                                                 shut)
        self._after(ref, launch)
        return known, event
