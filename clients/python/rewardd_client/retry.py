"""Retries of the rewardd client: which failures are retried, how long to wait, when to stop.

429 and 503 mean the server did nothing (rewardd's tenant limiter answers 429 before a
request or job starts), so they are retried for every call, waiting the server's
``Retry-After`` (seconds or an HTTP date) when it sent one, else exponential backoff with
jitter. A failed connection is retried only where resending cannot do the work twice: a
connection never established, and calls marked resendable (reads, cancels, job submits,
which always carry an ``Idempotency-Key``). ``POST /v1/score`` may advance a stateful
estimator's run state, so a connection lost mid-request is raised, not resent.

:class:`Retrying` holds the decisions of one call without doing any I/O, so the blocking and
the asyncio clients share it and differ only in how they sleep. Waiting is bounded twice: by
the number of retries and by the total seconds slept per call.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Callable

import httpx

from rewardd_client.errors import ConnectionFailed

_ALWAYS_RETRIED = (httpx.ConnectError, httpx.ConnectTimeout)  # nothing reached the server


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for: delta-seconds or an HTTP date (RFC 9110);
    None when absent or unreadable, 0 for a date already past."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


@dataclass(frozen=True)
class RetryEvent:
    """What :attr:`RetryPolicy.on_retry` is told before each wait."""

    method: str
    path: str
    attempt: int
    """Attempts made so far (1 after the first failure)."""
    wait_s: float
    status: int | None
    """The answer's status (429, 503), or None when the connection failed."""
    retry_after: float | None
    error: BaseException | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried on 429, 503 and (where safe) a failed connection.

    A wait is the server's ``Retry-After`` plus up to ``jitter`` of it (so clients told the
    same number do not return at the same instant), else ``backoff_s * 2**(n-1)`` capped at
    ``max_backoff_s``, of which a random half is kept ("equal jitter"). At most
    ``max_retries`` retries, and at most ``max_wait_s`` seconds of waiting in all per call:
    a wait that would pass it is not started, the error is raised at once.
    """

    max_retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_wait_s: float = 120.0
    jitter: float = 0.1
    statuses: frozenset[int] = frozenset({429, 503})
    on_retry: Callable[[RetryEvent], None] | None = None
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def backoff(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1-based) without a ``Retry-After``."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    def honour(self, retry_after: float) -> float:
        return retry_after * (1 + self.rng.uniform(0, self.jitter))


class Retrying:
    """The retry decisions of one call (sans I/O: the sync and async loops only sleep)."""

    def __init__(self, policy: RetryPolicy, method: str, path: str, resendable: bool) -> None:
        self.policy, self.method, self.path = policy, method, path
        self.resendable = resendable
        self.attempts = 0
        self.waited = 0.0

    def wait_after(self, response: httpx.Response | None,
                   error: BaseException | None = None) -> float | None:
        """Seconds to wait before the next attempt, or None: ``response`` is final (return
        or raise it), or ``error`` must be raised."""
        self.attempts += 1
        if response is not None:
            if response.status_code not in self.policy.statuses:
                return None
            retry_after = retry_after_seconds(response.headers.get("retry-after"))
        elif isinstance(error, _ALWAYS_RETRIED) or (
                self.resendable and isinstance(error, httpx.TransportError)):
            retry_after = None
        else:
            return None
        if self.attempts > self.policy.max_retries:
            return None
        wait = (self.policy.honour(retry_after) if retry_after is not None
                else self.policy.backoff(self.attempts))
        if self.waited + wait > self.policy.max_wait_s:
            return None
        self.waited += wait
        if self.policy.on_retry is not None:
            self.policy.on_retry(RetryEvent(
                self.method, self.path, self.attempts, wait,
                response.status_code if response is not None else None, retry_after, error))
        return wait

    def after_error(self, error: httpx.TransportError) -> float:
        """Seconds to wait before resending after ``error``; raises :class:`ConnectionFailed`
        (from ``error``) when the call must end here."""
        wait = self.wait_after(None, error)
        if wait is None:
            raise ConnectionFailed(None, f"{self.method} {self.path}: {type(error).__name__}: "
                                   f"{error}", attempts=self.attempts) from error
        return wait
