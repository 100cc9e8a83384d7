"""GET and DELETE /v1/runs/{run_id}: view and reset the state stateful entries keep per run.

A tenant sees only its own runs: another tenant's run of the same id is simply not there."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.errors import NotFound
from rewardd.service.models import ErrorResponse
from rewardd.service.services import ServicesDep
from rewardd.service.tenancy import Tenant

router = APIRouter(prefix="/v1", tags=["runs"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)


@router.get("/runs/{run_id}", summary="Run state",
            responses={404: {"model": ErrorResponse, "description": "The run has no state for "
                             "this tenant (never seen, expired or reset, or another tenant's)."}})
async def view_run(run_id: str, services: ServicesDep,
                   tenant: Tenant = Depends(current_tenant)) -> dict[str, Any]:
    """What stateful entries (ha_dw anchors, ucb_curriculum statistics) keep for the run."""
    runs = services.runs.for_tenant(tenant.name)
    state = await run_in_threadpool(runs.view, run_id)
    if state is None:
        raise NotFound(f"run {run_id!r} has no state (never seen, expired or reset)")
    return {"run_id": run_id, "state": state}


@router.delete("/runs/{run_id}", summary="Reset run state")
async def reset_run(run_id: str, services: ServicesDep,
                    tenant: Tenant = Depends(current_tenant)) -> dict[str, Any]:
    """Forget the run's state; the next request starts it afresh."""
    runs = services.runs.for_tenant(tenant.name)
    return {"run_id": run_id, "reset": await run_in_threadpool(runs.reset, run_id)}
