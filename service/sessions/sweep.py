"""Every pod's sweeper: group timeouts, idle sessions, standing sessions' old groups, and
(with a durable store) the work of pods that died.

Pod death (Redis store): each pod beats every second (:meth:`SessionStore.beat`); a rollout
(or a group-level call) whose owner stopped beating is claimed, under the group's lock, by
the next pod that sweeps, and checked again (checks are idempotent). Deadlines of group
timeouts are in the store, so any pod fires them; a session left ``closing`` by a dead pod
is finished by the next sweep; a dead pod's count of the tenant's rollouts in flight is
dropped (:meth:`SessionStore.reap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

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
            prune = record.standing and now - pod.pruned.get(sid, 0.0) >= PRUNE_EVERY_S
            if prune or orphans:
                groups = await store.groups(sid)  # one read for both passes
                if prune:
                    pod.pruned[sid] = now
                    await self._prune(sid, groups, now)
                if orphans:
                    await self._resume(record, spec, groups)
                    if record.state == SessionPhase.CLOSING:
                        await self.lifecycle.finish_closing(sid)
        if orphans:
            await store.reap()

    async def _prune(self, sid: str, groups: dict[str, GroupRecord], now: float) -> None:
        """A standing session forgets its groups :data:`STANDING_KEEP_S` after they
        completed (their waiters have read them by then)."""
        old = [gid for gid, g in groups.items() if g.done
               and (g.done_at if g.done_at is not None else now) < now - STANDING_KEEP_S]
        await self.pod.store.drop_groups(sid, old)

    async def _resume(self, record: SessionRecord, spec: SessionSpec,
                      every: dict[str, GroupRecord]) -> None:
        """Claim and re-run the checks of the session's groups (``every``) whose pod died."""
        pod, sid = self.pod, record.id
        groups = [g for g in every.values() if not g.done]
        owners = {r.owner for g in groups for r in g.rollouts if not r.checked}
        owners |= {g.whole_owner for g in groups if g.whole_owner and not g.whole_done}
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

        for group in groups:
            taken, whole = await pod.store.update_group(sid, group.group_id, claim)
            ref = GroupRef(sid, record.tenant, spec, group.group_id)
            if taken:
                log.warning("session %s: resuming %d checks of group %r whose API pod died",
                            sid, len(taken), group.group_id)
                self.checker.start(CheckJob(ref, taken, counted=False))
            if whole:
                pod.spawn(sid, self.checker.check_whole(ref))
