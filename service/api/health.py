"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from rewardd.service import __version__, metrics
from rewardd.service.api.deps import METRICS_AUTH_RESPONSES, metrics_access
from rewardd.service.services import Services, ServicesDep
from rewardd.service.timestamps import iso
from rewardd.verifiers.code.sandbox import isolation

router = APIRouter(tags=["operations"])

READY_WAIT_S = 5.0
"""Longest /readyz waits for its answer (a ping of the embedded pool; a fresh look at the
broker and the workers' heartbeats when the distributed executor's is a few beats old)."""


@router.get("/healthz", summary="Liveness")
def healthz() -> dict[str, str]:
    """The process serves HTTP. Says nothing about the workers (see /readyz)."""
    return {"status": "ok", "version": __version__}


@router.get("/readyz", summary="Readiness", responses={503: {"description": "Not ready."}})
async def readyz(services: ServicesDep) -> JSONResponse:
    """Ready when verifiers can run. Distributed: the broker answers and every queue of
    REWARDD_READY_QUEUES has a worker with a live heartbeat (no task is queued to find out, so
    a long batch never delays the answer); `executor.consumers_by_queue` and
    `executor.queues_without_consumer` list every routed queue. Embedded: a pool worker answers
    a round trip. When not ready, `reason` says why (the broker is unreachable, which queue has
    no live consumer, or the worker pool died and its replacement is starting). `record`
    says whether the run record keeps up: a database that is down never makes the service
    unready (scoring goes on), but `record.ok` turns false with the rollouts waiting and
    dropped, since when writing fails and why."""
    executor = services.executor
    ready = await executor.ready(READY_WAIT_S)
    body: dict[str, object] = {"status": "ready" if ready else "not_ready"}
    if not ready:
        body["reason"] = executor.not_ready_reason(READY_WAIT_S)
    body.update(executor=executor.describe(), sandbox=await asyncio.to_thread(sandbox_isolation),
                record=record_health(services))
    return JSONResponse(body, status_code=200 if ready else 503)


def record_health(services: Services) -> dict[str, object]:
    """The run record's writer, for /readyz (nothing recorded yet: only whether it is on)."""
    recorder = services.records
    if not recorder.enabled:
        return {"enabled": False}
    health = recorder.health()
    if health is None:
        return {"enabled": True, "ok": True, "written": 0}
    return {"enabled": True, "ok": health.ok, "queued": health.queued,
            "written": health.written, "dropped": health.dropped,
            "failing_since": iso(health.failing_since), "last_error": health.last_error}


def sandbox_isolation() -> dict[str, object]:
    """What the code sandbox enforces on this machine: detected once per process (a short
    bubblewrap start, hence off the event loop), then cached."""
    return dataclasses.asdict(isolation())


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            dependencies=[Depends(metrics_access)], responses=METRICS_AUTH_RESPONSES)
def scrape(services: ServicesDep) -> Response:
    # a plain def: FastAPI runs it in a worker thread, so the scrape-time reads (queue depth
    # from the broker, the jobs counter) never block the event loop
    data, content_type = metrics.render(services.settings.prometheus_multiproc_dir,
                                        services.runtime.started_executor)
    return Response(data, media_type=content_type)
