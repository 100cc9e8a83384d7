"""The runs routes: the run record (GET /v1/runs, GET /v1/runs/{run_id}/rollouts) and the
state stateful entries keep per run (GET and DELETE /v1/runs/{run_id}).

A tenant sees only its own runs: another tenant's run of the same id is simply not there.
The logic is :mod:`rewardd.service.runview`; these functions only read parameters."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from fastapi.concurrency import run_in_threadpool

from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service.api.bodies import BUSY_RESPONSE, body, responses
from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.api.jobs import IDEMPOTENCY_KEY, submitted
from rewardd.service.codec import read_model
from rewardd.service.models import ErrorResponse, JobSubmitted
from rewardd.service.records.models import RolloutQuery
from rewardd.service.records.store import MAX_PAGE
from rewardd.service.replaymodels import ReverifyRequest
from rewardd.service.runmodels import RolloutPageBody, RunAlerts, RunList, RunView
from rewardd.service.runview import DEFAULT_STEPS, RunRecords
from rewardd.service.services import Services, ServicesDep
from rewardd.service.tenancy import Tenant

router = APIRouter(prefix="/v1", tags=["runs"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)

UNAVAILABLE = {503: {"model": ErrorResponse, "description": "The run record's database "
                     "cannot be reached (the reason says what to check)."}}


def records_of(services: Services, tenant: Tenant) -> RunRecords:
    return RunRecords.of(services, tenant.name)


@router.get("/runs", summary="Recorded runs", response_model=RunList, responses=UNAVAILABLE)
async def list_runs(services: ServicesDep, tenant: Tenant = Depends(current_tenant),
                    limit: int = Query(100, ge=1, le=MAX_PAGE,
                                       description="Most runs to list.")) -> RunList:
    """The tenant's recorded runs, the most recently scored first."""
    return await records_of(services, tenant).list(limit)


@router.get("/runs/{run_id}", summary="Run state and record", response_model=RunView,
            responses={**UNAVAILABLE, 404: {
                "model": ErrorResponse, "description": "The run has neither state nor record "
                "for this tenant (never seen, expired, reset or pruned, or another tenant's)."}})
async def view_run(run_id: str, services: ServicesDep,
                   tenant: Tenant = Depends(current_tenant),
                   steps: int = Query(DEFAULT_STEPS, ge=0, le=MAX_PAGE, description="Per-step "
                                      "summaries of this many last steps (each 100 cost "
                                      "about 0.8 s on a run of 512-rollout steps in "
                                      "PostgreSQL).")) -> RunView:
    """What stateful entries (ha_dw anchors, ucb_curriculum statistics) keep for the run, and
    its record: counts and per-step summaries (rollouts, failures, per-component reward mean
    and spread, rollouts per source)."""
    return await records_of(services, tenant).view(run_id, steps)


@router.get("/runs/{run_id}/rollouts", summary="Recorded rollouts", response_model=RolloutPageBody,
            responses={**UNAVAILABLE, 404: {"model": ErrorResponse,
                                            "description": "The run has no record."}})
async def run_rollouts(
        run_id: str, services: ServicesDep, tenant: Tenant = Depends(current_tenant),
        step: int | None = Query(None, ge=0, description="Only this step."),
        source: str | None = Query(None, description="Only this source."),
        component: str | None = Query(None, description="Only rollouts this component "
                                      "scored (with `outcome`: its outcome)."),
        outcome: str | None = Query(None, description="`ok`, `failed`, or a failure kind "
                                    "(`timeout`, `unavailable`, ...)."),
        q: str | None = Query(None, max_length=256, description="A substring of the "
                              "completion."),
        cursor: str | None = Query(None, description="`next_cursor` of the previous page."),
        limit: int = Query(100, ge=1, le=MAX_PAGE)) -> RolloutPageBody:
    """The run's recorded rollouts in the order they were scored, each with its verdicts
    (status, evidence), summary and completion (when kept), filtered and paged."""
    after = None
    if cursor is not None:
        if not cursor.isdigit():
            raise RequestInvalid([error(("query", "cursor"), "not a cursor this API gave: "
                                        "pass `next_cursor` of the previous page")])
        after = int(cursor)
    query = RolloutQuery(step=step, source=source, component=component, outcome=outcome,
                         text=q, after=after, limit=limit)
    return await records_of(services, tenant).rollouts(run_id, query)


@router.get("/runs/{run_id}/alerts", summary="The sentinel's alerts", response_model=RunAlerts,
            responses={**UNAVAILABLE, 404: {"model": ErrorResponse,
                                            "description": "The run has no record."}})
async def run_alerts(run_id: str, services: ServicesDep,
                     tenant: Tenant = Depends(current_tenant)) -> RunAlerts:
    """Every alert the sentinel raised over the run's recorded steps (reward gained by
    length, hedged answers, lenient readings, one rewarded ending on many prompts, one
    component taking over the reward, training reward diverging from an audit), each with
    its step, estimated onset, value, threshold and message; and the signals' definitions
    (docs/sentinel.md)."""
    return await records_of(services, tenant).alerts(run_id)


@router.post("/runs/{run_id}/reverify", status_code=202, response_model=None,
             openapi_extra=body(ReverifyRequest), summary="Replay a run's verdicts",
             responses={**responses(JobSubmitted), **BUSY_RESPONSE, **UNAVAILABLE,
                        202: {"model": JobSubmitted, "description": "Job created; its "
                              "`result` (GET /v1/jobs/{id}) is a ReverifyResult."},
                        404: {"model": ErrorResponse, "description": "The run has no record."}})
async def reverify(run_id: str, request: Request, services: ServicesDep,
                   tenant: Tenant = Depends(current_tenant),
                   idempotency_key: str | None = IDEMPOTENCY_KEY) -> Response:
    """Re-score the run's recorded rollouts (those recorded with their completion) with
    today's verifiers, or with parameters changed by `set`, as a job (GET /v1/jobs/{id}:
    progress, events, cancel); its result lists every verdict that flipped, with both
    receipts, and counts per component and source."""
    req = await read_model(request, ReverifyRequest, tenant)
    store = await records_of(services, tenant).store()
    job, created = await services.jobs.submit_reverify(tenant, store, run_id, req,
                                                       idempotency_key)
    return submitted(request, job, 202 if created else 200)


@router.delete("/runs/{run_id}", summary="Reset run state")
async def reset_run(run_id: str, services: ServicesDep,
                    tenant: Tenant = Depends(current_tenant)) -> dict[str, Any]:
    """Forget the run's state; the next request starts it afresh (its record stays)."""
    runs = services.runs.for_tenant(tenant.name)
    return {"run_id": run_id, "reset": await run_in_threadpool(runs.reset, run_id)}
