"""CPU-heavy request handling runs off the event loop: /healthz answers while it runs.

A verifier whose parameter validation holds its thread (as compiling a 5 MB regex does for
seconds) stands in for any CPU-bound step. The proof is by ordering, not by timing: the
validation has provably started (an event) and cannot finish until the test releases it,
which the test does only after /healthz has answered. With validation on the event loop,
/healthz cannot answer before the release, and the test fails once its generous bound
(:data:`HANG_S`) runs out instead of deadlocking.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import model_validator

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.verifiers import REGISTRY, Outcome, Verifier, VerifierParams, register
from tests.support.executors import GatedExecutor

HANG_S = 60.0  # bounds against a deadlock, never a measurement
ENTERED = threading.Event()
RELEASE = threading.Event()


class HoldingParams(VerifierParams):
    hold: bool = False

    @model_validator(mode="after")
    def hold_the_thread(self) -> HoldingParams:
        if self.hold:
            ENTERED.set()
            RELEASE.wait(2 * HANG_S)  # longer than the test waits for /healthz
        return self


class HoldingVerifier(Verifier):
    """Rewards 1.0; validating ``hold: true`` parameters holds the validating thread."""

    name = "test_holding_params"
    description = "Parameter validation that holds its thread until the test releases it."
    Params = HoldingParams

    def verify(self, sample: Any, reference: Any, params: Any) -> Outcome:
        return Outcome.success(1.0)


if HoldingVerifier.name not in REGISTRY:
    register(HoldingVerifier())

SPEC = {"name": "h", "verifier": HoldingVerifier.name, "params": {"hold": True}}
BATCH = {"groups": [{"group_id": "g", "rollouts": [
    {"rollout_id": "r0", "completion": "a", "num_tokens": 1},
    {"rollout_id": "r1", "completion": "b", "num_tokens": 1}]}], "rewards": [SPEC]}

REQUESTS: dict[str, Callable[[TestClient], httpx.Response]] = {
    "verify": lambda client: client.post(f"/v1/verify/{HoldingVerifier.name}",
                                         json={"completion": "a", "params": {"hold": True}}),
    "score": lambda client: client.post("/v1/score", json=BATCH),
    "rewards": lambda client: client.post("/v1/rewards", json=BATCH),
    "jobs": lambda client: client.post("/v1/jobs", json=BATCH),
}


@pytest.mark.parametrize("route", sorted(REQUESTS))
def test_healthz_answers_while_a_request_is_validated(route: str) -> None:
    ENTERED.clear()
    RELEASE.clear()
    executor = GatedExecutor()
    executor.gate.set()
    answers: dict[str, httpx.Response] = {}
    with TestClient(create_app(Settings(), executor=executor)) as client:
        heavy = threading.Thread(target=lambda: answers.update(heavy=REQUESTS[route](client)))
        heavy.start()
        try:
            assert ENTERED.wait(HANG_S), "the request never reached its validation"
            probe = threading.Thread(target=lambda: answers.update(probe=client.get("/healthz")))
            probe.start()
            probe.join(HANG_S)
            answered_while_held = not probe.is_alive() and "heavy" not in answers
        finally:
            RELEASE.set()
            heavy.join(HANG_S)
    assert answered_while_held, f"/healthz waited for the {route} request's validation"
    assert answers["probe"].status_code == 200
    assert answers["heavy"].status_code in (200, 202), answers["heavy"].text
