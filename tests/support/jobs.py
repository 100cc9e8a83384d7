"""Waiting on jobs in tests: poll with a bound that only guards against a hang (no test
asserts on time)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import httpx

HANG_GUARD_S = 120.0
FINAL_STATES = ("succeeded", "failed", "cancelled")


async def wait_until(predicate: Callable[[], Any], what: str, every_s: float = 0.05) -> Any:
    """Poll ``predicate`` (sync or async) until truthy; fail after HANG_GUARD_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_S
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert loop.time() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(every_s)


async def final(http: httpx.AsyncClient, job_id: str, headers: dict | None = None
                ) -> dict[str, Any]:
    """GET /v1/jobs/{job_id} once the job reached a final state."""
    async def done() -> dict[str, Any] | None:
        body = (await http.get(f"/v1/jobs/{job_id}", headers=headers)).json()
        return body if body["state"] in FINAL_STATES else None
    return await wait_until(done, f"job {job_id} to finish")
