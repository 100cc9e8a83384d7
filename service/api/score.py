"""POST /v1/score, /v1/rewards and /v1/advantages."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from rewardd.service import pipeline
from rewardd.service.api.bodies import BUSY_RESPONSE, body, responses
from rewardd.service.codec import read_model, render
from rewardd.service.models import AdvantagesRequest, RewardsRequest, ScoreRequest, ScoreResponse
from rewardd.service.tenancy import AUTH_RESPONSES, Tenant, current_tenant

router = APIRouter(prefix="/v1", tags=["scoring"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)


@router.post("/score", response_model=None, openapi_extra=body(ScoreRequest),
             responses={**responses(ScoreResponse), **BUSY_RESPONSE},
             summary="Rewards and per-token advantages")
async def score(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
    """Verify every rollout with every reward component, then compute advantages."""
    state = request.app.state
    async with state.limiter.hold(tenant):  # before the body: reading it is work too
        req = await read_model(request, ScoreRequest)
        return render(request, await pipeline.score(req, state.executor, state.settings,
                                                    runs=state.runs.for_tenant(tenant.name)))


@router.post("/rewards", response_model=None, openapi_extra=body(RewardsRequest),
             responses={**responses(ScoreResponse), **BUSY_RESPONSE}, summary="Rewards only")
async def rewards(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
    """Verify every rollout; the response has no advantages."""
    state = request.app.state
    async with state.limiter.hold(tenant):
        req = await read_model(request, RewardsRequest)
        return render(request, await pipeline.rewards(req, state.executor, state.settings))


@router.post("/advantages", response_model=None, openapi_extra=body(AdvantagesRequest),
             responses={**responses(ScoreResponse), **BUSY_RESPONSE},
             summary="Advantages from given rewards")
async def advantages(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
    """Pure compute: advantages from the `reward`/`rewards` the rollouts carry."""
    state = request.app.state
    async with state.limiter.hold(tenant):  # CPU in this process: a slot like a batch
        req = await read_model(request, AdvantagesRequest)
        runs = state.runs.for_tenant(tenant.name)
        return render(request, await run_in_threadpool(pipeline.advantages, req, runs))
