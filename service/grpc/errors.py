"""The REST error vocabulary as ``google.rpc.Status``: one mapping, used by every call.

=====================  ====================  =======================================
REST                   gRPC code             details
=====================  ====================  =======================================
422 (RequestInvalid)   INVALID_ARGUMENT      BadRequest (one violation per item:
                                             field = loc joined by '.', description
                                             = msg, reason = type), ErrorInfo
400 body undecodable   INVALID_ARGUMENT      ErrorInfo body_invalid
413 body too large     RESOURCE_EXHAUSTED    ErrorInfo body_too_large
429 tenant busy        RESOURCE_EXHAUSTED    ErrorInfo tenant_busy, RetryInfo
401                    UNAUTHENTICATED       ErrorInfo unauthenticated
404                    NOT_FOUND             ErrorInfo not_found
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
from rewardd.service.limits import TenantBusy

DOMAIN = "rewardd"
log = logging.getLogger(__name__)


class Unauthenticated(Exception):
    """No valid ``authorization: Bearer <key>`` metadata where keys are configured."""


class NotFound(Exception):
    """No such verifier, or no such job for this tenant."""


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
    elif isinstance(exc, TenantBusy):
        code, message = code_pb2.RESOURCE_EXHAUSTED, str(exc)
        details = [_info("tenant_busy", tenant=exc.tenant.name),
                   error_details_pb2.RetryInfo(
                       retry_delay=duration_pb2.Duration(seconds=exc.retry_after_s))]
    elif isinstance(exc, Unauthenticated):
        code, message, details = code_pb2.UNAUTHENTICATED, str(exc), [_info("unauthenticated")]
    elif isinstance(exc, NotFound):
        code, message, details = code_pb2.NOT_FOUND, str(exc), [_info("not_found")]
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
