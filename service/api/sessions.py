"""Streaming sessions (/v1/sessions): rollouts scored as they arrive, advantages per completed
group. Built under issue #18; the work is :mod:`rewardd.service.sessions`' (see its docstring).

* ``POST /v1/sessions`` (a :class:`SessionSpec`) -> **201** ``{"session_id"}``, ``Location``.
* ``POST /v1/sessions/{id}/rollouts`` (``{"groups": [...]}``, the /v1/score shape, partial
  groups) -> ``{"accepted", "duplicates"}``; 409 for a conflicting resend or a group/session
  no longer open.
* ``POST /v1/sessions/{id}/groups/{group_id}/close``, ``GET
  /v1/sessions/{id}/groups/{group_id}?wait_s=`` (long-poll) -> ``{"group_id", "complete",
  "group"}``. Group ids may hold ``/`` (the rest of the path is the id; one ending in
  ``/close`` cannot be named in a path).
* ``GET /v1/sessions/{id}/events``: server-sent events, ``group`` (id = sequence number,
  data = the group object) and a last ``closed`` (data = the close's answer); resumable with
  ``Last-Event-ID`` on any pod, as job streams are.
* ``POST /v1/sessions/{id}/close`` -> the ``closed`` event's data; ``GET`` / ``DELETE
  /v1/sessions/{id}``: state / cancel.

A session belongs to the tenant that opened it; for others it does not exist (404).

Requests that stay open are held against the tenant's bounds on this API process (429 with
``Retry-After`` past them, before they start): the event stream against
``REWARDD_TENANT_MAX_STREAMS`` (64, with job streams), a group wait with ``wait_s > 0`` and the
close (it waits for the batch) against ``REWARDD_TENANT_MAX_LONG_POLLS`` (64).
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.convertors import Convertor, register_url_convertor

from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service.api.bodies import BUSY_RESPONSE, body, msgpack_content, responses
from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.api.streaming import LONG_POLLS_BUSY, STREAMS_BUSY, EventStreamResponse
from rewardd.service.codec import read_model, render
from rewardd.service.events import KEEP_ALIVE, resume_after, sse
from rewardd.service.holds import StreamHold, long_poll
from rewardd.service.models import (ErrorResponse, SessionAccepted, SessionClosed,
                                    SessionGroupWait, SessionOpened, SessionRollouts,
                                    SessionSpec, SessionState)
from rewardd.service.services import ServicesDep
from rewardd.service.sessions import SessionNotFound
from rewardd.service.tenancy import Tenant

class GroupIdConvertor(Convertor[str]):
    """A group id in a path: any characters, ``/`` included (ids like ``gsm8k/train/17``),
    but never ending in ``/close``, so ``GET .../groups/{id}`` and ``POST
    .../groups/{id}/close`` never both match one path (their Allow header stays exact)."""

    regex = r"(?:(?!/close$).)+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("group_id", GroupIdConvertor())

router = APIRouter(prefix="/v1", tags=["sessions"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)

MAX_WAIT_S = 60.0

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such session (or group) for this "
          "tenant: never existed, expired, or another tenant's."}}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorResponse, "description": "A rollout resent with other content, or a "
          "session or group that no longer takes rollouts."}}


def _ok(model: Any, **more: Any) -> dict[int | str, dict[str, Any]]:
    return {200: {"model": model, "content": msgpack_content(model)}, **NOT_FOUND, **more}


def _require_body(request: Request) -> None:
    """A request without a body is a 422 naming it (the codec would read nothing as
    invalid JSON, a 400)."""
    headers = request.headers
    if headers.get("content-length", "0").strip() == "0" and "transfer-encoding" not in headers:
        raise RequestInvalid([error(("body",), "a JSON or msgpack body is required",
                                    "missing")])


@router.post("/sessions", status_code=201, response_model=None, openapi_extra=body(SessionSpec),
             summary="Open a streaming session (one training step)",
             responses={**responses(SessionOpened), **BUSY_RESPONSE,
                        201: {"model": SessionOpened, "description": "Session opened.",
                              "headers": {"Location": {"schema": {"type": "string"},
                                                       "description": "The session's URL."}}}})
async def open_session(request: Request, services: ServicesDep,
                       tenant: Tenant = Depends(current_tenant)) -> Response:
    """Reward components, advantage spec, group size and timeout of the step; rollouts
    follow as they finish."""
    _require_body(request)
    spec = await read_model(request, SessionSpec, tenant)
    sid = await services.sessions.open(tenant, spec)
    response = render(request, {"session_id": sid}, 201)
    response.headers["Location"] = f"/v1/sessions/{sid}"
    return response


@router.post("/sessions/{session_id}/rollouts", response_model=None,
             openapi_extra=body(SessionRollouts), summary="Send finished rollouts",
             responses={**responses(SessionAccepted), **BUSY_RESPONSE, **NOT_FOUND,
                        **CONFLICT})
async def add_rollouts(session_id: str, request: Request, services: ServicesDep,
                       tenant: Tenant = Depends(current_tenant)) -> Response:
    """Rollouts in the /v1/score `groups` shape (partial groups; prompt and reference on a
    group's first sight); their checks start now. Resent rollouts are not scored twice."""
    manager = services.sessions
    await manager.owned(tenant, session_id)  # 404 before reading a body
    _require_body(request)
    req = await read_model(request, SessionRollouts, tenant)
    return render(request, await manager.add(tenant, session_id, req))


@router.get("/sessions/{session_id}", response_model=None, summary="Session state",
            responses=_ok(SessionState))
async def session_state(session_id: str, request: Request, services: ServicesDep,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
    return render(request, await services.sessions.status(tenant, session_id))


@router.delete("/sessions/{session_id}", response_model=None, summary="Cancel a session",
               responses=_ok(SessionState))
async def cancel_session(session_id: str, request: Request, services: ServicesDep,
                         tenant: Tenant = Depends(current_tenant)) -> Response:
    """Drop the session and its checks (idempotent); its state afterwards."""
    return render(request, await services.sessions.cancel(tenant, session_id))


@router.post("/sessions/{session_id}/close", response_model=None,
             summary="End the step: the batch's advantages",
             responses={**_ok(SessionClosed), **LONG_POLLS_BUSY})
async def close_session(session_id: str, request: Request, services: ServicesDep,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
    """Open groups complete from what arrived; once every check settled, the /v1/score
    response over the completed groups (batch-level estimators computed now)."""
    async with long_poll(services.runtime, tenant.name):  # it waits for the checks
        closed = await services.sessions.close(tenant, session_id)
    return render(request, closed)


@router.post("/sessions/{session_id}/groups/{group_id:group_id}/close", response_model=None,
             summary="Complete a group from what arrived", responses=_ok(SessionGroupWait))
async def close_group(session_id: str, group_id: str, request: Request, services: ServicesDep,
                      tenant: Tenant = Depends(current_tenant)) -> Response:
    group = await services.sessions.close_group(tenant, session_id, group_id)
    return render(request, {"group_id": group_id, "complete": group is not None,
                            "group": group})


@router.get("/sessions/{session_id}/groups/{group_id:group_id}", response_model=None,
            summary="A group's result (long-poll)",
            responses={**_ok(SessionGroupWait), **LONG_POLLS_BUSY})
async def wait_group(session_id: str, group_id: str, request: Request, services: ServicesDep,
                     tenant: Tenant = Depends(current_tenant),
                     wait_s: float = Query(0.0, ge=0, le=MAX_WAIT_S,
                                           description="Wait up to this long for the group "
                                           "to complete.")) -> Response:
    """The group's object once complete; `complete: false` if it is not within `wait_s`."""
    manager = services.sessions
    async with long_poll(services.runtime, tenant.name, waits=wait_s > 0):
        group = await manager.wait_group(tenant, session_id, group_id, wait_s)
    if group is None and not await manager.known_group(session_id, group_id):
        raise SessionNotFound(f"no group {group_id!r} in session {session_id}")
    return render(request, {"group_id": group_id, "complete": group is not None,
                            "group": group})


SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["group", "closed"]},
        "data": {"type": "string", "description": "The event's JSON object, as text: a "
                 "SessionGroupEvent, or SessionClosed."},
        "id": {"type": "string", "pattern": "^[0-9]+$",
               "description": "Sequence number; resume after it with Last-Event-ID."},
    },
    "required": ["event", "data", "id"],
}


@router.get("/sessions/{session_id}/events", response_class=StreamingResponse,
            summary="Completed groups, then the close (server-sent events)",
            responses={200: {"description": "text/event-stream: `group` events, then "
                             "`closed`.",
                             "content": {"text/event-stream": {"schema": SSE_EVENT}}},
                       **NOT_FOUND, **STREAMS_BUSY,
                       422: {"model": ErrorResponse, "description": "`Last-Event-ID` is not "
                             "an id this session's stream has sent."}})
async def session_events(session_id: str, request: Request, services: ServicesDep,
                         tenant: Tenant = Depends(current_tenant),
                         last_event_id: str | None = Header(
                             None, alias="Last-Event-ID",
                             description="Resume after this event id.")) -> StreamingResponse:
    """Each group's object as it completes; resumable with `Last-Event-ID`."""
    manager = services.sessions
    await manager.owned(tenant, session_id)  # 404 now, not inside the stream
    after = await resume_after(manager, session_id, last_event_id)

    async def stream() -> AsyncIterator[bytes]:
        async for event in manager.events(tenant, session_id, after):
            if event is None:
                yield KEEP_ALIVE
            else:
                yield sse(event.seq, event.kind, event.data)

    hold = StreamHold(services.runtime, tenant.name)  # 429 past the tenant's bound
    return EventStreamResponse(stream(), hold)

