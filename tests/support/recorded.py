"""Score a batch with a `run_id` on a real server and wait until the record has it all (the
record is written off the request path)."""

from __future__ import annotations

import time
from typing import Any

import httpx

GUARD_S = 120.0
"""A guard against a hang, not a bound."""


def recorded_batch(server: str, body: dict[str, Any]) -> str:
    """POST ``body`` to ``/v1/rewards`` and return its run id once every rollout is recorded."""
    run_id = body["run_id"]
    rollouts = sum(len(group["rollouts"]) for group in body["groups"])
    assert httpx.post(f"{server}/v1/rewards", json=body, timeout=60).status_code == 200
    deadline = time.monotonic() + GUARD_S
    while True:
        answer = httpx.get(f"{server}/v1/runs/{run_id}", timeout=60)
        if answer.status_code == 200 and (answer.json().get("record") or {}).get(
                "rollouts") == rollouts:
            return run_id
        assert time.monotonic() < deadline, "the run was never recorded"
        time.sleep(0.1)
