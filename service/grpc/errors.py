"""The service's errors (:mod:`rewardd.service.errors`) as ``google.rpc.Status``: one
mapping, used by every call; REST maps the same errors in the app's handlers.

=====================  ====================  =======================================
REST                   gRPC code             details
=====================  ====================  =======================================
422 (RequestInvalid)   INVALID_ARGUMENT      BadRequest (one violation per item:
                                             field = loc joined by '.', description
                                             = msg, reason = type), ErrorInfo
400 body undecodable   INVALID_ARGUMENT      BadRequest (body), ErrorInfo body_invalid
413 body too large     RESOURCE_EXHAUSTED    ErrorInfo body_too_large
429 (Busy)             RESOURCE_EXHAUSTED    ErrorInfo tenant_busy, RetryInfo
401 (Unauthenticated)  UNAUTHENTICATED       ErrorInfo unauthenticated
404 (NotFound)         NOT_FOUND             ErrorInfo not_found
409 (Conflict)         ABORTED               ErrorInfo conflict
503 (Unavailable)      UNAVAILABLE           ErrorInfo unavailable, RetryInfo
504 (TimedOut)         DEADLINE_EXCEEDED     ErrorInfo timed_out
500 (anything else)    INTERNAL              ErrorInfo internal (the server logs it)
=====================  ====================  =======================================

ErrorInfo's domain is ``rewardd``; its reason is the failure kind above, so a client
branches on it without parsing messages. Malformed protobuf is INVALID_ARGUMENT with a
BadRequest violation on ``body`` (reason ``protobuf_invalid``).

A status travels in the call's trailing metadata (``grpc-message``, and the details base64
in ``grpc-status-details-bin``), which clients cap (8 KiB by default): a 10 KB job id echoed
into NOT_FOUND's message made the client see RESOURCE_EXHAUSTED instead. So every text is
cut here, once, for all errors (:func:`cut`): a run of more than :data:`ECHO_CHARS`
characters without a space (an echoed id or value) keeps its first ECHO_CHARS and says how
long it was, and a whole text stops at :data:`TEXT_CHARS`; violations stop when the details
would pass :data:`DETAILS_BYTES`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from rewardd.advantages.errors import RequestInvalid
from rewardd.service.codec import BodyError
from rewardd.service.errors import (Busy, Conflict, NotFound, ServiceError, TimedOut,
                                    Unauthenticated, Unavailable)

DOMAIN = "rewardd"
log = logging.getLogger(__name__)

_STATUS_CODES: dict[int, int] = {
    Unauthenticated.status: code_pb2.UNAUTHENTICATED, NotFound.status: code_pb2.NOT_FOUND,
    Conflict.status: code_pb2.ABORTED, Busy.status: code_pb2.RESOURCE_EXHAUSTED,
    Unavailable.status: code_pb2.UNAVAILABLE, TimedOut.status: code_pb2.DEADLINE_EXCEEDED}
"""The gRPC code of each service error, by its REST status (subclasses such as
``SessionNotFound`` share their family's)."""


ECHO_CHARS = 64
"""Characters kept of a run without spaces (an id or value the caller sent, echoed)."""
TEXT_CHARS = 1024
"""Characters kept of a status message or a detail's text."""
DETAILS_BYTES = 4096
"""Serialized size the BadRequest violations stop at (base64 in the trailers: ~5.5 KB)."""
_RUN = re.compile(r"\S{%d,}" % (ECHO_CHARS + 1))


def cut(text: str) -> str:
    """``text`` with each run of more than ECHO_CHARS non-space characters cut to its first
    ECHO_CHARS and ``…(N chars)``, then at most TEXT_CHARS characters long."""
    text = _RUN.sub(lambda run: f"{run.group()[:ECHO_CHARS]}…({len(run.group())} chars)", text)
    return text if len(text) <= TEXT_CHARS else f"{text[:TEXT_CHARS]}…({len(text)} chars)"


def _info(reason: str, **metadata: str) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN,
                                       metadata={k: cut(v) for k, v in metadata.items()})


def _field(loc: Any) -> str:
    return cut(".".join(str(part) for part in loc))


def _bad_request(errors: list[dict[str, Any]]) -> error_details_pb2.BadRequest:
    """One violation per error, in order, until the details would pass DETAILS_BYTES."""
    out = error_details_pb2.BadRequest()
    for e in errors:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=_field(e["loc"]), description=cut(e["msg"]), reason=e.get("type", "value_error"))
        if out.ByteSize() + violation.ByteSize() + 8 > DETAILS_BYTES:
            break
        out.field_violations.append(violation)
    return out


def status_of(exc: Exception) -> status_pb2.Status:
    """The Status for one of the service's typed failures; INTERNAL for anything else (a
    bug: logged here, and the client is told no more than REST's 500 tells it)."""
    details: list[Any]
    if isinstance(exc, RequestInvalid):
        first = exc.errors[0] if exc.errors else {"loc": ("body",), "msg": "invalid"}
        code, message = code_pb2.INVALID_ARGUMENT, f"{_field(first['loc'])}: {first['msg']}"
        details = [_bad_request(exc.errors), _info("request_invalid")]
    elif isinstance(exc, BodyError) and exc.status == 413:
        code, message = code_pb2.RESOURCE_EXHAUSTED, exc.message
        details = [_info("body_too_large")]
    elif isinstance(exc, BodyError):
        code, message = code_pb2.INVALID_ARGUMENT, exc.message
        details = [_bad_request([{"loc": ("body",), "msg": exc.message,
                                  "type": "body_invalid"}]), _info("body_invalid")]
    elif isinstance(exc, ServiceError) and type(exc).status in _STATUS_CODES:
        code, message = _STATUS_CODES[type(exc).status], exc.message
        metadata = {"tenant": exc.tenant} if isinstance(exc, Busy) else {}
        details = [_info(exc.reason, **metadata)]
        if exc.retry_after_s is not None:
            details.append(error_details_pb2.RetryInfo(
                retry_delay=duration_pb2.Duration(seconds=exc.retry_after_s)))
    else:
        log.error("gRPC call failed", exc_info=exc)
        code, message = code_pb2.INTERNAL, "internal server error (logged by the server)"
        details = [_info("internal")]
    status = status_pb2.Status(code=code, message=cut(message))
    for detail in details:
        status.details.add().Pack(detail)
    return status


async def abort_with(context: grpc.aio.ServicerContext, status: status_pb2.Status) -> None:
    """End the call with ``status`` (its details in ``grpc-status-details-bin``)."""
    from grpc_status import rpc_status

    await context.abort_with_status(rpc_status.to_status(status))
