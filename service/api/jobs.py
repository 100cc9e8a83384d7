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

  A tenant holds at most ``REWARDD_TENANT_MAX_STREAMS`` (64) open event streams (this one,
  session streams and gRPC WatchJob) per API process; past it the answer is **429** with
  ``Retry-After``, before the stream starts.

* ``DELETE /v1/jobs/{id}``: cancel. Idempotent: always **200** with the job as GET shows it
  (without ``result``). An active job becomes ``cancelled`` at once (its runner, on
  whichever pod, stops within about a second); a job that already finished keeps its final
  state, so the answer says whether the cancel took effect.

Tenant isolation: a job belongs to the tenant whose key submitted it; for every other tenant
it does not exist (404, the same answer as for an id that never existed), and idempotency
keys of different tenants never meet.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

import orjson
from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response, StreamingResponse

from rewardd.service.api.bodies import BUSY_RESPONSE, body, msgpack_content, responses
from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.api.streaming import STREAMS_BUSY, EventStreamResponse
from rewardd.service.codec import read_model, render, wants_msgpack
from rewardd.service.events import KEEP_ALIVE, sse
from rewardd.service.holds import StreamHold
from rewardd.service.jobs.service import IDEMPOTENCY_KEY_MAX, JobProgressTick, JobService
from rewardd.service.jobs.store import Job
from rewardd.service.models import ErrorResponse, JobStatus, JobSubmitted, ScoreRequest
from rewardd.service.services import ServicesDep
from rewardd.service.tenancy import Tenant

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such job for this tenant (never existed, "
          "expired job_ttl_s after it finished, or another tenant's)."}}


BAD_EVENT_ID: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorResponse, "description": "`Last-Event-ID` is not an id this job's "
          "stream has sent (an integer from 0 to its latest event id)."}}


def _links(job_id: str) -> dict[str, str]:
    return {"status": f"/v1/jobs/{job_id}", "events": f"/v1/jobs/{job_id}/events"}


IDEMPOTENCY_KEY: Any = Header(
    None, alias="Idempotency-Key", min_length=1, max_length=IDEMPOTENCY_KEY_MAX,
    description="Makes a retried submit return the same job (per tenant).")
"""The ``Idempotency-Key`` header of a job's submit (``POST /v1/jobs``, a reverify)."""


def submitted(request: Request, job: Job, status: int) -> Response:
    """The answer to a job's submit: its id, state and links, and its URL in Location."""
    response = render(request, {"id": job.id, "state": job.state, "links": _links(job.id)},
                      status)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return response


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
async def submit(request: Request, services: ServicesDep,
                 tenant: Tenant = Depends(current_tenant),
                 idempotency_key: str | None = IDEMPOTENCY_KEY) -> Response:
    """Run a /v1/score body in the background; 202 with the job's id at once (200 with the
    existing job for a repeated `Idempotency-Key`)."""
    req = await read_model(request, ScoreRequest, tenant)
    job, created = await services.jobs.submit(tenant, req, idempotency_key)
    return submitted(request, job, 202 if created else 200)


@router.get("/jobs/{job_id}", response_model=None, summary="Job state, progress and result",
            responses={200: {"model": JobStatus, "content": msgpack_content(JobStatus)},
                       **NOT_FOUND})
async def status(job_id: str, request: Request, services: ServicesDep,
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    """The job's state and progress; `result` is the /v1/score response once succeeded."""
    job = await services.jobs.own(tenant, job_id)
    raw = await services.jobs.result(job)
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
async def cancel(job_id: str, request: Request, services: ServicesDep,
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    """Cancel an active job (idempotent); answers the job's state afterwards."""
    jobs = services.jobs
    job = await jobs.cancel(await jobs.own(tenant, job_id))
    return render(request, {**job.view(), "result": None})


async def _stream(jobs: JobService, job_id: str, after: int) -> AsyncIterator[bytes]:
    async for item in jobs.watch(job_id, after):
        if item is None:
            yield KEEP_ALIVE
        elif isinstance(item, JobProgressTick):
            yield sse(None, "progress", orjson.dumps({"done": item.done, "total": item.total}))
        else:
            yield sse(item.seq, item.kind, item.data)


@router.get("/jobs/{job_id}/events", response_class=StreamingResponse,
            summary="Stream of progress, finished groups and the end (server-sent events)",
            responses={200: {"description": "text/event-stream: `progress`, `group` and a "
                             "terminal `succeeded`/`failed`/`cancelled` event (see the "
                             "jobs documentation).",
                             "content": {"text/event-stream": {"schema": SSE_EVENT}}},
                       **NOT_FOUND, **BAD_EVENT_ID, **STREAMS_BUSY})
async def events(job_id: str, services: ServicesDep,
                 tenant: Tenant = Depends(current_tenant),
                 last_event_id: str | None = Header(
                     None, alias="Last-Event-ID",
                     description="Resume after this event id (the stream's `id:` lines).")
                 ) -> StreamingResponse:
    """Events of the job as they happen; resumable with `Last-Event-ID`."""
    jobs = services.jobs
    job = await jobs.own(tenant, job_id)
    after = await jobs.resume_after(job.id, last_event_id)
    hold = StreamHold(services.runtime, tenant.name)  # 429 past the tenant's bound
    return EventStreamResponse(_stream(jobs, job.id, after), hold)
