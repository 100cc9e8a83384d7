"""Runs jobs in the API process, keeps their record current, and resumes orphans.

One asyncio task per job runs :func:`rewardd.service.pipeline.score` exactly as ``/v1/score`` does
(same executor, same run state of the tenant), with two hooks:

* ``progress`` counts finished checks; ``on_group`` hands over each group as soon as every
  reward component of it is settled, and the runner turns it into a ``group`` event (the
  group's per-rollout ``reward``, ``rewards``, ``status`` and ``excluded``, built with the
  same :func:`rewardd.service.table.combine` the final response uses, so they are equal to the
  result's; advantages only come with the result, because estimators such as ``ha_dw`` or
  ``rloo`` over a batch need every group).
* A watcher task writes progress and pending group events to the store at most every
  :data:`FLUSH_EVERY_S` (one round trip), and every :data:`RENEW_EVERY_S` renews the job's
  lease, which also tells it whether the job was cancelled meanwhile (by ``DELETE`` on any
  pod) or taken over by another pod: then it cancels the job's task.

While running, a job holds its tenant's limiter slot (slot id = job id; the route took it at
submit, so the job counts toward ``max_concurrent_jobs`` like a scoring request), and its
verifier calls are one flow of the executors' fair queue (flow id = job id,
:mod:`rewardd.workers.fairness`), however many groups it has.

Cancellation: cancelling the task cancels ``pipeline.score``: the embedded executor cancels
its pebble tasks (queued ones dropped, running ones' workers replaced), the Celery executor
drops its waiters and revokes the tasks (see ``workers/distributed.py``).

Durability (Redis store only): the pod running a job holds its lease (``...:lease``,
:data:`rewardd.service.jobs.store.LEASE_S`, renewed every second). Every pod runs a sweeper
(:meth:`JobRunner.start`, from the app's lifespan) that every :data:`SWEEP_EVERY_S` looks for
active jobs without a lease (their pod died or stopped), claims each with one atomic script
(``SET NX``: exactly one pod wins), re-acquires the tenant slot with ``force=True`` and runs
the job again from its stored request. Verifier calls are idempotent, so re-running the whole
batch is correct; its progress restarts from 0 (``attempts`` says it was resumed), and group
events already published are not sent again. A pod that stops cleanly (SIGTERM) releases the
leases of its jobs so another pod resumes them at once. With the memory store (embedded
mode) there is nobody to resume: a job cut short by shutdown is marked failed.

Known edge: a pod that dies after the advantage step committed a ``run_id``'s run state but
before storing the result re-runs the batch on resume, so stateful entries see it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from typing import Any, Sequence

import orjson

from rewardd.service import pipeline, replay
from rewardd.service.cancellation import stop_if_cancelled
from rewardd.advantages.errors import RequestInvalid
from rewardd.service.events import encode_event
from rewardd.service.jobs.store import FAILED, REVERIFY, SUCCEEDED, Job, JobStore
from rewardd.service.models import RewardSpec, ScoreRequest
from rewardd.service.replaymodels import ReverifyJob
from rewardd.service.runtime import Runtime
from rewardd.advantages.table import Column, FlatBatch, combine, precomputed_columns
from rewardd.service.tenancy import Tenant
from rewardd.workers import fairness
from rewardd.workers.executor import CallResult
from rewardd.workers.logs import bound

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 0.2
"""Progress and group events reach the store at most this often (one round trip each)."""

RENEW_EVERY_S = 1.0
"""Lease renewal, which is also how a pod notices a cancel made through another pod."""

SWEEP_EVERY_S = 2.0
"""How often each pod looks for orphaned jobs to resume."""

SHUTDOWN_WAIT_S = 10.0


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def dump_result(result: dict[str, Any]) -> bytes:
    """The ``/v1/score`` response as the route's JSON renders it."""
    return orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)


def group_payload(flat: FlatBatch, gi: int, start: int, specs: Sequence[RewardSpec],
                  results: Sequence[CallResult], precomputed: Sequence[Column]
                  ) -> dict[str, Any]:
    """A finished group's rewards, exactly as the final response will show them: the
    group's verifier columns plus its slice of the batch's precomputed columns, combined
    by :func:`rewardd.service.table.combine`."""
    group = flat.groups[gi]
    n = len(group.rollouts)
    columns = [Column(spec.name, spec.weight, spec.fallback,
                      [item.outcome for item in result.items])
               for spec, result in zip(specs, results)]
    columns += [Column(col.name, col.weight, col.fallback, col.cells[start:start + n],
                       col.echo) for col in precomputed]
    combined = combine(columns, n)
    return {"group_index": gi, "group_id": group.group_id, "rollouts": [
        {"rollout_id": rollout.rollout_id, "reward": combined.reward[i],
         "rewards": combined.rewards[i], "status": combined.status[i],
         "excluded": combined.reward[i] is None}
        for i, rollout in enumerate(group.rollouts)]}


class _Tracker:
    """Progress of one running job, and its events, between flushes."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.pending: list[bytes] = []
        self.dirty = True  # the first flush stores progress 0 of this attempt

    def progress(self, n: int) -> None:
        self.done += n
        self.dirty = True


class _ScoreTracker(_Tracker):
    """A scoring job's tracker: finished groups become ``group`` events."""

    def __init__(self, req: ScoreRequest, total: int, skip: set[int]) -> None:
        super().__init__(total)
        self.flat = FlatBatch.of(req.groups)
        self.specs = req.rewards
        self.precomputed = precomputed_columns(self.flat.rollouts, req.advantage.weights)
        self.starts: list[int] = []
        offset = 0
        for group in req.groups:
            self.starts.append(offset)
            offset += len(group.rollouts)
        self.skip = skip

    def group(self, gi: int, results: list[CallResult]) -> None:
        if gi in self.skip:  # published by an earlier attempt
            return
        payload = group_payload(self.flat, gi, self.starts[gi], self.specs, results,
                                self.precomputed)
        payload["progress"] = {"done": self.done, "total": self.total}
        self.pending.append(encode_event("group", payload))
        self.dirty = True


class JobRunner:
    """The jobs of this API process, and the sweeper that resumes other pods' orphans.

    Reads the executor from ``runtime`` when a job starts (the app's lifespan attaches it
    after this runner is built)."""

    def __init__(self, runtime: Runtime, store: JobStore) -> None:
        self.runtime = runtime
        self.store = store
        self.owner = _owner()
        self._tasks: dict[str, asyncio.Task] = {}
        self._reasons: dict[str, str] = {}
        self._sweeper: asyncio.Task | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sweeper (durable stores only)."""
        if self.store.durable and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def close(self) -> None:
        """Stop the sweeper and this process's jobs: with a durable store they are left to
        other pods (leases released); in memory they are marked failed."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(BaseException):
                await self._sweeper
            self._sweeper = None
        tasks = list(self._tasks.items())
        for job_id, _ in tasks:
            self.cancel(job_id, "shutdown")
        if tasks:
            await asyncio.wait([task for _, task in tasks], timeout=SHUTDOWN_WAIT_S)

    def running(self) -> list[str]:
        """Ids of the jobs this process runs now."""
        return list(self._tasks)

    # ---- running --------------------------------------------------------------------------

    def launch(self, job: Job, req: ScoreRequest | ReverifyJob | None = None) -> None:
        """Run ``job`` in the background (``req``: its request, else read from the store)."""
        with bound(job_id=job.id, tenant=job.tenant):  # the task's log lines carry them
            task = asyncio.get_running_loop().create_task(self._run(job, req),
                                                          name=f"rewardd-job-{job.id}")
        self._tasks[job.id] = task

        def forget(done: asyncio.Task) -> None:
            if self._tasks.get(job.id) is done:
                del self._tasks[job.id]
            self._reasons.pop(job.id, None)

        task.add_done_callback(forget)

    def cancel(self, job_id: str, reason: str = "cancelled") -> bool:
        """Cancel the job's task here, if this process runs it. ``reason``: cancelled (the
        store already says so), lost (another pod took it over), shutdown."""
        task = self._tasks.get(job_id)
        if task is None or task.done():
            return False
        self._reasons.setdefault(job_id, reason)
        task.cancel()
        return True

    async def _run(self, job: Job, req: ScoreRequest | ReverifyJob | None) -> None:
        runtime = self.runtime
        tenant = Tenant(job.tenant, job.tenant_limit, 1)
        limiter = runtime.limiter
        keep: asyncio.Task | None = None
        watch: asyncio.Task | None = None
        release_slot = True
        try:
            # taken at submit; a resumed job takes it again regardless of the limit
            await limiter.acquire(tenant, job.id, force=True)
            keep = asyncio.create_task(limiter.keep(tenant, job.id))
            body = None
            if req is None:
                body = await self.store.body(job.id)
                if body is None:
                    await self.store.finish(job, FAILED, error="the job's request was lost")
                    return
            started = await self.store.start(job.id)
            if started is None:  # cancelled before it started, or expired
                return
            if job.kind == REVERIFY:
                replayed = (req if isinstance(req, ReverifyJob)
                            else ReverifyJob.model_validate_json(body or b""))
                tracker: _Tracker = _Tracker(job.total)
                work = self._reverify(job, replayed, tracker)
            else:
                score = (req if isinstance(req, ScoreRequest)
                         else ScoreRequest.model_validate_json(body or b""))
                tracker = _ScoreTracker(score, job.total,
                                        await self._published(job.id, started))
                work = self._score(job, score, tracker)
            watch = asyncio.create_task(self._watch(job.id, tracker))
            result = await work
            watch.cancel()
            await self._flush(job.id, tracker)
            data = await asyncio.to_thread(dump_result, result)
            await self.store.finish(job, SUCCEEDED, result=data, done=tracker.done)
        except asyncio.CancelledError:
            reason = self._reasons.get(job.id, "shutdown")
            if reason == "lost":
                release_slot = False  # the pod that took it over holds the same slot
            elif reason == "shutdown":
                if self.store.durable:
                    release_slot = False  # the pod that resumes it takes the slot over
                else:
                    with contextlib.suppress(Exception):
                        await self.store.finish(job, FAILED, error="the API process stopped "
                                                "before the job finished")
        except RequestInvalid as exc:  # found late (e.g. an estimator's output rule)
            await self._fail(job, f"invalid request: {exc}")
        except Exception as exc:
            log.exception("job %s failed", job.id)
            await self._fail(job, f"{type(exc).__name__}: {exc}")
        finally:
            if watch is not None:
                watch.cancel()
            if keep is not None:
                keep.cancel()
            if release_slot:
                with contextlib.suppress(Exception):
                    await limiter.release(tenant, job.id)
            with contextlib.suppress(Exception):
                await self.store.release(job.id, self.owner)

    async def _published(self, job_id: str, started: Job) -> set[int]:
        """Groups an earlier attempt of a resumed job already published (not sent again)."""
        skip: set[int] = set()
        if started.attempts > 1:
            for event in await self.store.events(job_id):
                if event.kind == "group":
                    skip.add(orjson.loads(event.data)["group_index"])
        return skip

    async def _score(self, job: Job, req: ScoreRequest, tracker: _ScoreTracker
                     ) -> dict[str, Any]:
        """A /v1/score body, exactly as the route runs it."""
        runtime = self.runtime
        with fairness.flow(job.tenant, job.id):  # one flow of the fair queue per job
            return await pipeline.score(
                req, runtime.executor, runtime.settings, progress=tracker.progress,
                runs=runtime.runs.for_tenant(job.tenant), on_group=tracker.group,
                record=runtime.records.for_tenant(job.tenant),
                cache=runtime.verdicts.view(job.tenant, req.cache))

    async def _reverify(self, job: Job, body: ReverifyJob, tracker: _Tracker
                        ) -> dict[str, Any]:
        """A replay of a recorded run (:mod:`rewardd.service.replay`), one flow of the fair
        queue like a scoring job."""
        runtime = self.runtime
        store = await asyncio.to_thread(runtime.records.store)
        with fairness.flow(job.tenant, job.id):
            return await replay.reverify(store, job.tenant, body.run_id, body.request,
                                         runtime.executor, runtime.settings, tracker.progress)

    async def _fail(self, job: Job, error: str) -> None:
        try:
            await self.store.finish(job, FAILED, error=error)
        except Exception:
            log.exception("could not mark job %s failed", job.id)

    async def _flush(self, job_id: str, tracker: _Tracker) -> None:
        events, tracker.pending, tracker.dirty = tracker.pending, [], False
        try:
            active = await self.store.record(job_id, tracker.done, events)
        except BaseException:
            tracker.pending[:0] = events  # try again at the next flush
            tracker.dirty = True
            raise
        if not active:
            self.cancel(job_id, "cancelled")

    async def _watch(self, job_id: str, tracker: _Tracker) -> None:
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            try:
                if tracker.dirty:
                    await self._flush(job_id, tracker)
                if loop.time() - renewed >= RENEW_EVERY_S:
                    renewed = loop.time()
                    status = await self.store.renew(job_id, self.owner)
                    if status != "ok":
                        self.cancel(job_id, "lost" if status == "lost" else "cancelled")
                        return
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis hiccup: retried at the next tick
                log.warning("job %s: could not update its record", job_id, exc_info=True)

    # ---- resuming orphans -----------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("job sweeper: could not look for orphaned jobs", exc_info=True)
            stop_if_cancelled()  # a cancel the Redis client swallowed (service/cancellation.py)
            await asyncio.sleep(SWEEP_EVERY_S)

    async def sweep(self) -> list[str]:
        """Claim and resume every active job whose lease expired; their ids."""
        resumed = []
        for job_id in await self.store.orphans():
            if job_id in self._tasks or not await self.store.claim(job_id, self.owner):
                continue
            job = await self.store.get(job_id)
            if job is None or not job.active:
                await self.store.release(job_id, self.owner)
                continue
            log.warning("resuming job %s of tenant %r: the API pod that ran it stopped "
                        "renewing its lease", job_id, job.tenant)
            self.launch(job)
            resumed.append(job_id)
        return resumed
