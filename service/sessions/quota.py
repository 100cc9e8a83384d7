"""Per-tenant bounds on what the session store keeps (issue #28): groups per session, groups
and bytes per tenant, and ended sessions retained per tenant.

Open sessions were bounded (``REWARDD_SESSION_MAX_OPEN``) but not what they hold, nor the
sessions that ended: one session with 30,000 groups took 380 MB of the API, and open/close
churn kept 1,300 sessions (1.2 GB) for ``REWARDD_SESSION_TTL_S``. Each store now counts, per
tenant and per session, the groups and the bytes stored (:meth:`SessionStore.take`, before
anything is written; in Redis one script, so the bound holds over every pod), and keeps the
tenant's ended sessions oldest first:

* past ``REWARDD_SESSION_TENANT_MAX_RETAINED`` ended sessions, the oldest are deleted at once
  (as if their ``REWARDD_SESSION_TTL_S`` had passed: 404 afterwards);
* an add that would pass the tenant's groups or bytes deletes the tenant's oldest *ended*
  sessions first, to make room (a trainer's finished steps never block its next one), and
  is refused (429 naming the bound and the setting) only when the open sessions alone hold
  too much. Open sessions are never deleted.

"Bytes" are what the tenant sent that the store keeps: each rollout's canonical JSON (as its
digest is computed), a new group's prompt and reference. The server's own *standing*
sessions (the per-sample protocols) are not counted: their requests are bounded where they
are parked, and their groups forgotten soon after they complete.

:class:`Ledger` is the in-process accounting (the memory store's); the Redis store keeps the
same in hashes and a sorted set per tenant (:mod:`rewardd.service.sessions.redis_store`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum

from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service.errors import ServiceError
from rewardd.service.sessions.errors import SessionBusy
from rewardd.service.settings import Settings

GROUPS = "stored session groups"
BYTES = "stored session bytes"
RETAINED = "retained ended sessions"
"""Bound names, as ``rewardd_tenant_stored{bound}`` reports them."""


class Refusal(IntEnum):
    """What :meth:`SessionStore.take` answers: nothing refused, or the bound in the way."""

    NONE = 0
    SESSION_GROUPS = 1
    TENANT_GROUPS = 2
    TENANT_BYTES = 3


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """The bounds, from the settings (defaults: ``Settings``' own)."""

    groups_per_session: int = 4096
    groups_per_tenant: int = 16384
    bytes_per_tenant: int = 64 * 1024 * 1024
    retained_per_tenant: int = 32

    @classmethod
    def of(cls, settings: Settings) -> StoreLimits:
        return cls(groups_per_session=settings.session_max_groups,
                   groups_per_tenant=settings.session_tenant_max_groups,
                   bytes_per_tenant=settings.session_tenant_max_bytes,
                   retained_per_tenant=settings.session_tenant_max_retained)


def refusal_error(refusal: Refusal, held: int, asked: int, *, tenant: str, sid: str,
                  limits: StoreLimits, retry_after_s: int) -> ServiceError:
    """The typed error of a refused add, naming the bound, its setting and what to do."""
    if refusal == Refusal.SESSION_GROUPS:
        return RequestInvalid([error(
            ("body", "groups"), f"session {sid} would hold {held + asked} groups; a session "
            f"holds at most {limits.groups_per_session} (REWARDD_SESSION_MAX_GROUPS): close "
            "it and send the rest to a new session", "value_error.session_groups")])
    if refusal == Refusal.TENANT_GROUPS:
        what, limit, setting = "groups", limits.groups_per_tenant, \
            "REWARDD_SESSION_TENANT_MAX_GROUPS"
    else:
        what, limit, setting = "bytes", limits.bytes_per_tenant, \
            "REWARDD_SESSION_TENANT_MAX_BYTES"
    return SessionBusy(f"tenant {tenant!r} would store {held + asked} {what} in its open "
                       f"sessions (the limit is {limit}, {setting}); close or cancel a "
                       "session, or ask the operator to raise it", tenant=tenant,
                       retry_after_s=retry_after_s)


class Ledger:
    """In-process counts: per tenant, each stored session's groups and bytes, and its ended
    sessions oldest first. Every method is synchronous and answers the sessions it evicted,
    for the store to delete; a lock makes them safe against the metrics scrape's thread."""

    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._held: dict[str, dict[str, list[int]]] = {}  # tenant -> sid -> [groups, bytes]
        self._ended: dict[str, OrderedDict[str, None]] = {}

    def take(self, tenant: str, sid: str, groups: int, nbytes: int
             ) -> tuple[Refusal, int, list[str]]:
        """Count ``groups`` and ``nbytes`` more for open session ``sid``, evicting the
        tenant's oldest ended sessions for room: (refusal, the amount held against it,
        evicted sessions)."""
        with self._lock:
            held = self._held.setdefault(tenant, {})
            own = held.get(sid, [0, 0])
            if own[0] + groups > self.limits.groups_per_session:
                return Refusal.SESSION_GROUPS, own[0], []
            ended = self._ended.setdefault(tenant, OrderedDict())
            evicted: list[str] = []

            def totals() -> tuple[int, int]:
                return sum(h[0] for h in held.values()), sum(h[1] for h in held.values())

            g, b = totals()
            while ended and (g + groups > self.limits.groups_per_tenant
                             or b + nbytes > self.limits.bytes_per_tenant):
                oldest, _ = ended.popitem(last=False)
                gone = held.pop(oldest, [0, 0])
                g, b = g - gone[0], b - gone[1]
                evicted.append(oldest)
            if g + groups > self.limits.groups_per_tenant:
                return Refusal.TENANT_GROUPS, g, evicted
            if b + nbytes > self.limits.bytes_per_tenant:
                return Refusal.TENANT_BYTES, b, evicted
            held[sid] = [own[0] + groups, own[1] + nbytes]
            return Refusal.NONE, 0, evicted

    def give(self, tenant: str, sid: str, groups: int, nbytes: int) -> None:
        """Uncount what :meth:`take` counted and was not stored after all."""
        with self._lock:
            own = self._held.get(tenant, {}).get(sid)
            if own is not None:
                own[0], own[1] = max(0, own[0] - groups), max(0, own[1] - nbytes)

    def ended(self, tenant: str, sid: str) -> list[str]:
        """Session ``sid`` ended: retained, evicting the oldest past the bound."""
        with self._lock:
            ended = self._ended.setdefault(tenant, OrderedDict())
            ended[sid] = None
            evicted = []
            while len(ended) > self.limits.retained_per_tenant:
                oldest, _ = ended.popitem(last=False)
                self._held.get(tenant, {}).pop(oldest, None)
                evicted.append(oldest)
            return evicted

    def forget(self, tenant: str, sid: str) -> None:
        """The session is gone (expired, evicted, purged)."""
        with self._lock:
            self._held.get(tenant, {}).pop(sid, None)
            self._ended.get(tenant, OrderedDict()).pop(sid, None)

    def usage(self) -> dict[tuple[str, str], int]:
        with self._lock:
            out: dict[tuple[str, str], int] = {}
            for tenant in set(self._held) | set(self._ended):
                held = self._held.get(tenant, {}).values()
                out[(tenant, GROUPS)] = sum(h[0] for h in held)
                out[(tenant, BYTES)] = sum(h[1] for h in held)
                out[(tenant, RETAINED)] = len(self._ended.get(tenant, ()))
            return out
