"""The service's errors (:mod:`rewardd.service.errors`) as ``google.rpc.Status``: one
mapping, used by every call; REST maps the same errors in the app's handlers.

=====================  ====================  =======================================
REST                   gRPC code             details
=====================  ====================  =======================================
422 (RequestInvalid)   INVALID_ARGUMENT      BadRequest (one violation per item:
                                             field = loc joined by '.', description
                                             = msg, reason = type), ErrorInfo
400 body undecodable   INVALID_ARGUMENT      ErrorInfo body_invalid
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
branches on it without parsing messages.
"""

from __future__ import annotations

import logging
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


def _info(reason: str, **metadata: str) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)


def _field(loc: Any) -> str:
    return ".".join(str(part) for part in loc)


def status_of(exc: Exception) -> status_pb2.Status:
    """The Status for one of the service's typed failures; INTERNAL for anything else (a
    bug: logged here, and the client is told no more than REST's 500 tells it)."""
    details: list[Any]
    if isinstance(exc, RequestInvalid):
        violations = [error_details_pb2.BadRequest.FieldViolation(
            field=_field(e["loc"]), description=e["msg"], reason=e.get("type", "value_error"))
            for e in exc.errors]
        first = exc.errors[0] if exc.errors else {"loc": ("body",), "msg": "invalid"}
        code, message = code_pb2.INVALID_ARGUMENT, f"{_field(first['loc'])}: {first['msg']}"
        details = [error_details_pb2.BadRequest(field_violations=violations),
                   _info("request_invalid")]
    elif isinstance(exc, BodyError):
        code = code_pb2.RESOURCE_EXHAUSTED if exc.status == 413 else code_pb2.INVALID_ARGUMENT
        message = exc.message
        details = [_info("body_too_large" if exc.status == 413 else "body_invalid")]
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
    status = status_pb2.Status(code=code, message=message)
    for detail in details:
        status.details.add().Pack(detail)
    return status


async def abort_with(context: grpc.aio.ServicerContext, status: status_pb2.Status) -> None:
    """End the call with ``status`` (its details in ``grpc-status-details-bin``)."""
    from grpc_status import rpc_status

    await context.abort_with_status(rpc_status.to_status(status))
