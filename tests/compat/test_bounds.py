"""Issue 28's bounds on the per-sample protocols: what one tenant may hold parked (requests
and samples, per API process), samples per request, the work a leaving client takes back,
one bulk placement step per request in group mode, and echoed NeMo-Gym fields that must
stay encodable. Held in flight by gated executors, never by sleeping alone."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Sequence

from rewardd.service.app import create_app
from rewardd.service.compat.samples import SampleIn
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant
from rewardd.workers.executor import CallDoneCallback, CallResult, ProgressCallback, VerifyCall
from tests.compat.conftest import client
from tests.support.executors import GatedExecutor

ALICE = {"Authorization": "Bearer key-a"}
TENANT = Tenant("alice", 16, 1 << 20)
GROUPED = {"group": {"size": 2, "timeout_s": 60}}


class CountingExecutor(GatedExecutor):
    """A gated executor that counts the runs cancelled while they waited for the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = 0
        self.checks = 0

    async def run(self, calls: Sequence[VerifyCall], progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        try:
            results = await super().run(calls, progress, on_call_done)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.checks += sum(len(call.samples) for call in calls)
        return results


def app_of(executor: Any, config: dict[str, Any] | None = None, **settings: Any) -> Any:
    return create_app(Settings(api_keys="key-a=alice",
                               compat_config=json.dumps(config) if config else None,
                               **settings), executor=executor)


def batch(count: int, prompt: str = "p", distinct: bool = False) -> dict[str, Any]:
    prompts = [f"{prompt}{i if distinct else ''}" for i in range(count)]
    return {"query": [p + "\\boxed{1}" for p in prompts], "prompts": prompts,
            "labels": ["1"] * count}


def samples(count: int) -> list[SampleIn]:
    return [SampleIn("p", "\\boxed{1}", {"answer": "1"}, ("body", "labels", i))
            for i in range(count)]


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


# ---- samples per request and parked samples: refused before any work --------------------

async def test_more_samples_than_the_per_request_cap_is_a_422_naming_the_setting():
    gated = CountingExecutor()
    async with client(app_of(gated, compat_max_samples_per_request=3)) as http:
        r = await http.post("/get_reward", json=batch(4), headers=ALICE)
        ok_at_cap = asyncio.create_task(http.post("/get_reward", json=batch(3), headers=ALICE))
        await until(lambda: gated.entered == 1)
        gated.gate.set()
        assert (await ok_at_cap).status_code == 200
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "query"] and error["type"] == "too_many_samples"
    assert "REWARDD_COMPAT_MAX_SAMPLES_PER_REQUEST" in error["msg"]
    assert gated.entered == 1  # the refused one never reached the verifiers


async def test_group_mode_refuses_a_request_larger_than_a_session_add_can_take():
    async with client(app_of(GatedExecutor(), GROUPED, session_max_inflight=4)) as http:
        r = await http.post("/get_reward", json=batch(5, distinct=True), headers=ALICE)
    assert r.status_code == 422 and "REWARDD_SESSION_MAX_INFLIGHT" in r.text


async def test_parked_requests_and_samples_past_the_tenants_bounds_are_429_naming_them():
    gated = CountingExecutor()
    app = app_of(gated, compat_max_parked_requests=2, compat_max_parked_samples=5)
    async with client(app) as http:
        first = asyncio.create_task(http.post("/get_reward", json=batch(3), headers=ALICE))
        await until(lambda: gated.entered == 1)
        too_many_samples = await http.post("/get_reward", json=batch(3), headers=ALICE)
        alone_too_many = await http.post("/get_reward", json=batch(6), headers=ALICE)
        second = asyncio.create_task(http.post("/get_reward", json=batch(1), headers=ALICE))
        budgets = app.state.services.runtime.budgets
        await until(lambda: budgets.usage().get(("alice", "parked per-sample requests")) == 2)
        too_many_requests = await http.post("/get_reward", json=batch(1), headers=ALICE)
        scrape = (await http.get("/metrics", headers=ALICE)).text  # while both are held
        gated.gate.set()
        assert (await first).status_code == 200 and (await second).status_code == 200
    assert too_many_samples.status_code == 429
    assert "REWARDD_COMPAT_MAX_PARKED_SAMPLES" in too_many_samples.json()["detail"]
    assert too_many_requests.status_code == 429
    assert "REWARDD_COMPAT_MAX_PARKED_REQUESTS" in too_many_requests.json()["detail"]
    assert alone_too_many.status_code == 422  # could never fit: not worth a retry
    assert "REWARDD_COMPAT_MAX_PARKED_SAMPLES" in alone_too_many.text
    assert budgets.usage() == {}  # every holding was given back
    assert 'rewardd_tenant_held{bound="parked per-sample requests",tenant="alice"} 2.0' in scrape
    assert 'rewardd_tenant_held{bound="parked per-sample samples",tenant="alice"} 4.0' in scrape


# ---- a client that leaves takes its work back ---------------------------------------------

async def test_a_leaving_request_cancels_its_own_call_and_the_others_are_answered():
    gated = CountingExecutor()
    app = app_of(gated)
    async with client(app):
        batcher = app.state.services.compat.batcher
        big = asyncio.create_task(batcher.submit(TENANT, samples(20)))
        small = asyncio.create_task(batcher.submit(TENANT, samples(1)))
        await until(lambda: gated.entered == 2)  # one batch, two calls: big alone, small
        big.cancel()
        await until(lambda: gated.cancelled == 1)
        gated.gate.set()
        [out] = await small
    assert out.reward == 1.0
    assert gated.checks == 1  # the leaver's 20 checks never ran
    await until(lambda: batcher.calls_in_flight() == 0)


async def test_a_request_that_leaves_while_waiting_for_a_batch_leaves_the_queue():
    gated = CountingExecutor()
    app = app_of(gated, tenant_max_concurrent_jobs=1)
    async with client(app) as http:
        batcher = app.state.services.compat.batcher
        held = asyncio.create_task(http.post("/get_reward", json=batch(1), headers=ALICE))
        await until(lambda: gated.entered == 1)
        one_slot = Tenant("alice", 1, 1 << 20)  # the held request has it
        queued = [asyncio.create_task(batcher.submit(one_slot, samples(10))) for _ in range(3)]
        await until(lambda: batcher.waiting("alice") == 30)  # no slot for them: waiting
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        gated.gate.set()
        assert (await held).status_code == 200
    assert batcher.waiting("alice") == 0
    assert gated.entered == 1 and gated.checks == 1  # only the held request was scored


# ---- group mode: one placement step for a request's samples -------------------------------

async def test_a_requests_distinct_prompts_are_placed_with_one_session_add():
    gated = CountingExecutor()
    app = app_of(gated, GROUPED)
    async with client(app) as http:
        sessions = app.state.services.sessions
        adds: list[int] = []
        original = sessions.add_rollouts

        async def counted(tenant: Any, sid: str, groups: Any) -> Any:
            adds.append(len(groups))
            return await original(tenant, sid, groups)

        sessions.add_rollouts = counted  # type: ignore[method-assign]
        gated.gate.set()
        first = asyncio.create_task(http.post("/get_reward", json=batch(300, distinct=True),
                                              headers=ALICE))
        await until(lambda: len(adds) == 1)
        second = await http.post("/get_reward", json=batch(300, distinct=True), headers=ALICE)
        answer = await first
    assert answer.status_code == 200 and second.status_code == 200, answer.text
    assert answer.json()["extra_logs"]["rewardd_group_size"] == [2.0] * 300
    assert adds == [300, 300]  # one add per request (each group completed by the second)


# ---- NeMo-Gym: echoed fields are checked before scoring -----------------------------------

def verify_body(**extra: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "1+1?"},
            "response": {"output": [{"type": "message", "content": [
                {"type": "output_text", "text": "\\boxed{2}"}]}]},
            "expected_answer": "2", **extra}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def test_an_echoed_field_deeper_than_rest_allows_is_a_422_before_scoring():
    gated = CountingExecutor()
    gated.gate.set()
    async with client(app_of(gated)) as http:
        deep = await http.post("/verify", json=verify_body(extra=nested(65)), headers=ALICE)
        at_limit = await http.post("/verify", json=verify_body(extra=nested(64)),
                                   headers=ALICE)
    assert deep.status_code == 422
    [error] = deep.json()["detail"]
    assert error["loc"] == ["body", "extra"] and error["type"] == "too_deep"
    assert at_limit.status_code == 200 and at_limit.json()["extra"] == nested(64)
    assert gated.entered == 1  # only the one at the limit was scored


async def test_an_echoed_integer_the_writers_refuse_is_a_422_naming_it():
    gated = CountingExecutor()
    async with client(app_of(gated)) as http:
        # NaN sends the body through the stdlib reader, which keeps integers of any size
        body = json.dumps(verify_body(big=10 ** 30, score=float("nan")))
        r = await http.post("/verify", content=body,
                            headers={**ALICE, "Content-Type": "application/json"})
    assert r.status_code == 422
    assert {tuple(e["loc"]) for e in r.json()["detail"]} == {("body", "big")}
    assert gated.entered == 0
