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
is guarded too (:func:`metrics_token_valid`): by ``REWARDD_METRICS_TOKEN`` when set (a scrape
credential of its own, which tenants' keys do not replace: a tenant need not see the others'
traffic), else by the API keys when configured; open only on a server without either.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import orjson

from rewardd.service.errors import Unauthenticated
from rewardd.service.setting_files import SettingFileInvalid, read_setting_file
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
    max_body_setting: str = field(default="REWARDD_MAX_BODY_BYTES", compare=False)
    """What sets :attr:`max_body_bytes` (the server's setting, or the tenant's own lower
    limit), named in a 413 so the caller knows whom to ask."""


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
    for limit, value in (("max_concurrent_jobs", jobs), ("max_body_bytes", body)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise KeysInvalid(f"tenant {name!r}: {limit} must be a positive integer, "
                              f"got {value!r}")
    if body < settings.max_body_bytes:
        return Tenant(name, jobs, body, f"max_body_bytes of tenant {name!r}")
    return Tenant(name, jobs, settings.max_body_bytes)


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
            data = orjson.loads(read_setting_file(path, "REWARDD_API_KEYS_FILE"))
        except SettingFileInvalid as exc:
            raise KeysInvalid(str(exc)) from None
        except orjson.JSONDecodeError as exc:
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
            raise KeysInvalid(f"REWARDD_API_KEYS / REWARDD_API_KEYS_FILE: one API key is "
                              f"given to two tenants ({ring[digest].name!r} and {name!r}); "
                              "give each tenant keys of its own")
        ring[digest] = tenant
    return KeyRing(ring)


@lru_cache(maxsize=8)
def _default_tenant(max_concurrent_jobs: int, max_body_bytes: int) -> Tenant:
    return Tenant(DEFAULT_TENANT, max_concurrent_jobs, max_body_bytes)


def bearer(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (REST header or gRPC
    metadata), or None."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(keys: KeyRing, settings: Settings, token: str | None,
                 missing: str = "no `Authorization: Bearer <key>` header") -> Tenant:
    """The caller's tenant: ``default`` when no keys are configured, else the tenant of
    ``token``; :class:`Unauthenticated` without a valid one (``missing`` says where the key
    was looked for: a REST header, gRPC metadata). REST and gRPC both call this."""
    if not keys.enabled:
        return _default_tenant(settings.tenant_max_concurrent_jobs, settings.max_body_bytes)
    tenant = keys.lookup(token) if token is not None else None
    if tenant is None:
        reason = missing if token is None else "the API key is not valid"
        raise Unauthenticated(f"{reason}: this server requires an API key (ask its operator "
                              "for one)")
    return tenant


def metrics_token_valid(keys: KeyRing, settings: Settings, token: str | None) -> None:
    """Nothing when ``token`` opens GET /metrics: the scrape token when
    ``REWARDD_METRICS_TOKEN`` is set, else any API key when keys are configured, else
    anything; :class:`Unauthenticated` otherwise."""
    expected = settings.metrics_token
    if not expected and not keys.enabled:
        return
    if token is not None:
        if expected:
            if hmac.compare_digest(_digest(token), _digest(expected)):
                return
        elif keys.lookup(token) is not None:
            return
    needs = ("the scrape token (REWARDD_METRICS_TOKEN; API keys do not open /metrics)"
             if expected else "an API key")
    reason = ("no `Authorization: Bearer <token>` header" if token is None
              else "the token is not valid")
    raise Unauthenticated(f"{reason}: /metrics on this server needs {needs} (ask its "
                          "operator)")
