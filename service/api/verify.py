"""POST /v1/verify/{verifier}: one item through one verifier, for debugging
(:mod:`rewardd.service.verify`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from rewardd.service.api.bodies import BUSY_RESPONSE, body, responses
from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.codec import read_model, render
from rewardd.service.models import VerifyRequest, VerifyResponse
from rewardd.service.services import ServicesDep
from rewardd.service.tenancy import Tenant
from rewardd.service.verify import known_verifier, verify_one

router = APIRouter(prefix="/v1", tags=["verifiers"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)


@router.post("/verify/{verifier}", response_model=None, openapi_extra=body(VerifyRequest),
             responses={**responses(VerifyResponse), **BUSY_RESPONSE,
                        404: {"description": "Unknown verifier."}},
             summary="Verify one completion")
async def verify(verifier: str, request: Request, services: ServicesDep,
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    """Run one verifier on one completion, under the same limits as a batch."""
    known_verifier(verifier)  # 404 before taking a slot or reading the body
    async with services.limiter.hold(tenant):  # a worker's time, like a batch's
        req = await read_model(request, VerifyRequest, tenant)
        return render(request, await verify_one(verifier, req, services.settings,
                                                services.executor))
