"""The trainer protocols' work holds the tenant's slots like /v1/score, but a per-sample
request past the limit waits for a slot instead of a 429 (OpenRLHF drops a sample's reward
after five refusals); the samples waiting meanwhile are scored together in the next batch,
and a sample waiting for its group holds no slot (else the rest of its group could never get
in). Requests are held in flight by a gated executor, never by sleeping alone."""

from __future__ import annotations

import asyncio
import json

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant
from tests.compat.conftest import client
from tests.support.executors import GatedExecutor

ALICE = {"Authorization": "Bearer key-a"}
SAMPLE = {"prompt": "p", "response": "\\boxed{1}", "label": "1"}
SCORE = {"groups": [{"group_id": "g", "reference": {"answer": "1"},
                     "rollouts": [{"rollout_id": "r", "completion": "1"}]}],
         "rewards": [{"name": "m", "verifier": "exact_match"}],
         "advantage": {"output": "none"}}


def gated_app(executor: GatedExecutor, config: dict | None = None):
    return create_app(Settings(api_keys="key-a=alice", tenant_max_concurrent_jobs=1,
                               retry_after_s=3,
                               compat_config=json.dumps(config) if config else None),
                      executor=executor)


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def waiting_samples(app) -> int:
    """Samples of alice's read and waiting for a batch (order, not a pause: a busy machine
    reads them later, never into another batch)."""
    return app.state.services.compat.batcher.waiting("alice")


async def test_a_sample_past_the_tenants_limit_waits_for_the_slot_and_v1_is_refused():
    gated = GatedExecutor()
    app = gated_app(gated)
    async with client(app) as http:
        held = asyncio.create_task(http.post("/v1/score", json=SCORE, headers=ALICE))
        await until(lambda: gated.entered == 1)
        waiting = asyncio.create_task(http.post("/slime/reward", json=SAMPLE, headers=ALICE))
        refused = await http.post("/v1/score", json=SCORE, headers=ALICE)
        await asyncio.sleep(0.3)
        assert gated.entered == 1 and not waiting.done()  # no slot: not started, not refused
        gated.gate.set()
        assert (await held).status_code == 200
        answer = await waiting
    assert refused.status_code == 429
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0
    assert gated.entered == 2
    assert await app.state.services.limiter.in_use(Tenant("alice", 1, 1)) == 0


async def test_samples_arriving_while_a_batch_runs_are_scored_together():
    gated = GatedExecutor()
    app = gated_app(gated)
    async with client(app) as http:
        first = asyncio.create_task(http.post("/slime/reward", json=SAMPLE, headers=ALICE))
        await until(lambda: gated.entered == 1)
        rest = [asyncio.create_task(http.post("/get_reward", headers=ALICE, json={
            "query": [f"q{i} \\boxed{{1}}"], "prompts": [f"q{i} "], "labels": ["1"]}))
            for i in range(20)]
        await until(lambda: waiting_samples(app) == 20)  # all twenty read and waiting
        gated.gate.set()
        answers = [await t for t in [first, *rest]]
    assert [a.status_code for a in answers] == [200] * 21
    assert [a.json()["rewards"] for a in answers[1:]] == [[1.0]] * 20
    assert gated.entered <= 3  # the first sample's call, then one or two batches of the rest


async def test_samples_waiting_for_their_group_hold_no_slot():
    gated = GatedExecutor()
    gated.gate.set()
    app = gated_app(gated, {"group": {"size": 3, "timeout_s": 60}})
    async with client(app) as http:
        answers = await asyncio.gather(*(http.post("/slime/reward", json=SAMPLE,
                                                   headers=ALICE) for _ in range(3)))
    assert [a.status_code for a in answers] == [200, 200, 200], answers[0].text
    assert [a.json()["group_size"] for a in answers] == [3, 3, 3]
    # the samples are checked as they arrive (those arriving together in one call), none
    # held back by the tenant's one slot
    assert 1 <= gated.entered <= 3


async def test_a_bad_reference_in_a_shared_batch_fails_only_its_own_request():
    gated = GatedExecutor()
    app = gated_app(gated, {"rewards": [{"name": "tests", "verifier": "code"}]})
    good = {"prompt": "p", "response": "```python\nprint(1)\n```",
            "label": {"test_code": "assert True"}}
    async with client(app) as http:
        first = asyncio.create_task(http.post("/slime/reward", json=good, headers=ALICE))
        await until(lambda: gated.entered == 1)
        again = {**good, "response": "```python\nprint(2)\n```"}  # the cache has not seen it
        queued = [asyncio.create_task(http.post("/slime/reward", headers=ALICE, json=body))
                  for body in (again, {**good, "label": {"tset_code": "assert True"}}, again)]
        await until(lambda: waiting_samples(app) == 3)
        gated.gate.set()
        answers = [await t for t in [first, *queued]]
    assert [a.status_code for a in answers] == [200, 200, 422, 200], answers[2].text
    assert answers[2].json()["detail"][0]["loc"][:2] == ["body", "label"]
    assert "tset_code" in answers[2].json()["detail"][0]["msg"]
    assert gated.entered == 2  # the first call, then the two good samples together


class TimingOutExecutor(GatedExecutor):
    """Every check is a typed timeout, as a verifier past its limit reports it."""

    async def run(self, calls, progress=None, on_call_done=None):
        from rewardd.verifiers.base import FailureKind, Outcome
        from rewardd.workers.executor import CallResult, ItemResult

        self.entered += 1
        return [CallResult([ItemResult(Outcome.failure(FailureKind.timeout, "ran 30 s"), 30.0)
                            for _ in call.samples]) for call in calls]


async def test_a_failed_check_is_503_without_a_fallback_and_a_flagged_fallback_with_one():
    no_fallback = gated_app(TimingOutExecutor(),
                            {"rewards": [{"name": "correct", "verifier": "math"}]})
    async with client(no_fallback) as http:
        r = await http.post("/get_reward", headers=ALICE, json={
            "query": ["\\boxed{1}"], "prompts": [""], "labels": ["1"]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "correct: timeout" in r.json()["detail"]
    async with client(gated_app(TimingOutExecutor())) as http:  # the default: fallback 0.0
        nemo = await http.post("/verify", headers=ALICE, json={
            "responses_create_params": {"input": "q"}, "expected_answer": "1",
            "response": {"output": []}})
    assert nemo.status_code == 200
    assert (nemo.json()["reward"], nemo.json()["mask_sample"]) == (0.0, True)
    assert nemo.json()["failure_kind"] == "rewardd:timeout"
    assert nemo.json()["failure_reason"] == "correct: ran 30 s"
