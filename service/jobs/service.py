"""What a client does with a job: submit it, read it, cancel it, watch its events.

REST (:mod:`rewardd.service.api.jobs`) and gRPC (SubmitJob, GetJob, CancelJob, WatchJob)
both call :class:`JobService`; they only translate their wire format and map the service's
errors (:mod:`rewardd.service.errors`). See the REST module's docstring for the contract a
client sees (idempotency keys, event kinds, ``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator

import orjson

from rewardd.advantages.errors import Loc, RequestInvalid, error
from rewardd.service import events, pipeline
from rewardd.service.errors import NotFound
from rewardd.service.eventfeed import Changed, Feeds
from rewardd.service.events import Event
from rewardd.service.gcpause import gc_paused
from rewardd.service.jobs.runner import JobRunner
from rewardd.service.jobs.store import (FINAL, REVERIFY, SCORE, SUCCEEDED, Job, JobStore,
                                        key_digest)
from rewardd.service.models import ScoreRequest
from rewardd.service.records.store import RecordStore
from rewardd.service.replay import check_overrides, first_components
from rewardd.service.replaymodels import ReverifyJob, ReverifyRequest
from rewardd.service.runtime import Runtime
from rewardd.service.tenancy import Tenant

IDEMPOTENCY_KEY_MAX = 255
"""Longest ``Idempotency-Key`` (REST header, gRPC field) a submit may carry."""
STREAM_POLL_S = 0.25
"""A job's watchers in this process (all of them together) probe its store this often."""
_Progress = tuple[str, int, int]
"""What a job's watchers need of its record: (state, done, total)."""


@dataclass(frozen=True, slots=True)
class JobProgressTick:
    """Progress of a running job, as a stream reports it between events."""

    done: int
    total: int


def _encode(req: ScoreRequest) -> tuple[bytes, str]:
    """(what the store keeps to re-run the job, digest of the request's meaning)."""
    with gc_paused():
        stored = req.model_dump_json(exclude_unset=True).encode()
        canonical = orjson.dumps(req.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return stored, hashlib.sha256(canonical).hexdigest()


def _same_body(job: Job, digest: str) -> Job:
    """``job``, which a submit's Idempotency-Key names; a 422 when its body differed."""
    if job.digest != digest:
        raise RequestInvalid([error(
            ("header", "Idempotency-Key"),
            f"this Idempotency-Key was already used for a different request body (job "
            f"{job.id}); send a new key with a new body", "idempotency_key_reused")])
    return job


class JobService:
    """The jobs of one app: its store, this process's runner, and the runtime they use."""

    def __init__(self, runtime: Runtime, store: JobStore) -> None:
        self.runtime = runtime
        self.store = store
        self.runner = JobRunner(runtime, store)
        self.feeds: Feeds[_Progress | None] = Feeds(lambda: STREAM_POLL_S)
        """This process's watchers of each job, one store probe per job per tick."""

    async def submit(self, tenant: Tenant, req: ScoreRequest,
                     idempotency_key: str | None) -> tuple[Job, bool]:
        """Check ``req``, take the tenant's slot and start its job: (the job, True), or (the
        job an ``idempotency_key`` already named, False)."""
        # a 422 now, never a failed job; off the event loop like every CPU-heavy step (see
        # service.pipeline)
        await asyncio.to_thread(pipeline.check_request, req, self.runtime.settings)
        try:
            stored, digest = await asyncio.to_thread(_encode, req)
        except Exception as exc:  # e.g. msgpack bytes that JSON cannot carry
            raise RequestInvalid([error(("body",), f"the body cannot be stored as JSON for "
                                        f"a job: {exc}")]) from None
        total = sum(len(g.rollouts) for g in req.groups) * len(req.rewards)
        return await self._start(tenant, SCORE, stored, digest, total, idempotency_key, req)

    async def submit_reverify(self, tenant: Tenant, store: RecordStore, run_id: str,
                              req: ReverifyRequest,
                              idempotency_key: str | None) -> tuple[Job, bool]:
        """Check a replay of ``run_id`` (its record, ``set`` against its components), take
        the tenant's slot and start the job (:mod:`rewardd.service.replay`)."""
        if await asyncio.to_thread(store.run, tenant.name, run_id) is None:
            raise NotFound(f"run {run_id!r} has no record (never recorded, or pruned)")
        components = await asyncio.to_thread(first_components, store, tenant.name, run_id,
                                             req.steps)
        check_overrides(req, components)
        _, replayable = await asyncio.to_thread(store.replay_counts, tenant.name, run_id,
                                                req.steps)
        body = ReverifyJob(run_id=run_id, request=req)
        stored = body.model_dump_json().encode()
        digest = hashlib.sha256(orjson.dumps(body.model_dump(mode="json"),
                                             option=orjson.OPT_SORT_KEYS)).hexdigest()
        return await self._start(tenant, REVERIFY, stored, digest, replayable, idempotency_key,
                                 body)

    async def _start(self, tenant: Tenant, kind: str, stored: bytes, digest: str, total: int,
                     idempotency_key: str | None,
                     req: ScoreRequest | ReverifyJob | None = None) -> tuple[Job, bool]:
        idempotency = key_digest(idempotency_key) if idempotency_key is not None else None
        if idempotency is not None:
            existing = await self.store.find(tenant.name, idempotency)
            if existing is not None:
                return _same_body(existing, digest), False
        job = Job(id=uuid.uuid4().hex, tenant=tenant.name,
                  tenant_limit=tenant.max_concurrent_jobs, total=total,
                  created_at=time.time(), idempotency=idempotency, digest=digest, kind=kind)
        limiter = self.runtime.limiter
        await limiter.admit(tenant, job.id)  # 429: nothing created
        try:
            created = await self.store.create(job, stored, self.runner.owner)
        except BaseException:
            await limiter.release(tenant, job.id)
            raise
        if created.id != job.id:  # a concurrent submit with the same key won
            await limiter.release(tenant, job.id)
            return _same_body(created, digest), False
        self.runner.launch(created, req)
        return created, True

    async def own(self, tenant: Tenant, job_id: str) -> Job:
        """The tenant's job ``job_id``; :class:`NotFound` for another tenant's job too."""
        job = await self.store.get_for(tenant.name, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    async def result(self, job: Job) -> bytes | None:
        """The stored /v1/score response (JSON) of a succeeded job, else None."""
        return await self.store.result(job.id) if job.state == SUCCEEDED else None

    async def cancel(self, job: Job) -> Job:
        """Cancel ``job`` if still active; the job afterwards."""
        if job.active:
            job = await self.store.finish(job, "cancelled") or job
            # this pod's runner at once; others notice at their next lease renewal
            self.runner.cancel(job.id, "cancelled")
            self.feeds.poke(job.id)
        return job

    async def resume_after(self, job_id: str, header: str | None,
                           loc: Loc = events.LAST_EVENT_ID) -> int:
        """:func:`rewardd.service.events.resume_after` on this job's stream."""
        return await events.resume_after(self.store, job_id, header, loc)

    async def watch(self, job_id: str, after: int, heartbeat_s: float | None = None
                    ) -> AsyncIterator[Event | JobProgressTick | None]:
        """The job's stored events after ``after`` as they happen, a :class:`JobProgressTick`
        when progress changed between them, ``None`` after ``heartbeat_s`` (default
        :data:`rewardd.service.events.HEARTBEAT_S`) of silence; ends after the terminal
        event (or at once for a job that expired or already ended).

        Every watcher of the job in this process shares one :class:`~rewardd.service.
        eventfeed.Feed` (one store probe per tick, not one per watcher) and reads the
        history in pages (:mod:`rewardd.service.eventfeed`)."""
        heartbeat_s = events.HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        store = self.store

        async def probe() -> tuple[int, _Progress | None]:
            job = await store.get(job_id)  # before the count: a final state read here has
            last = await store.last_event(job_id)  # its terminal event counted
            return last, (job.state, job.done, job.total) if job is not None else None

        async def read(start: int, limit: int) -> list[Event]:
            return await store.events(job_id, start, limit)

        last_progress: tuple[int, int] | None = None
        follow = self.feeds.follow(job_id, probe, read, after, heartbeat_s,
                                   lambda event: event.kind in FINAL)
        async with contextlib.aclosing(follow) as items:  # leave the feed as we end
            async for item in items:
                if not isinstance(item, Changed):
                    yield item
                    continue
                job = item.state
                if job is None or job[0] in FINAL:  # expired, or the client saw the end
                    return
                if job[1:] != last_progress:
                    last_progress = job[1:]
                    yield JobProgressTick(*last_progress)
