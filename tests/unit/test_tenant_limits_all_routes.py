"""Issue 15 row 6: a tenant's concurrency limit covers every route that spends workers or
API CPU (score, rewards, advantages, verify, jobs), from one pool of slots per tenant.

Requests are held in flight by gates (an executor that waits, or an advantages computation
that waits), never by sleeping: the assertions count requests admitted and refused, so they
hold on a loaded machine.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable

import httpx
import pytest

from rewardd.service import pipeline
from rewardd.service.app import create_app
from rewardd.service.limits import SLOT_ROUTES
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant
from tests.support.executors import GatedExecutor
from tests.unit.test_tenancy import ALICE, BOB, KEYS, advantages_body, client, score_body

LIMIT = 2
SENT = 6
VERIFY = {"completion": "1", "reference": {"answer": "1"}}


def app_with_limit(executor: GatedExecutor) -> Any:
    return create_app(Settings(api_keys=KEYS, tenant_max_concurrent_jobs=LIMIT,
                               retry_after_s=5), executor=executor)


class GatedAdvantages:
    """Replaces ``pipeline.advantages`` (it runs in a worker thread): counts the calls that
    entered and holds each until :attr:`gate` is set, then computes for real."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = 0
        self._lock = threading.Lock()
        self._real = pipeline.advantages

    def __call__(self, *args: Any) -> Any:
        with self._lock:
            self.entered += 1
        assert self.gate.wait(timeout=120), "the test never opened the gate"
        return self._real(*args)


async def until(condition: Callable[[], bool], pending: list[asyncio.Task]) -> None:
    """Wait (without a deadline of our own: pytest's timeout bounds it) until ``condition``
    holds or every request has answered."""
    while not condition() and not all(task.done() for task in pending):
        await asyncio.sleep(0.01)


async def send_six(send: Callable[[], Awaitable[httpx.Response]], entered: Callable[[], int],
                   ) -> tuple[list[asyncio.Task], list[httpx.Response]]:
    """Send :data:`SENT` requests at once; return (the admitted ones, still waiting at the
    gate, and the refused ones, answered) once every refusal is in."""
    tasks = [asyncio.create_task(send()) for _ in range(SENT)]
    await until(lambda: entered() > LIMIT  # over the limit: fail now, not at the timeout
                or (entered() == LIMIT and sum(t.done() for t in tasks) >= SENT - LIMIT),
                tasks)
    refused = [t.result() for t in tasks if t.done()]
    return [t for t in tasks if not t.done()], refused


def assert_busy(responses: list[httpx.Response]) -> None:
    assert [r.status_code for r in responses] == [429] * (SENT - LIMIT), \
        [(r.status_code, r.text) for r in responses]
    for r in responses:
        assert r.headers["retry-after"] == "5"
        assert "'alice'" in r.json()["detail"] and "verify" in r.json()["detail"]


@pytest.mark.parametrize("path,body", [("/v1/verify/exact_match", VERIFY),
                                       ("/v1/score", score_body()),
                                       ("/v1/rewards", {k: v for k, v in score_body().items()
                                                        if k != "advantage"})],
                         ids=["verify", "score", "rewards"])
async def test_six_concurrent_worker_requests_past_a_limit_of_two_run_two(
        path: str, body: dict[str, Any]) -> None:
    executor = GatedExecutor()
    app = app_with_limit(executor)
    async with client(app) as http:
        try:
            admitted, refused = await send_six(
                lambda: http.post(path, json=body, headers=ALICE), lambda: executor.entered)
            assert len(admitted) == LIMIT and executor.entered == LIMIT
            assert_busy(refused)
        finally:
            executor.gate.set()
        assert [(await t).status_code for t in admitted] == [200] * LIMIT
    assert executor.entered == LIMIT  # the refused requests reached no worker
    assert await app.state.services.limiter.in_use(Tenant("alice", LIMIT, 1)) == 0


async def test_six_concurrent_advantages_past_a_limit_of_two_run_two(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gated = GatedAdvantages()
    monkeypatch.setattr(pipeline, "advantages", gated)
    app = app_with_limit(GatedExecutor())
    async with client(app) as http:
        try:
            admitted, refused = await send_six(
                lambda: http.post("/v1/advantages", json=advantages_body([1, 0], "run"),
                                  headers=ALICE),
                lambda: gated.entered)
            assert len(admitted) == LIMIT and gated.entered == LIMIT
            assert_busy(refused)
        finally:
            gated.gate.set()
        assert [(await t).status_code for t in admitted] == [200] * LIMIT
    assert gated.entered == LIMIT
    assert await app.state.services.limiter.in_use(Tenant("alice", LIMIT, 1)) == 0


async def test_routes_share_one_pool_of_slots_per_tenant_and_other_tenants_are_not_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A score and an advantages call fill alice's two slots: her verify, advantages and job
    are refused; bob, another tenant, is served; reads take no slot."""
    gated = GatedAdvantages()
    monkeypatch.setattr(pipeline, "advantages", gated)
    executor = GatedExecutor()
    app = app_with_limit(executor)
    async with client(app) as http:
        held = [asyncio.create_task(http.post("/v1/score", json=score_body(), headers=ALICE)),
                asyncio.create_task(http.post("/v1/advantages",
                                              json=advantages_body([1, 0], "r"),
                                              headers=ALICE))]
        try:
            await until(lambda: executor.entered == 1 and gated.entered == 1, held)
            refused = {path: asyncio.create_task(http.post(path, json=body, headers=ALICE))
                       for path, body in (("/v1/verify/exact_match", VERIFY),
                                          ("/v1/advantages", advantages_body([0, 1], "r")),
                                          ("/v1/jobs", score_body()))}
            await until(lambda: executor.entered > 1 or gated.entered > 1,
                        list(refused.values()))
            for path, task in refused.items():
                assert task.done() and task.result().status_code == 429, path
            assert (await http.get("/v1/verifiers", headers=ALICE)).status_code == 200
            assert (await http.get("/v1/runs/nothing", headers=ALICE)).status_code == 404
            bob = asyncio.create_task(http.post("/v1/verify/exact_match", json=VERIFY,
                                                headers=BOB))
            await until(lambda: executor.entered == 2, [bob])
            assert executor.entered == 2, bob.result().text  # bob's verify reached a worker
        finally:
            executor.gate.set()
            gated.gate.set()
        assert [(await t).status_code for t in (*held, bob)] == [200, 200, 200]
        assert gated.entered == 1  # alice's refused advantages never computed


async def test_a_refused_or_invalid_request_holds_no_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = app_with_limit(GatedExecutor())
    async with client(app) as http:
        for _ in range(2 * LIMIT):  # each gives its slot back, or the last ones would be 429
            bad = await http.post("/v1/verify/exact_match", json={"completion": 1},
                                  headers=ALICE)
            assert bad.status_code == 422, bad.text
            bad = await http.post("/v1/advantages", json={"groups": "no"}, headers=ALICE)
            assert bad.status_code == 422, bad.text
    assert await app.state.services.limiter.in_use(Tenant("alice", LIMIT, 1)) == 0


def test_every_slot_route_documents_429_with_retry_after() -> None:
    paths = create_app(Settings(), executor=GatedExecutor()).openapi()["paths"]
    for route in SLOT_ROUTES:
        busy = paths[route]["post"]["responses"]["429"]
        assert "Retry-After" in busy["headers"], route
