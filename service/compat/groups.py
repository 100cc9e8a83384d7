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
group (``<key>.<generation>``); a placement step puts the samples of the requests waiting
on this pod into those groups, moving a key to the next generation once its group is full or
no longer open. One step is one bulk operation under the session's placement lock, whatever
the number of keys: one read of the keys' generations, one of their groups, one session add
(issue 28: a request of 30,000 distinct prompts placed key by key, each with its own lock,
reads and add, held /healthz up to 32 s). A group that times out between that read and the
write is noticed (the session does not take the sample) and the sample goes to the next
generation in the next try.

What a tenant parks here is bounded before placement (:mod:`.scorer`: requests and samples
per tenant and process, samples per request, at most ``REWARDD_SESSION_MAX_INFLIGHT`` per
request since one add must take them whole); a request whose client left before its step
started is dropped from the queue.

Not idempotent: samples carry no id, so a resent sample is another sample. Two identical
completions of a prompt are legitimately two samples (short math answers often are), so
content cannot tell a resend from a sibling.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Sequence

from rewardd.service import heavy
from rewardd.service.compat.config import CompatConfig
from rewardd.service.compat.samples import SampleIn
from rewardd.advantages.errors import RequestInvalid
from rewardd.service.compat.scoring import SampleOut, outcome, remap
from rewardd.service.errors import TimedOut, Unavailable
from rewardd.service.models import AdvantageSpec, SessionSpec
from rewardd.service.sessions import SessionBusy, SessionConflict, SessionManager
from rewardd.service.sessions.records import GroupPhase, GroupRecord, JsonObject
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
"""Placement steps one standing session may have running in this process."""
PLACEMENT_LOCK = "placement"
"""The session lock a placement step holds: the keys' generations are read and moved on,
and the samples added, by one step at a time (across pods with Redis)."""

Spot = tuple[str, str]
"""Where a sample went: (group id, rollout id)."""


def session_spec(config: CompatConfig) -> SessionSpec:
    """The standing session's configuration, from ``REWARDD_COMPAT_CONFIG``."""
    group = config.group
    assert group is not None
    return SessionSpec(rewards=config.rewards, group_size=group.size,
                       advantage=group.advantage or AdvantageSpec(output="none"),
                       group_timeout_s=group.timeout_s, on_group_timeout=group.on_timeout)


def session_id(tenant: Tenant, protocol: str, config: CompatConfig,
               run_id: str | None = None) -> str:
    """The standing session of a tenant's protocol under a configuration, for the run the
    requests name: the same id on every pod; a changed configuration, or another run, is
    another session (its groups are not mixed: a group's samples are one run's, as
    recorded). The configuration's own ``run_id`` counts as the run the requests name, and
    without a run the id is the one it was before runs were recorded (pods of two releases
    side by side still share their groups)."""
    parts = [tenant.name, protocol, config.model_dump(mode="json", exclude={"run_id"})]
    text = json.dumps(parts + [run_id] if run_id is not None else parts, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def group_key(sample: SampleIn) -> str:
    text = json.dumps([sample.prompt, sample.reference], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(eq=False)
class _Placing:
    """One request's samples waiting for a placement step, and where they went."""

    samples: Sequence[SampleIn]
    spots: asyncio.Future[list[Spot | BaseException]]


class Assembler:
    """Samples into the standing sessions of one app (see the module docstring)."""

    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions
        self._queued: dict[str, deque[_Placing]] = defaultdict(deque)
        self._placing: dict[str, int] = defaultdict(int)
        self._tasks: set[asyncio.Task[None]] = set()

    def queued(self, sid: str) -> int:
        """Samples of this process's requests waiting to be placed in session ``sid``."""
        return sum(len(entry.samples) for entry in self._queued.get(sid, ()))

    async def submit(self, tenant: Tenant, protocol: str, samples: Sequence[SampleIn],
                     config: CompatConfig, run_id: str | None = None
                     ) -> list[SampleOut | BaseException]:
        """Each sample's result (or the error its request answers) once its group is
        whole; ``run_id``: the run the request names (its groups are that run's)."""
        assert config.group is not None
        sid = session_id(tenant, protocol, config, run_id)
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
                        else self._answer(event, spot, sample, config))
        return outs

    async def _placed(self, tenant: Tenant, sid: str, samples: Sequence[SampleIn],
                      config: CompatConfig) -> list[Spot | BaseException]:
        """Where each sample went, (group id, rollout id), or the error its placement met.
        The requests of this pod arriving while a placement step runs make the next step
        together, one bulk step for all their samples (per-sample trainers post each sample
        on its own, hundreds at once); at most :data:`MAX_PLACING` steps run per session.
        A request whose client leaves before its step started is taken out of the queue
        (nothing of it is kept); once placed, its samples are members of their groups, which
        other requests' samples may share, and are checked with them."""
        loop = asyncio.get_running_loop()
        entry = _Placing(samples, loop.create_future())
        queue = self._queued[sid]
        queue.append(entry)
        if self._placing[sid] < MAX_PLACING:
            self._placing[sid] += 1
            task = loop.create_task(self._drain(tenant, sid, config))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(entry.spots)
        except asyncio.CancelledError:
            if entry in queue:  # not placed yet: the client took it back
                queue.remove(entry)
            raise

    async def _drain(self, tenant: Tenant, sid: str, config: CompatConfig) -> None:
        queue = self._queued[sid]
        # one step stays within what one session add may reserve (each request was capped
        # at that at the door, so a step always takes at least one whole request)
        limit = self._sessions.settings.session_max_inflight
        try:
            while queue:
                batch: list[_Placing] = [queue.popleft()]
                size = len(batch[0].samples)
                while queue and size + len(queue[0].samples) <= limit:
                    size += len(queue[0].samples)
                    batch.append(queue.popleft())
                samples = [sample for entry in batch for sample in entry.samples]
                try:
                    spots: list[Spot | BaseException] = await self._place_all(
                        tenant, sid, samples, config)
                except Exception as exc:  # the step's failure is each of its samples'
                    spots = [exc] * len(samples)
                start = 0
                for entry in batch:
                    settle(entry.spots, spots[start:start + len(entry.samples)])
                    start += len(entry.samples)
        finally:
            self._placing[sid] -= 1

    async def _place_all(self, tenant: Tenant, sid: str, samples: list[SampleIn],
                         config: CompatConfig) -> list[Spot | BaseException]:
        """Put samples into their keys' open groups (and the next ones once full), all keys
        in one step under the session's placement lock: one read of the keys' generations,
        one of their groups, one add (issue 28: 30,000 distinct prompts placed one key at a
        time, each with its own lock, reads and add, held /healthz up to 32 s)."""
        assert config.group is not None
        size, store = config.group.size, self._sessions.store
        keys = await heavy.offload(lambda: [group_key(sample) for sample in samples])
        ids = [uuid.uuid4().hex for _ in samples]
        spots: dict[int, Spot | BaseException] = {}
        for _ in range(PLACE_TRIES):
            todo = [i for i in range(len(samples)) if i not in spots]
            if not todo:
                break
            async with store.locked(sid, PLACEMENT_LOCK):
                chunks = await self._chunks(sid, keys, todo, size)
                taken = await self._add(tenant, sid, samples, [
                    (gid, {"group_id": gid, "prompt": samples[idx[0]].prompt,
                           "reference": samples[idx[0]].reference,
                           "rollouts": [{"rollout_id": ids[i], "completion": samples[i].completion}
                                        for i in idx]}, idx) for gid, idx in chunks])
            for gid, idx in chunks:
                for i in idx:
                    if isinstance(taken.get(gid), BaseException):
                        spots[i] = taken[gid]  # type: ignore[assignment]
                    elif ids[i] in taken.get(gid, ()):  # type: ignore[operator]
                        spots[i] = (gid, ids[i])
        lost = Unavailable("the sample's group kept completing before the sample could join "
                           "it; retry", retry_after_s=1)
        return [spots.get(i, lost) for i in range(len(samples))]

    async def _chunks(self, sid: str, keys: list[str], todo: list[int], size: int
                      ) -> list[tuple[str, list[int]]]:
        """Which group each of the ``todo`` samples joins: (group id, sample indices) per
        group, in each key's open generation and the next ones once it is full. The keys'
        generations move on in the store (under the placement lock)."""
        pending: dict[str, list[int]] = defaultdict(list)
        for i in todo:
            pending[keys[i]].append(i)
        generation = await self._sessions.store.slots(sid, list(pending))
        start = dict(generation)
        known: dict[str, GroupRecord | None] = {}
        chunks: list[tuple[str, list[int]]] = []
        while pending:
            unread = [f"{key}.{generation[key]}" for key in pending
                      if f"{key}.{generation[key]}" not in known]
            if unread:  # one read per round; a second round only for keys that overflowed
                found = await self._sessions.store.groups(sid, unread)
                known.update({gid: found.get(gid) for gid in unread})
            for key in list(pending):
                gid = f"{key}.{generation[key]}"
                group = known[gid]
                have = len(group.rollouts) if group is not None else 0
                if group is not None and (group.state != GroupPhase.OPEN or have >= size):
                    generation[key] += 1
                    continue
                room, todo_key = size - have, pending[key]
                chunks.append((gid, todo_key[:room]))
                pending[key] = todo_key[room:]
                if pending[key] or have + len(chunks[-1][1]) >= size:
                    generation[key] += 1
                if not pending[key]:
                    del pending[key]
        await self._sessions.store.set_slots(
            sid, {key: value for key, value in generation.items() if value != start[key]})
        return chunks

    async def _add(self, tenant: Tenant, sid: str, samples: list[SampleIn],
                   chunks: list[tuple[str, dict[str, Any], list[int]]]
                   ) -> dict[str, set[str] | BaseException]:
        """The session's add of every chunk at once: per group id, the rollout ids taken, or
        the 422 its label made (the other groups are added without it). Waits while the
        tenant is at its rollouts-in-flight limit; a group that stopped being open meanwhile
        takes nothing (its samples are placed again)."""
        out: dict[str, set[str] | BaseException] = {}
        while chunks:
            try:
                taken = await self._sessions.add_rollouts(tenant, sid,
                                                          [group for _, group, _ in chunks])
            except RequestInvalid as exc:
                if not all(len(e["loc"]) > 2 and e["loc"][1] == "groups"
                           and isinstance(e["loc"][2], int) for e in exc.errors):
                    error = remap(exc, samples, one_group=True)  # not one group's: all fail
                    return {**out, **{gid: error for gid, _, _ in chunks}}
                bad = {e["loc"][2] for e in exc.errors}
                for gi in bad:
                    gid, _, idx = chunks[gi]
                    out[gid] = remap(RequestInvalid([e for e in exc.errors
                                                     if e["loc"][2] == gi]),
                                     [samples[i] for i in idx], one_group=True)
                chunks = [chunk for gi, chunk in enumerate(chunks) if gi not in bad]
                continue
            except SessionBusy:
                await asyncio.sleep(BUSY_POLL_S)
                continue
            except SessionConflict:  # a group closed (timed out) since it was read
                return out
            for gid, rid in taken:
                group_taken = out.setdefault(gid, set())
                if isinstance(group_taken, set):
                    group_taken.add(rid)
            return out
        return out

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
    def _answer(event: dict[str, Any], spot: Spot, sample: SampleIn,
                config: CompatConfig) -> SampleOut | BaseException:
        assert config.group is not None
        if event.get("failed"):
            return TimedOut(
                f"the sample's group got {event['arrived']} of {config.group.size} samples "
                f"within {config.group.timeout_s:g} s (group.timeout_s; group.on_timeout is "
                "fail)")
        rollout = next(r for r in event["rollouts"] if r["rollout_id"] == spot[1])
        return outcome(rollout, sample, event["arrived"], event["reason"] == "timeout", spot)

