"""API keys and tenants: who is calling, and what they may use.

Shared rewardd serves several training teams. Each bearer token maps to a tenant; a tenant's
jobs and run state are visible to that tenant only, and each tenant has its own limits on
work in flight and on request size. Without configured keys every caller is the tenant
``default`` and no ``Authorization`` header is needed (embedded use on one machine).

Keys come from ``REWARDD_API_KEYS`` (``key=tenant,...``) and/or the JSON file named by
``REWARDD_API_KEYS_FILE``::

    {"tenants": {"team-a": {"keys": ["..."], "max_concurrent_jobs": 4,
                            "max_body_bytes": 67108864}}}

Keys are compared by their SHA-256 digest (a dict lookup on a digest reveals nothing useful
through timing, unlike comparing the keys themselves byte by byte), and never logged.

GET /metrics describes every tenant's traffic (routes, verifier outcomes, judge spend), so it
is guarded too (:func:`metrics_access`): by ``REWARDD_METRICS_TOKEN`` when set (a scrape
credential of its own, which tenants' keys do not replace: a tenant need not see the others'
traffic), else by the API keys when configured; open only on a server without either.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import orjson
from fastapi import HTTPException, Request

from rewardd.service.models import ErrorResponse
from rewardd.service.settings import Settings

DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class Tenant:
    """A caller's identity and limits."""

    name: str
    max_concurrent_jobs: int
    """Requests (score, rewards, advantages, verify) and jobs it may have running at once
    (beyond: 429); see :mod:`rewardd.service.limits`."""
    max_body_bytes: int
    """Largest request body it may send (beyond: 413)."""


class KeysInvalid(ValueError):
    """A key configuration that cannot be used; the message names the setting and problem."""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Digest of each configured key -> its tenant. Empty: authentication is off."""

    tenants: Mapping[str, Tenant]

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    def lookup(self, key: str) -> Tenant | None:
        return self.tenants.get(_digest(key))


def _tenant(name: str, limits: Mapping[str, Any], settings: Settings) -> Tenant:
    unknown = set(limits) - {"keys", "max_concurrent_jobs", "max_body_bytes"}
    if unknown:
        raise KeysInvalid(f"tenant {name!r}: unknown field(s) {sorted(unknown)} in "
                          "REWARDD_API_KEYS_FILE (allowed: keys, max_concurrent_jobs, "
                          "max_body_bytes)")
    jobs = limits.get("max_concurrent_jobs", settings.tenant_max_concurrent_jobs)
    body = limits.get("max_body_bytes", settings.max_body_bytes)
    for field, value in (("max_concurrent_jobs", jobs), ("max_body_bytes", body)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise KeysInvalid(f"tenant {name!r}: {field} must be a positive integer, "
                              f"got {value!r}")
    return Tenant(name, jobs, min(body, settings.max_body_bytes))


def load_keys(settings: Settings) -> KeyRing:
    """The key ring the settings describe; raises KeysInvalid naming what is wrong."""
    entries: list[tuple[str, str, Mapping[str, Any]]] = []  # (key, tenant, limits)
    for item in filter(None, (part.strip() for part in settings.api_keys.split(","))):
        key, sep, name = item.partition("=")
        if not sep or not key.strip() or not name.strip():
            raise KeysInvalid("REWARDD_API_KEYS entries are `key=tenant`, comma-separated; "
                              "one entry has no `=tenant`")
        entries.append((key.strip(), name.strip(), {}))
    if settings.api_keys_file:
        path = Path(settings.api_keys_file)
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise KeysInvalid(f"REWARDD_API_KEYS_FILE {str(path)!r}: {exc}") from None
        tenants = data.get("tenants") if isinstance(data, dict) else None
        if not isinstance(tenants, dict):
            raise KeysInvalid(f"REWARDD_API_KEYS_FILE {str(path)!r}: expected "
                              '{"tenants": {"name": {"keys": [...]}}}')
        for name, limits in tenants.items():
            keys = limits.get("keys") if isinstance(limits, dict) else None
            if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
                raise KeysInvalid(f"tenant {name!r}: `keys` must be a list of non-empty "
                                  "strings in REWARDD_API_KEYS_FILE")
            entries.extend((key, name, limits) for key in keys)
    ring: dict[str, Tenant] = {}
    limits_of: dict[str, Mapping[str, Any]] = {}
    for _, name, limits in entries:
        if limits or name not in limits_of:
            limits_of[name] = limits
    for key, name, _ in entries:
        digest = _digest(key)
        tenant = _tenant(name, limits_of[name], settings)
        if digest in ring and ring[digest].name != name:
            raise KeysInvalid(f"one API key is given to two tenants ({ring[digest].name!r} "
                              f"and {name!r})")
        ring[digest] = tenant
    return KeyRing(ring)


@lru_cache(maxsize=8)
def _default_tenant(max_concurrent_jobs: int, max_body_bytes: int) -> Tenant:
    return Tenant(DEFAULT_TENANT, max_concurrent_jobs, max_body_bytes)


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def current_tenant(request: Request) -> Tenant:
    """FastAPI dependency: the caller's tenant, or 401 when keys are configured and the
    request carries no valid ``Authorization: Bearer <key>``."""
    cached = getattr(request.state, "tenant", None)
    if cached is not None:
        return cached
    state = request.app.state
    ring: KeyRing = state.keys
    if not ring.enabled:
        settings: Settings = state.settings
        tenant = _default_tenant(settings.tenant_max_concurrent_jobs, settings.max_body_bytes)
    else:
        token = bearer_token(request)
        tenant = ring.lookup(token) if token is not None else None
        if tenant is None:
            reason = ("no `Authorization: Bearer <key>` header" if token is None
                      else "the API key is not valid")
            raise HTTPException(401, f"{reason}: this server requires an API key "
                                "(ask its operator for one)",
                                headers={"WWW-Authenticate": "Bearer"})
    request.state.tenant = tenant
    return tenant


def metrics_access(request: Request) -> None:
    """FastAPI dependency of GET /metrics: 401 unless the request carries the scrape token
    (``REWARDD_METRICS_TOKEN`` set), or a valid API key (no token set, keys configured);
    open without either setting."""
    state = request.app.state
    expected: str | None = state.settings.metrics_token
    ring: KeyRing = state.keys
    if not expected and not ring.enabled:
        return
    token = bearer_token(request)
    if token is not None:
        if expected:
            if hmac.compare_digest(_digest(token), _digest(expected)):
                return
        elif ring.lookup(token) is not None:
            return
    needs = ("the scrape token (REWARDD_METRICS_TOKEN; API keys do not open /metrics)"
             if expected else "an API key")
    reason = ("no `Authorization: Bearer <token>` header" if token is None
              else "the token is not valid")
    raise HTTPException(401, f"{reason}: /metrics on this server needs {needs} (ask its "
                        "operator)", headers={"WWW-Authenticate": "Bearer"})


METRICS_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "REWARDD_METRICS_TOKEN or API keys are "
          "configured and the request has no valid `Authorization: Bearer <token>`."}}
"""Documented on GET /metrics (it depends on :func:`metrics_access`)."""


AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "API keys are configured and the request "
          "has no valid `Authorization: Bearer <key>`."}}
"""Documented on every /v1 route (they all depend on :func:`current_tenant`)."""
