"""POST /v1/verify/{verifier}: one item through one verifier, for debugging."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from rewardd.service.api.bodies import BUSY_RESPONSE, body, responses
from rewardd.service.codec import read_model, render
from rewardd.service.models import VerifyRequest, VerifyResponse
from rewardd.service.pipeline import call_timeout, run_calls
from rewardd.advantages.checks import raise_if, validate_params
from rewardd.service.validation import check_timeout, reference_errors
from rewardd.service.settings import Settings
from rewardd.service.tenancy import AUTH_RESPONSES, Tenant, current_tenant
from rewardd.verifiers import Sample, Verifier, get_verifier
from rewardd.workers.executor import Executor, VerifyCall

router = APIRouter(prefix="/v1", tags=["verifiers"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)


@router.post("/verify/{verifier}", response_model=None, openapi_extra=body(VerifyRequest),
             responses={**responses(VerifyResponse), **BUSY_RESPONSE,
                        404: {"description": "Unknown verifier."}},
             summary="Verify one completion")
async def verify(verifier: str, request: Request,
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    """Run one verifier on one completion, under the same limits as a batch."""
    try:
        get_verifier(verifier)
    except KeyError as exc:
        raise HTTPException(404, exc.args[0]) from None
    state = request.app.state
    async with state.limiter.hold(tenant):  # a worker's time, like a batch's
        req = await read_model(request, VerifyRequest)
        return render(request, await verify_one(verifier, req, state.settings, state.executor))


async def verify_one(verifier: str, req: VerifyRequest, settings: Settings,
                     executor: Executor) -> dict[str, Any]:
    """One validated item through ``verifier`` (a registered name): its outcome as the
    response body. The REST route and gRPC's Verify both call this."""
    impl = get_verifier(verifier)
    # off the event loop: validating params may compile a request's regex (megabytes), and
    # checking a reference may check a JSON Schema against its metaschema
    raise_if(await asyncio.to_thread(_request_errors, impl, req)
             + check_timeout(req.timeout_s, settings, ("body", "timeout_s")))
    call = VerifyCall(verifier, (Sample(req.completion, req.prompt, req.num_tokens),),
                      req.reference, req.params, call_timeout(req.timeout_s, settings))
    [result] = await run_calls([call], executor)
    [item] = result.items
    return item.outcome.to_dict()


def _request_errors(impl: Verifier, req: VerifyRequest) -> list[dict]:
    """The request's params and reference against what ``impl`` documents: the same 422s a
    batch gets at ``body.rewards[i].params`` and ``body.groups[i].reference``."""
    return (validate_params(impl.Params, req.params, ("body", "params"))
            + reference_errors(impl, req.reference, ("body", "reference")))
