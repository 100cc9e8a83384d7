"""GET and DELETE /v1/runs/{run_id}: view and reset the state stateful entries keep per run."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

router = APIRouter(prefix="/v1", tags=["runs"])


@router.get("/runs/{run_id}", summary="Run state")
def view_run(run_id: str, request: Request) -> dict[str, Any]:
    """What stateful entries (ha_dw anchors, ucb_curriculum statistics) keep for the run."""
    state = request.app.state.runs.view(run_id)
    if state is None:
        raise HTTPException(404, f"run {run_id!r} has no state (never seen, expired or reset)")
    return {"run_id": run_id, "state": state}


@router.delete("/runs/{run_id}", summary="Reset run state")
def reset_run(run_id: str, request: Request) -> dict[str, Any]:
    """Forget the run's state; the next request starts it afresh."""
    return {"run_id": run_id, "reset": request.app.state.runs.reset(run_id)}
