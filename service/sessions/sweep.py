"""Every pod's sweeper: group timeouts, idle sessions, standing sessions' old groups, and
(with a durable store) the work of pods that died.

Pod death (Redis store): each pod beats every second (:meth:`SessionStore.beat`); a rollout
(or a group-level call) whose owner stopped beating is claimed, under the group's lock, by
the next pod that sweeps, and checked again (checks are idempotent). Deadlines of group
timeouts are in the store, so any pod fires them; a session left ``closing`` by a dead pod
is finished by the next sweep; a dead pod's count of the tenant's rollouts in flight is
dropped (:meth:`SessionStore.reap`).

A sweep reads each active session's record, its due deadlines and the store's small indices
of unsettled work's owners and of completed groups (:meth:`SessionStore.pending`,
:meth:`SessionStore.done_before`), never its groups: what an idle session costs every second
does not grow with what it holds (issue #28). ``sweeps`` counts the sweeps this pod made, so a
test can compare costs per sweep rather than per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from rewardd.service import metrics
from rewardd.service.cancellation import stop_if_cancelled
from rewardd.service.models import SessionSpec
from rewardd.service.sessions.checking import Checker, CheckJob, GroupRef
from rewardd.service.sessions.lifecycle import Lifecycle
from rewardd.service.sessions.pod import Pod
from rewardd.service.sessions.records import (GroupReason, GroupRecord, RolloutEntry,
                                              SessionPhase, SessionRecord)

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 0.25
"""Group timeouts, idle sessions and (Redis) orphaned checks are looked for this often."""
STANDING_KEEP_S = 300.0
"""A standing session's completed group is kept this long (see
:meth:`SessionManager.standing`)."""
PRUNE_EVERY_S = 1.0
"""A standing session's groups are looked over for old ones at most this often."""


class Sweeper:
    """The pod's sweeping task (see the module docstring)."""

    def __init__(self, pod: Pod, checker: Checker, lifecycle: Lifecycle) -> None:
        self.pod = pod
        self.checker = checker
        self.lifecycle = lifecycle
        self._task: asyncio.Task[None] | None = None
        self.sweeps = 0
        """Sweeps this pod made (``rewardd_session_sweeps_total``)."""

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop(self) -> None:
        """Stop the sweeper and this pod's checks (a durable store leaves them to others)."""
        tasks = self.pod.tasks()
        if self._task is not None:
            tasks.append(self._task)
            self._task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _sweep_forever(self) -> None:
        store, beat = self.pod.store, 0.0
        while True:
            try:
                now = time.monotonic()
                if store.durable and now - beat >= 1.0:
                    beat = now
                    await store.beat(self.pod.owner)
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
        pod, store = self.pod, self.pod.store
        now = time.time()
        for sid in await store.active():
            record = await store.record(sid)
            if record is None:
                continue
            idle = pod.settings.session_idle_timeout_s
            if record.state == SessionPhase.OPEN and now - record.touched > idle:
                await self.lifecycle.end(sid, SessionPhase.EXPIRED, f"no request for {idle:g} "
                                         "s (REWARDD_SESSION_IDLE_TIMEOUT_S)")
                continue
            spec = pod.spec(record)
            for gid in await store.due(sid, now):
                await store.set_deadline(sid, gid, None)
                await self.checker.close_group(GroupRef(sid, record.tenant, spec, gid),
                                               GroupReason.TIMEOUT)
            if record.standing and now - pod.pruned.get(sid, 0.0) >= PRUNE_EVERY_S:
                # a standing session forgets its groups STANDING_KEEP_S after they completed
                # (their waiters have read them by then)
                pod.pruned[sid] = now
                await store.drop_groups(sid, await store.done_before(sid, now - STANDING_KEEP_S))
            if orphans:
                await self._resume(record, spec, await store.pending(sid))
                if record.state == SessionPhase.CLOSING:
                    await self.lifecycle.finish_closing(sid)
        if orphans:
            await store.reap()
        self.sweeps += 1
        metrics.SESSION_SWEEPS.inc()

    async def _resume(self, record: SessionRecord, spec: SessionSpec,
                      pending: dict[str, set[str]]) -> None:
        """Claim and re-run the checks of the session's groups whose pod died (``pending``:
        group id -> the pods with unsettled work on it)."""
        pod, sid = self.pod, record.id
        owners = set().union(*pending.values()) if pending else set()
        dead = owners - await pod.store.alive(owners) - {pod.owner}
        if not dead:
            return

        async def claim(group: GroupRecord | None
                        ) -> tuple[GroupRecord | None, tuple[list[RolloutEntry], bool],
                                   list[bytes]]:
            if group is None or group.done:
                return None, ([], False), []
            taken = [r for r in group.rollouts if not r.checked and r.owner in dead]
            for r in taken:
                r.owner = pod.owner
            whole = group.whole_owner in dead and not group.whole_done
            if whole:
                group.whole_owner = pod.owner
            return (group if taken or whole else None), (taken, whole), []

        for gid in sorted(gid for gid, held in pending.items() if held & dead):
            taken, whole = await pod.store.update_group(sid, gid, claim)
            ref = GroupRef(sid, record.tenant, spec, gid)
            if taken:
                log.warning("session %s: resuming %d checks of group %r whose API pod died",
                            sid, len(taken), gid)
                self.checker.start(CheckJob(ref, taken, counted=False))
            if whole:
                pod.spawn(sid, self.checker.check_whole(ref))
