"""Per-sample requests assembled into groups: each waits until its group is whole.

OpenRLHF, slime and NeMo-Gym send one sample per request and never say which group it
belongs to; the ``n_samples_per_prompt`` samples of a prompt share its text and label. A
group is therefore keyed by (tenant, protocol, prompt, reference) and is the next
``group.size`` samples with that key: the first sample opens it, the ``size``-th completes
it and it is scored at once (one /v1/score group: a group-level verifier sees all of it),
and each waiting request is answered with its own sample's result. The same prompt coming
back in a later step opens a new group. A group still open ``group.timeout_s`` after its
first sample is scored from what arrived (flagged ``timed_out``) or failed (``on_timeout:
fail``, 504), well inside OpenRLHF's 180 s client timeout.

Why not the streaming sessions (/v1/sessions) underneath: they were being built at the same
time (issue #18) and their interface had not landed when this was written; this module is
the small part of a session a per-sample protocol needs (no events, no resume), kept behind
:func:`assembler` so that switching is local. Its cost: groups live in the API process, so
with several API pods a trainer must send a group's samples to one pod (the usual setup:
one URL per reward server; OpenRLHF rotates its URL list per request, so give it one URL),
and a pod that dies takes its open groups with it (the trainers' retries resend them).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException

from rewardd.service.compat.config import CompatConfig
from rewardd.service.compat.samples import SampleIn
from rewardd.service.compat.scoring import SampleOut, score_group, slot_when_free
from rewardd.service.tenancy import Tenant

MAX_OPEN_GROUPS = 4096
"""Open groups one tenant may have in this process (more: 429): a bound on what a trainer
that never completes its groups can make the server hold."""

GroupKey = tuple[str, str, str, str]


@dataclass(eq=False)
class OpenGroup:
    """A group that has not yet all its samples."""

    tenant: Tenant
    config: CompatConfig
    samples: list[SampleIn] = field(default_factory=list)
    waiters: list[asyncio.Future[SampleOut]] = field(default_factory=list)
    timer: asyncio.Task[None] | None = None


class Assembler:
    """The open groups of one app (see the module docstring)."""

    def __init__(self, state: Any) -> None:
        self._state = state
        self._open: dict[GroupKey, OpenGroup] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def open_groups(self, tenant: Tenant) -> int:
        return sum(1 for key in self._open if key[0] == tenant.name)

    async def submit(self, tenant: Tenant, protocol: str, sample: SampleIn,
                     config: CompatConfig) -> SampleOut:
        """Add ``sample`` to its group and wait for the group's result."""
        assert config.group is not None
        key = (tenant.name, protocol, sample.prompt,
               json.dumps(sample.reference, sort_keys=True, default=str))
        group = self._open.get(key)
        if group is None:
            if self.open_groups(tenant) >= MAX_OPEN_GROUPS:
                raise HTTPException(429, f"tenant {tenant.name!r} has {MAX_OPEN_GROUPS} groups "
                                    "waiting for samples (the limit); complete them or let "
                                    "them time out", headers={"Retry-After": "1"})
            group = self._open[key] = OpenGroup(tenant, config)
            group.timer = self._spawn(self._expire(key, group, config.group.timeout_s))
        waiter: asyncio.Future[SampleOut] = asyncio.get_running_loop().create_future()
        group.samples.append(sample)
        group.waiters.append(waiter)
        if len(group.samples) >= config.group.size:
            del self._open[key]
            if group.timer is not None:
                group.timer.cancel()
            self._spawn(self._finish(group, timed_out=False))
        # the waiter outlives a client that left: the group is scored for the others
        return await asyncio.shield(waiter)

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _expire(self, key: GroupKey, group: OpenGroup, after_s: float) -> None:
        await asyncio.sleep(after_s)
        if self._open.get(key) is not group:
            return
        del self._open[key]
        assert group.config.group is not None
        if group.config.group.on_timeout == "fail":
            for waiter in group.waiters:
                _settle(waiter, HTTPException(
                    504, f"the sample's group got {len(group.samples)} of "
                    f"{group.config.group.size} samples within {after_s:g} s "
                    "(group.timeout_s; group.on_timeout is fail)"))
            return
        await self._finish(group, timed_out=True)

    async def _finish(self, group: OpenGroup, timed_out: bool) -> None:
        """Score the group under a tenant slot (waiting for one when the tenant is at its
        limit: a whole group must be scored, not refused) and answer each waiter."""
        try:
            async with slot_when_free(self._state.limiter, group.tenant):
                outs = await score_group(group.samples, group.config, self._state,
                                         group.tenant, timed_out)
        except Exception as exc:  # the group's error is each of its samples' answer
            outs = [exc] * len(group.waiters)
        for waiter, out in zip(group.waiters, outs):
            _settle(waiter, out)


def _settle(waiter: asyncio.Future[SampleOut], out: SampleOut | BaseException) -> None:
    if waiter.done():
        return
    if isinstance(out, BaseException):
        waiter.set_exception(out)
    else:
        waiter.set_result(out)


def assembler(state: Any) -> Assembler:
    """The app's assembler, made on first use."""
    found = getattr(state, "compat_groups", None)
    if found is None:
        found = state.compat_groups = Assembler(state)
    return found
