"""Per-sample requests assembled into groups on a standing streaming session: each request
waits until its sample's group is whole.

OpenRLHF, slime and NeMo-Gym send one sample per request and never say which group it
belongs to; the ``n_samples_per_prompt`` samples of a prompt share its text and label. A
group is therefore keyed by (prompt, reference) and is the next ``group.size`` samples with
that key: the first sample opens it, the ``size``-th completes it, and each waiting request
is answered with its own sample's result. The same prompt coming back in a later step opens
a new group. A group still open ``group.timeout_s`` after its first sample is scored from
what arrived (flagged ``timed_out``) or failed (``on_timeout: fail``, 504), well inside
OpenRLHF's 180 s client timeout.

Underneath is a streaming session (:mod:`rewardd.service.sessions`), the configured one
of issue #18: one *standing* session per (tenant, protocol, configuration), whose id every
API pod derives alike (:func:`session_id`). So each sample is checked the moment it arrives
(only group-level verifiers, such as an arena, wait for the whole group), and in
distributed mode the groups live in Redis: a group's samples may reach different API pods,
each pod answers its own requests when the group completes on any of them, and a pod that
dies mid-group loses nothing but its own waiting connections (another pod resumes its
checks; the trainer's retry of a lost request is a new sample of the group).

Which group a sample joins: the session keeps, per key, the generation of the key's open
group (``<key>.<generation>``); under the key's lock a request puts its samples into that
group, moving to the next generation once it is full or no longer open. A group that times
out between that read and the write is noticed (the session does not take the sample) and
the sample goes to the next generation.

Not idempotent: samples carry no id, so a resent sample is another sample. Two identical
completions of a prompt are legitimately two samples (short math answers often are), so
content cannot tell a resend from a sibling.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections import defaultdict
from typing import Any, Sequence

from rewardd.service.compat.config import CompatConfig
from rewardd.service.compat.samples import SampleIn
from rewardd.advantages.errors import RequestInvalid
from rewardd.service.compat.scoring import SampleOut, outcome, remap
from rewardd.service.errors import TimedOut, Unavailable
from rewardd.service.models import AdvantageSpec, SessionSpec
from rewardd.service.sessions import SessionBusy, SessionConflict, SessionManager
from rewardd.service.sessions.records import GroupPhase, JsonObject
from rewardd.service.sessions.waiters import settle
from rewardd.service.tenancy import Tenant

BUSY_POLL_S = 0.05
"""How often samples refused for the tenant's rollouts in flight ask again: accepted work
waits rather than being refused (a trainer would drop the sample's reward)."""

WAIT_MARGIN_S = 30.0
"""A waiting request gives up this long after its group's timeout should have fired."""

PLACE_TRIES = 8
"""Placements of a sample whose group keeps completing under it, before a 503."""
MAX_PLACING = 2
"""Placements one standing session may have running in this process."""

Spot = tuple[str, str]
"""Where a sample went: (group id, rollout id)."""


def session_spec(config: CompatConfig) -> SessionSpec:
    """The standing session's configuration, from ``REWARDD_COMPAT_CONFIG``."""
    group = config.group
    assert group is not None
    return SessionSpec(rewards=config.rewards, group_size=group.size,
                       advantage=group.advantage or AdvantageSpec(output="none"),
                       group_timeout_s=group.timeout_s, on_group_timeout=group.on_timeout)


def session_id(tenant: Tenant, protocol: str, config: CompatConfig) -> str:
    """The standing session of a tenant's protocol under a configuration: the same id on
    every pod; a changed configuration is another session (its groups are not mixed)."""
    text = json.dumps([tenant.name, protocol, config.model_dump(mode="json")],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def group_key(sample: SampleIn) -> str:
    text = json.dumps([sample.prompt, sample.reference], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Assembler:
    """Samples into the standing sessions of one app (see the module docstring)."""

    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions
        self._queued: dict[str, list[tuple[SampleIn, asyncio.Future[Spot]]]] = {}
        self._placing: dict[str, int] = defaultdict(int)
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, tenant: Tenant, protocol: str, samples: Sequence[SampleIn],
                     config: CompatConfig) -> list[SampleOut | BaseException]:
        """Each sample's result (or the error its request answers) once its group is
        whole."""
        assert config.group is not None
        sid = session_id(tenant, protocol, config)
        await self._sessions.start()  # the lifespan starts it; an app used without one too
        await self._sessions.standing(tenant, sid, session_spec(config))
        placed = await self._placed(tenant, sid, samples, config)
        gids = sorted({spot[0] for spot in placed if not isinstance(spot, BaseException)})
        events = dict(zip(gids, await asyncio.gather(
            *(self._wait(sid, gid, config) for gid in gids), return_exceptions=True)))
        outs: list[SampleOut | BaseException] = []
        for sample, spot in zip(samples, placed):
            event = spot if isinstance(spot, BaseException) else events[spot[0]]
            outs.append(event if isinstance(event, BaseException)
                        else self._answer(event, spot[1], sample, config))
        return outs

    async def _placed(self, tenant: Tenant, sid: str, samples: Sequence[SampleIn],
                      config: CompatConfig) -> list[tuple[str, str] | BaseException]:
        """Where each sample went, (group id, rollout id), or the error its placement met.
        Samples of this pod's requests arriving while a placement runs make the next one
        together (a group's samples are then one add: per-sample trainers post each sample
        on its own, hundreds at once); at most :data:`MAX_PLACING` run per session."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in samples]
        self._queued.setdefault(sid, []).extend(zip(samples, futures))
        if self._placing[sid] < MAX_PLACING:
            self._placing[sid] += 1
            task = loop.create_task(self._drain(tenant, sid, config))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # a client that leaves does not take its sample back: it is in a group by then
        return list(await asyncio.gather(*(asyncio.shield(f) for f in futures),
                                         return_exceptions=True))

    async def _drain(self, tenant: Tenant, sid: str, config: CompatConfig) -> None:
        queue = self._queued[sid]
        try:
            while queue:
                batch = queue[:]
                del queue[:]
                by_key: dict[str, list[tuple[SampleIn, asyncio.Future[Spot]]]] = defaultdict(list)
                for sample, future in batch:
                    by_key[group_key(sample)].append((sample, future))
                results = await asyncio.gather(*(
                    self._place(tenant, sid, key, [sample for sample, _ in items], config)
                    for key, items in by_key.items()), return_exceptions=True)
                for items, where in zip(by_key.values(), results):
                    for k, (_, future) in enumerate(items):
                        settle(future, where if isinstance(where, BaseException)
                               else where[k])
        finally:
            self._placing[sid] -= 1

    async def _place(self, tenant: Tenant, sid: str, key: str, samples: list[SampleIn],
                     config: CompatConfig) -> list[tuple[str, str]]:
        """Put samples of one key into the key's open group (and the next ones once it is
        full): (group id, rollout id) of each."""
        assert config.group is not None
        size, store = config.group.size, self._sessions.store
        ids = [uuid.uuid4().hex for _ in samples]
        spots: dict[str, str] = {}
        for _ in range(PLACE_TRIES):
            todo = [i for i in range(len(samples)) if ids[i] not in spots]
            if not todo:
                break
            async with store.locked(sid, "key:" + key):
                generation = await store.slot(sid, key)
                chunks: list[tuple[str, list[int]]] = []
                while todo:
                    gid = f"{key}.{generation}"
                    group = (await store.groups(sid, [gid])).get(gid)
                    have = len(group.rollouts) if group is not None else 0
                    if group is not None and (group.state != GroupPhase.OPEN or have >= size):
                        generation += 1
                        continue
                    room = size - have
                    chunks.append((gid, todo[:room]))
                    todo = todo[room:]
                    if todo or have + len(chunks[-1][1]) >= size:
                        generation += 1
                await store.set_slot(sid, key, generation)
                taken = await self._add(tenant, sid, samples, [
                    {"group_id": gid, "prompt": samples[idx[0]].prompt,
                     "reference": samples[idx[0]].reference,
                     "rollouts": [{"rollout_id": ids[i], "completion": samples[i].completion}
                                  for i in idx]} for gid, idx in chunks])
            for gid, idx in chunks:
                for i in idx:
                    if (gid, ids[i]) in taken:
                        spots[ids[i]] = gid
        if len(spots) < len(samples):
            raise Unavailable("the sample's group kept completing before the sample could "
                              "join it; retry", retry_after_s=1)
        return [(spots[rid], rid) for rid in ids]

    async def _add(self, tenant: Tenant, sid: str, samples: list[SampleIn],
                   groups: list[dict[str, Any]]) -> set[tuple[str, str]]:
        """The session's add, waiting while the tenant is at its rollouts-in-flight limit;
        a group that stopped being open meanwhile takes nothing (placed again). A 422 names
        the samples' label (they share it: one key)."""
        while True:
            try:
                return await self._sessions.add_rollouts(tenant, sid, groups)
            except RequestInvalid as exc:
                raise remap(exc, samples, one_group=True) from None
            except SessionBusy:
                await asyncio.sleep(BUSY_POLL_S)
            except SessionConflict:  # a group closed (timed out) since it was read
                return set()

    async def _wait(self, sid: str, gid: str, config: CompatConfig) -> JsonObject:
        """The group's event once complete: every request of this pod waiting on a group of
        the session shares one watcher (:meth:`SessionManager.group_done`), not a poll
        each."""
        assert config.group is not None
        limit = config.group.timeout_s + WAIT_MARGIN_S
        try:
            event = await self._sessions.group_done(sid, gid, limit)
        except asyncio.TimeoutError:
            raise Unavailable(f"the sample's group was not complete {limit:g} s after it "
                              "was sent (its timeout did not fire); retry",
                              retry_after_s=1) from None
        if event is None:
            raise Unavailable("the server's session for this protocol ended (idle, or its "
                              "store lost it) before the sample's group was complete; retry",
                              retry_after_s=1)
        return event

    @staticmethod
    def _answer(event: dict[str, Any], rollout_id: str, sample: SampleIn,
                config: CompatConfig) -> SampleOut | BaseException:
        assert config.group is not None
        if event.get("failed"):
            return TimedOut(
                f"the sample's group got {event['arrived']} of {config.group.size} samples "
                f"within {config.group.timeout_s:g} s (group.timeout_s; group.on_timeout is "
                "fail)")
        rollout = next(r for r in event["rollouts"] if r["rollout_id"] == rollout_id)
        return outcome(rollout, sample, event["arrived"], event["reason"] == "timeout")

