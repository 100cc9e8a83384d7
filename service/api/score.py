"""POST /v1/score, /v1/rewards and /v1/advantages."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from rewardd.service import heavy, pipeline
from rewardd.service.api.bodies import BUSY_RESPONSE, body, responses
from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.codec import read_model, render
from rewardd.service.models import AdvantagesRequest, RewardsRequest, ScoreRequest, ScoreResponse
from rewardd.service.services import ServicesDep
from rewardd.service.tenancy import Tenant

router = APIRouter(prefix="/v1", tags=["scoring"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)


@router.post("/score", response_model=None, openapi_extra=body(ScoreRequest),
             responses={**responses(ScoreResponse), **BUSY_RESPONSE},
             summary="Rewards and per-token advantages")
async def score(request: Request, services: ServicesDep,
                tenant: Tenant = Depends(current_tenant)) -> Response:
    """Verify every rollout with every reward component, then compute advantages."""
    async with services.limiter.hold(tenant):  # before the body: reading it is work too
        with heavy.scope():
            req = await read_model(request, ScoreRequest, tenant)
            return await answer(request, await pipeline.score(
                req, services.executor, services.settings,
                runs=services.runs.for_tenant(tenant.name),
                record=services.records.for_tenant(tenant.name),
                cache=services.verdicts.view(tenant.name, req.cache)))


@router.post("/rewards", response_model=None, openapi_extra=body(RewardsRequest),
             responses={**responses(ScoreResponse), **BUSY_RESPONSE}, summary="Rewards only")
async def rewards(request: Request, services: ServicesDep,
                  tenant: Tenant = Depends(current_tenant)) -> Response:
    """Verify every rollout; the response has no advantages."""
    async with services.limiter.hold(tenant):
        with heavy.scope():
            req = await read_model(request, RewardsRequest, tenant)
            return await answer(request, await pipeline.rewards(
                req, services.executor, services.settings,
                record=services.records.for_tenant(tenant.name),
                cache=services.verdicts.view(tenant.name, req.cache)))


@router.post("/advantages", response_model=None, openapi_extra=body(AdvantagesRequest),
             responses={**responses(ScoreResponse), **BUSY_RESPONSE},
             summary="Advantages from given rewards")
async def advantages(request: Request, services: ServicesDep,
                     tenant: Tenant = Depends(current_tenant)) -> Response:
    """Pure compute: advantages from the `reward`/`rewards` the rollouts carry."""
    async with services.limiter.hold(tenant):  # CPU in this process: a slot like a batch
        with heavy.scope():
            req = await read_model(request, AdvantagesRequest, tenant)
            runs = services.runs.for_tenant(tenant.name)
            return await answer(request, await heavy.offload(pipeline.advantages, req, runs,
                                                             services.settings))


async def answer(request: Request, payload: dict[str, Any]) -> Response:
    """The encoded answer: a heavy request's in the heavy lane (17 MB for 60,000 rollouts,
    ~50 ms of GIL in one call), a usual one's on the loop (no thread hop for ~10 KB)."""
    if heavy.is_heavy():
        return await heavy.offload(render, request, payload)
    return render(request, payload)
