"""Typed errors of the rewardd client: one class per thing a caller does differently.

A trainer catches :class:`InvalidRequest` to fix its batch (``.errors`` names each field by
its path), :class:`TooBusy` to slow down, :class:`Unauthorized` to fix its key, and lets the
rest propagate. Every class derives from :class:`RewarddError`, which keeps the server's
``status`` and raw ``detail`` (what the client raised before these classes existed, so
``except RewarddError`` and ``.detail`` still work).

Why classes by status and not one class with a ``kind`` field: ``except`` clauses are how
Python code branches on failures, and a subclass per reaction keeps those clauses short.
The statuses map as the server uses them (``service/api/bodies.py``): 400/415/422 are the
request's fault, 413 the batch's size, 429 the tenant's concurrency, 503 readiness.

Failures that carry no HTTP status (the connection itself, a job that ended failed) have
``status`` None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

Loc = Sequence[Union[str, int]]


@dataclass(frozen=True)
class FieldError:
    """One invalid field: ``loc`` as the server sent it (``["body", "groups", 0, ...]``),
    ``path`` the same joined with dots, ``msg`` the reason, ``type`` its machine name."""

    loc: tuple[str | int, ...]
    msg: str
    type: str = "value_error"

    @property
    def path(self) -> str:
        return ".".join(map(str, self.loc))

    def __str__(self) -> str:
        return f"{self.path}: {self.msg}"


def field_errors(detail: Any) -> list[FieldError]:
    """The field errors of a 422 ``detail`` (a list of ``{loc, msg, type}``); [] for a plain
    string detail."""
    if not isinstance(detail, list):
        return []
    return [FieldError(tuple(item.get("loc") or ()), str(item.get("msg", "")),
                       str(item.get("type", "value_error")))
            for item in detail if isinstance(item, Mapping)]


class RewarddError(Exception):
    """A request rewardd refused or could not serve; ``status`` is the HTTP status (None
    when there was no answer), ``detail`` the server's explanation as sent."""

    advice = ""  # what to do next, appended to the message

    def __init__(self, status: int | None, detail: Any, *, attempts: int = 1) -> None:
        self.status = status
        self.detail = detail
        self.attempts = attempts
        super().__init__(self._message())

    def _explain(self) -> str:
        return str(self.detail)

    def _message(self) -> str:
        head = f"rewardd answered {self.status}" if self.status is not None else "rewardd"
        tries = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        tail = f"; {self.advice}" if self.advice else ""
        return f"{head}{tries}: {self._explain()}{tail}"


class InvalidRequest(RewarddError):
    """400, 415 or 422: the request itself is wrong; resending it unchanged cannot help."""

    advice = "fix the named fields and resend"

    def __init__(self, status: int | None, detail: Any, *, attempts: int = 1) -> None:
        self.errors = field_errors(detail)
        super().__init__(status, detail, attempts=attempts)

    def _explain(self) -> str:
        return "; ".join(map(str, self.errors)) if self.errors else str(self.detail)


class Unauthorized(RewarddError):
    """401 or 403: the API key is missing, unknown or not allowed this call."""

    advice = "pass a valid api_key (Authorization: Bearer <key>)"


class NotFound(RewarddError):
    """404: no such route, verifier or job (a job also vanishes job_ttl_s after it ends,
    and another tenant's job is never visible)."""


class PayloadTooLarge(RewarddError):
    """413: the body is over the server's (or the tenant's) size limit."""

    advice = "split the batch into smaller requests"


class TooBusy(RewarddError):
    """429 after the client's retries: the tenant already runs as many requests and jobs as
    it may. ``retry_after`` is the server's last ``Retry-After``, in seconds (or None)."""

    advice = "wait and retry, raise max_retries/max_wait_s, or send fewer concurrent batches"

    def __init__(self, status: int | None, detail: Any, *, attempts: int = 1,
                 retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(status, detail, attempts=attempts)


RateLimited = TooBusy


class ServerError(RewarddError):
    """5xx: the server failed; the server's log has the reason."""

    advice = "see the server log; the request may succeed if resent"


class Unavailable(ServerError):
    """503 after the client's retries: the server (or a proxy before it) is not ready."""

    advice = "the server is not ready (GET /readyz says why); retry later"


class ConnectionFailed(RewarddError):
    """No answer at all (refused, reset, timed out) after the client's retries; the httpx
    exception is ``__cause__``."""

    advice = "check that rewardd is running at base_url and reachable"


class JobFailed(RewarddError):
    """A job ended ``failed`` or ``cancelled``; ``job`` is its status as GET shows it."""

    def __init__(self, job: Mapping[str, Any]) -> None:
        self.job = dict(job)
        super().__init__(None, job.get("error") or f"job {job.get('id')} {job.get('state')}")

    def _message(self) -> str:
        return (f"rewardd job {self.job.get('id')} ended {self.job.get('state')}: "
                f"{self.detail}")


_BY_STATUS: dict[int, type[RewarddError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Unauthorized, 404: NotFound,
    413: PayloadTooLarge, 415: InvalidRequest, 422: InvalidRequest, 429: TooBusy,
    503: Unavailable,
}


def error_for(status: int, detail: Any, *, attempts: int = 1,
              retry_after: float | None = None) -> RewarddError:
    """The typed error for an HTTP error answer."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else RewarddError)
    if cls is TooBusy:
        return TooBusy(status, detail, attempts=attempts, retry_after=retry_after)
    return cls(status, detail, attempts=attempts)
