"""FastAPI dependencies of the routes: who is calling (:func:`current_tenant`), whether they
may scrape (:func:`metrics_access`), and the statuses those add to every route's document.

The decisions are :mod:`rewardd.service.tenancy`'s (gRPC makes the same ones from its
metadata); these only read the HTTP header and keep the tenant in the request's state, where
the metrics, the logs and the body reader find it.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from rewardd.service.models import ErrorResponse
from rewardd.service.services import ServicesDep
from rewardd.service.tenancy import Tenant, authenticate, bearer, metrics_token_valid


def current_tenant(request: Request, services: ServicesDep) -> Tenant:
    """The caller's tenant, or 401 when keys are configured and the request carries no
    valid ``Authorization: Bearer <key>``."""
    cached = getattr(request.state, "tenant", None)
    if cached is not None:
        return cached
    tenant = authenticate(services.keys, services.settings,
                          bearer(request.headers.get("authorization", "")))
    request.state.tenant = tenant
    return tenant


def metrics_access(request: Request, services: ServicesDep) -> None:
    """GET /metrics: 401 unless the request carries the scrape token
    (``REWARDD_METRICS_TOKEN`` set), or a valid API key (no token set, keys configured);
    open without either setting."""
    metrics_token_valid(services.keys, services.settings,
                        bearer(request.headers.get("authorization", "")))


METRICS_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "REWARDD_METRICS_TOKEN or API keys are "
          "configured and the request has no valid `Authorization: Bearer <token>`."}}
"""Documented on GET /metrics (it depends on :func:`metrics_access`)."""


AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "API keys are configured and the request "
          "has no valid `Authorization: Bearer <key>`."}}
"""Documented on every /v1 route (they all depend on :func:`current_tenant`)."""
