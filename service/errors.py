"""The service's own failures: what request logic raises, whichever edge called it.

Request logic (jobs, sessions, the trainer protocols, verify, runs) lives below the edges and
must not speak HTTP: the same call is reached over REST, over gRPC and in process. So it
raises these, and each edge maps them in exactly one place: the REST app's exception handler
(:func:`rewardd.service.app.create_app`) and gRPC's :func:`rewardd.service.grpc.errors.status_of`.

=====================  ======  ===================  ==========================================
error                  REST    gRPC                 meaning for the caller
=====================  ======  ===================  ==========================================
RequestInvalid         422     INVALID_ARGUMENT     fix the named field (advantages.errors)
Unauthenticated        401     UNAUTHENTICATED      send a valid bearer key
NotFound               404     NOT_FOUND            no such thing for this tenant
Conflict               409     ABORTED              the thing changed state; read it again
Busy                   429     RESOURCE_EXHAUSTED   a per-tenant limit; retry after the delay
Unavailable            503     UNAVAILABLE          transient; retry after the delay
TimedOut               504     DEADLINE_EXCEEDED    the work did not finish in its time limit
=====================  ======  ===================  ==========================================

Every message says what to do next. ``retry_after_s`` becomes REST's ``Retry-After`` header
and gRPC's ``RetryInfo``.
"""

from __future__ import annotations

from typing import ClassVar


class ServiceError(Exception):
    """A failure the caller can act on; ``str(error)`` is the message it is shown."""

    status: ClassVar[int] = 500
    """The REST status this failure answers."""
    reason: ClassVar[str] = "internal"
    """A stable name of the failure kind (gRPC's ErrorInfo reason)."""

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        """REST headers the answer carries."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class Unauthenticated(ServiceError):
    """No valid bearer key where keys are configured."""

    status, reason = 401, "unauthenticated"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class NotFound(ServiceError):
    """No such job, session, group, run or verifier for this tenant (another tenant's things
    do not exist for it either)."""

    status, reason = 404, "not_found"


class Conflict(ServiceError):
    """The request contradicts the current state (a resent rollout with other content, a
    session or group no longer open)."""

    status, reason = 409, "conflict"


class Busy(ServiceError):
    """A tenant at one of its limits (work in flight, open sessions, samples waiting)."""

    status, reason = 429, "tenant_busy"

    def __init__(self, message: str, *, tenant: str, retry_after_s: int) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.tenant = tenant


class Unavailable(ServiceError):
    """Transient: a check failed without a fallback, a group could not be placed, a session
    ended under a waiting request. Retrying may succeed."""

    status, reason = 503, "unavailable"


class TimedOut(ServiceError):
    """The work did not complete within its configured time limit (a trainer protocol's
    group timeout with ``on_timeout: fail``)."""

    status, reason = 504, "timed_out"
