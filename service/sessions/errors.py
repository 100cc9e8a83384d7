"""The sessions' failures: the service's own errors (:mod:`rewardd.service.errors`), which
each edge maps once (REST 404 / 409 / 429, gRPC NOT_FOUND / ABORTED / RESOURCE_EXHAUSTED)."""

from __future__ import annotations

from rewardd.service.errors import Busy, Conflict, NotFound


class SessionNotFound(NotFound):
    """No such session (or group) for this tenant (404)."""


class SessionConflict(Conflict):
    """A resent rollout with other content, or a session or group no longer open (409)."""


class SessionBusy(Busy):
    """A tenant at its limit of open sessions or rollouts in flight (429)."""
