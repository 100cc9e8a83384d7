"""Scoring jobs: submit a /v1/score body, poll it, stream its finished groups, cancel it.

* ``POST /v1/jobs``: same body as ``/v1/score`` (JSON or msgpack). The body is validated
  now, with the validators ``/v1/score`` uses: an invalid one is a 422 and no job. The
  tenant's limiter slot is taken now too (slot id = job id): at ``max_concurrent_jobs`` the
  answer is 429 with ``Retry-After`` and no job is created. Answers **202** with
  ``{"id", "state", "links"}`` and a ``Location`` header naming the job.

  ``Idempotency-Key`` (optional header, at most 255 characters, scoped per tenant): a submit
  with a key this tenant already used returns **200** with the same job (whatever its state,
  running or finished, until it expires) and starts nothing, so a trainer may retry a submit
  whose answer it lost. The same key with a *different* body is a **422**
  (``loc: ["header", "Idempotency-Key"]``, type ``idempotency_key_reused``), following the
  IETF Idempotency-Key draft: the key is the client's mistake, and retrying will not help.
  "Same body" means the same validated request (JSON or msgpack, key order and explicit
  defaults do not matter).

* ``GET /v1/jobs/{id}``: ``{"id", "state", "progress": {"done", "total"}, "created_at",
  "started_at", "finished_at", "error", "attempts", "result"}``; ``result`` is exactly the
  ``/v1/score`` response once ``succeeded``, else null. JSON or msgpack per ``Accept``.

* ``GET /v1/jobs/{id}/events``: server-sent events (``text/event-stream``):

  - ``progress`` (no id): ``{"done", "total"}``, when it changed (polled every 0.25 s);
  - ``group`` (id = sequence number): one per finished group, ``{"group_index",
    "group_id", "rollouts": [{"rollout_id", "reward", "rewards", "status", "excluded"}],
    "progress"}``; the values equal those of the final result (advantages come only with
    the result: estimators may need the whole batch);
  - a terminal ``succeeded`` / ``failed`` / ``cancelled`` (id = sequence number):
    ``{"id", "state", "error"}``; then the stream ends. The result itself is fetched with
    ``GET /v1/jobs/{id}``.

  Reconnect with ``Last-Event-ID`` to get only later events (ids are stored with the job,
  so this works on any pod). The header must be an id the stream has sent: a decimal
  integer from 0 to the job's latest event id (blank counts as absent); anything else
  (``abc``, ``-1``, ``99999999999999999999999``, an id past the latest event) is a **422**
  naming the header, before the stream starts. An id past the end is refused rather than
  read as "resume from the end" because it names no event the client could have seen: a
  client that sends one has lost track of the stream, and an empty stream would hide that
  (it used to answer 200 and then cut the stream off on Redis). A comment line (``: keep-alive``) goes out after 15 s of
  silence, so proxies do not cut an idle stream.

* ``DELETE /v1/jobs/{id}``: cancel. Idempotent: always **200** with the job as GET shows it
  (without ``result``). An active job becomes ``cancelled`` at once (its runner, on
  whichever pod, stops within about a second); a job that already finished keeps its final
  state, so the answer says whether the cancel took effect.

Tenant isolation: a job belongs to the tenant whose key submitted it; for every other tenant
it does not exist (404, the same answer as for an id that never existed), and idempotency
keys of different tenants never meet.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from rewardd.service import pipeline
from rewardd.service.api.bodies import BUSY_RESPONSE, body, msgpack_content, responses
from rewardd.service.codec import read_model, render, wants_msgpack
from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service.gcpause import gc_paused
from rewardd.service.jobs.store import FINAL, SUCCEEDED, Event, Job, JobStore, key_digest
from rewardd.service.models import ErrorResponse, JobStatus, JobSubmitted, ScoreRequest
from rewardd.service.tenancy import AUTH_RESPONSES, Tenant, current_tenant

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)

IDEMPOTENCY_KEY_MAX = 255
STREAM_POLL_S = 0.25
HEARTBEAT_S = 15.0

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such job for this tenant (never existed, "
          "expired job_ttl_s after it finished, or another tenant's)."}}


BAD_EVENT_ID: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorResponse, "description": "`Last-Event-ID` is not an id this job's "
          "stream has sent (an integer from 0 to its latest event id)."}}


def _links(job_id: str) -> dict[str, str]:
    return {"status": f"/v1/jobs/{job_id}", "events": f"/v1/jobs/{job_id}/events"}


def _encode(req: ScoreRequest) -> tuple[bytes, str]:
    """(what the store keeps to re-run the job, digest of the request's meaning)."""
    with gc_paused():
        stored = req.model_dump_json(exclude_unset=True).encode()
        canonical = orjson.dumps(req.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return stored, hashlib.sha256(canonical).hexdigest()


def _submitted(request: Request, job: Job, status: int) -> Response:
    response = render(request, {"id": job.id, "state": job.state, "links": _links(job.id)},
                      status)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return response


def _same_body(job: Job, digest: str) -> Job:
    """``job``, which a submit's Idempotency-Key names; a 422 when its body differed."""
    if job.digest != digest:
        raise RequestInvalid([error(
            ("header", "Idempotency-Key"),
            f"this Idempotency-Key was already used for a different request body (job "
            f"{job.id}); send a new key with a new body", "idempotency_key_reused")])
    return job


async def _own(request: Request, tenant: Tenant, job_id: str) -> Job:
    job = await request.app.state.jobs.get_for(tenant.name, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return job


# One event of the stream, as OpenAPI 3.1 documents a text/event-stream (the schema of each
# event; 3.2's itemSchema says the same): its fields as sent, `data` a JSON text.
SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string",
                  "enum": ["progress", "group", "succeeded", "failed", "cancelled"]},
        "data": {"type": "string", "description": "The event's JSON object, as text."},
        "id": {"type": "string", "pattern": "^[0-9]+$",
               "description": "Sequence number (not on progress events); resume after it "
                              "with Last-Event-ID."},
    },
    "required": ["event", "data"],
}


@router.post("/jobs", status_code=202, response_model=None, openapi_extra=body(ScoreRequest),
             summary="Submit a scoring job",
             responses={**responses(JobSubmitted), **BUSY_RESPONSE,
                        202: {"model": JobSubmitted, "description": "Job created.",
                              "headers": {"Location": {"schema": {"type": "string"},
                                                       "description": "The job's URL."}}}})
async def submit(request: Request, tenant: Tenant = Depends(current_tenant),
                 idempotency_key: str | None = Header(
                     None, alias="Idempotency-Key", min_length=1,
                     max_length=IDEMPOTENCY_KEY_MAX,
                     description="Makes a retried submit return the same job (per tenant).")
                 ) -> Response:
    """Run a /v1/score body in the background; 202 with the job's id at once (200 with the
    existing job for a repeated `Idempotency-Key`)."""
    req = await read_model(request, ScoreRequest)
    job, created = await submit_job(request.app.state, tenant, req, idempotency_key)
    return _submitted(request, job, 202 if created else 200)


async def submit_job(state: Any, tenant: Tenant, req: ScoreRequest,
                     idempotency_key: str | None) -> tuple[Job, bool]:
    """Check ``req``, take the tenant's slot and start its job: (the job, True), or (the
    job an ``idempotency_key`` already named, False). The REST route and gRPC's SubmitJob
    both call this."""
    store: JobStore = state.jobs
    await asyncio.to_thread(pipeline.check_request, req, state.settings)  # a 422 now, never a
    # failed job; off the event loop like every CPU-heavy step (see service.pipeline)
    try:
        stored, digest = await asyncio.to_thread(_encode, req)
    except Exception as exc:  # e.g. msgpack bytes that JSON cannot carry
        raise RequestInvalid([error(("body",), f"the body cannot be stored as JSON for a "
                                    f"job: {exc}")]) from None
    idempotency = key_digest(idempotency_key) if idempotency_key is not None else None
    if idempotency is not None:
        existing = await store.find(tenant.name, idempotency)
        if existing is not None:
            return _same_body(existing, digest), False
    job = Job(id=uuid.uuid4().hex, tenant=tenant.name, tenant_limit=tenant.max_concurrent_jobs,
              total=sum(len(g.rollouts) for g in req.groups) * len(req.rewards),
              created_at=time.time(), idempotency=idempotency, digest=digest)
    await state.limiter.admit(tenant, job.id)  # 429: nothing created
    runner = state.job_runner
    try:
        created = await store.create(job, stored, runner.owner)
    except BaseException:
        await state.limiter.release(tenant, job.id)
        raise
    if created.id != job.id:  # a concurrent submit with the same key won
        await state.limiter.release(tenant, job.id)
        return _same_body(created, digest), False
    runner.launch(created, req)
    return created, True


@router.get("/jobs/{job_id}", response_model=None, summary="Job state, progress and result",
            responses={200: {"model": JobStatus, "content": msgpack_content(JobStatus)},
                       **NOT_FOUND})
async def status(job_id: str, request: Request,
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    """The job's state and progress; `result` is the /v1/score response once succeeded."""
    job = await _own(request, tenant, job_id)
    raw = await request.app.state.jobs.result(job.id) if job.state == SUCCEEDED else None
    view = job.view()
    if raw is None:
        return render(request, {**view, "result": None})
    if wants_msgpack(request):
        return render(request, {**view, "result": orjson.loads(raw)})
    # splice the stored bytes in: no decode and re-encode of a large result
    head = orjson.dumps(view)
    return Response(head[:-1] + b',"result":' + raw + b"}", media_type="application/json")


@router.delete("/jobs/{job_id}", response_model=None, summary="Cancel a job",
               responses={200: {"model": JobStatus, "description": "The job after the cancel "
                                "(a finished job keeps its final state); `result` is null."},
                          **NOT_FOUND})
async def cancel(job_id: str, request: Request,
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    """Cancel an active job (idempotent); answers the job's state afterwards."""
    job = await cancel_job(request.app.state, await _own(request, tenant, job_id))
    return render(request, {**job.view(), "result": None})


async def cancel_job(state: Any, job: Job) -> Job:
    """Cancel ``job`` if still active; the job afterwards (REST's DELETE and gRPC's
    CancelJob)."""
    if job.active:
        job = await state.jobs.finish(job, "cancelled") or job
        state.job_runner.cancel(job.id, "cancelled")  # this pod's runner at once; others
        # notice at their next lease renewal
    return job


_EVENT_ID = re.compile(r"[0-9]{1,19}")


async def resume_after(store: JobStore, job_id: str, header: str | None,
                       loc: tuple[str, ...] = ("header", "Last-Event-ID")) -> int:
    """The event id a ``Last-Event-ID`` header resumes after (0 without one); a 422 naming
    the header unless it is an id the job's stream has sent."""
    text = (header or "").strip()
    if not text:
        return 0
    last = await store.last_event(job_id)
    if _EVENT_ID.fullmatch(text) is None or int(text) > last:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise RequestInvalid([error(
            loc, f"must be the id of an event this job's stream has "
            f"sent: an integer from 0 to {last} (its latest event so far); got {shown!r}. "
            "Omit the header to read the stream from its start")])
    return int(text)


@dataclass(frozen=True, slots=True)
class JobProgressTick:
    """Progress of a running job, as a stream reports it between events."""

    done: int
    total: int


def _sse(event_id: int | None, kind: str, data: bytes) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\n".encode() + b"data: " + data + b"\n\n"


async def job_events(store: JobStore, job_id: str, after: int,
                     heartbeat_s: float | None = None
                     ) -> AsyncIterator[Event | JobProgressTick | None]:
    """The job's stored events after ``after`` as they happen, a :class:`JobProgressTick`
    when progress changed between them, ``None`` after ``heartbeat_s`` (default
    :data:`HEARTBEAT_S`) of silence; ends
    after the terminal event (or at once for a job that expired or already ended). The SSE
    stream and gRPC's WatchJob both read this."""
    heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    last_progress: tuple[int, int] | None = None
    while True:
        job = await store.get(job_id)  # before the events: a final state read here has its
        events = await store.events(job_id, after)  # terminal event in this read
        for event in events:
            yield event
            after = event.seq
            quiet_since = loop.time()
            if event.kind in FINAL:
                return
        if job is None or job.state in FINAL:  # expired, or the client saw the end already
            return
        if (job.done, job.total) != last_progress:
            last_progress = (job.done, job.total)
            yield JobProgressTick(job.done, job.total)
            quiet_since = loop.time()
        elif loop.time() - quiet_since >= heartbeat_s:
            yield None
            quiet_since = loop.time()
        await asyncio.sleep(STREAM_POLL_S)


async def _stream(store: JobStore, job_id: str, after: int) -> AsyncIterator[bytes]:
    async for item in job_events(store, job_id, after):
        if item is None:
            yield b": keep-alive\n\n"
        elif isinstance(item, JobProgressTick):
            yield _sse(None, "progress", orjson.dumps({"done": item.done, "total": item.total}))
        else:
            yield _sse(item.seq, item.kind, item.data)


@router.get("/jobs/{job_id}/events", response_class=StreamingResponse,
            summary="Stream of progress, finished groups and the end (server-sent events)",
            responses={200: {"description": "text/event-stream: `progress`, `group` and a "
                             "terminal `succeeded`/`failed`/`cancelled` event (see the "
                             "jobs documentation).",
                             "content": {"text/event-stream": {"schema": SSE_EVENT}}},
                       **NOT_FOUND, **BAD_EVENT_ID})
async def events(job_id: str, request: Request, tenant: Tenant = Depends(current_tenant),
                 last_event_id: str | None = Header(
                     None, alias="Last-Event-ID",
                     description="Resume after this event id (the stream's `id:` lines).")
                 ) -> StreamingResponse:
    """Events of the job as they happen; resumable with `Last-Event-ID`."""
    job = await _own(request, tenant, job_id)
    after = await resume_after(request.app.state.jobs, job.id, last_event_id)
    return StreamingResponse(_stream(request.app.state.jobs, job.id, after),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
