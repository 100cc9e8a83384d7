"""The per-sample trainer protocols in the run record: a request that names a run (in its
URL's query, or REWARDD_COMPAT_CONFIG's run_id) has its samples recorded with their verdicts
and step, once each, also when they were scored in one batch or one group with other
requests'; a request that names none records nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Sequence

import pytest

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.workers.executor import CallResult, VerifyCall
from tests.records.test_runs_api import FLUSH_S, client, flush
from tests.support.executors import InlineExecutor

PROMPT = "Q: 2+2? "
RIGHT, WRONG = PROMPT + "so \\boxed{4}", PROMPT + "so \\boxed{5}"


def compat_app(record_url: str, config: dict[str, Any] | None = None,
               executor: Any = None) -> Any:
    return create_app(Settings(database_url=record_url, compat_config=json.dumps(config or {})),
                      executor=executor or InlineExecutor())


def nemo_gym_body(text: str, answer: str) -> dict[str, Any]:
    return {"responses_create_params": {"input": PROMPT}, "expected_answer": answer,
            "response": {"output": [{"type": "message", "content": [
                {"type": "output_text", "text": text}]}]}}


async def rollouts(http: Any, run_id: str, **params: Any) -> list[dict[str, Any]]:
    answer = await http.get(f"/v1/runs/{run_id}/rollouts", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()["rollouts"]


async def test_each_protocol_records_its_samples_under_the_run_it_names(
        record_url: str) -> None:
    app = compat_app(record_url, {"run_id": "gym-run"})  # for requests naming none
    async with client(app) as http:
        openrlhf = await http.post("/get_reward", params={"run_id": "exp-7", "step": 3},
                                   json={"query": [RIGHT, WRONG], "prompts": [PROMPT] * 2,
                                         "labels": ["4", "4"]})
        assert openrlhf.json()["rewards"] == [1.0, 0.0], openrlhf.text
        slime = await http.post("/slime/reward?run_id=exp-7&step=4",
                                json={"prompt": PROMPT, "response": "\\boxed{4}", "label": "4"})
        assert slime.json()["reward"] == 1.0, slime.text
        gym = await http.post("/verify", json=nemo_gym_body("it is \\boxed{5}", "5"))
        assert gym.json()["reward"] == 1.0, gym.text
        flush(app)

        runs = {r["run_id"]: r for r in (await http.get("/v1/runs")).json()["runs"]}
        assert {name: (r["rollouts"], r["last_step"]) for name, r in runs.items()} == {
            "exp-7": (3, 4), "gym-run": (1, None)}
        right, wrong = await rollouts(http, "exp-7", step=3)
        assert [r["completion"] for r in (right, wrong)] == ["so \\boxed{4}", "so \\boxed{5}"]
        assert [r["verdicts"]["correct"]["reward"] for r in (right, wrong)] == [1.0, 0.0]
        assert wrong["verdicts"]["correct"]["status"]["detail"]["extracted"] == "5"
        assert [r["summary"]["reward"] for r in (right, wrong)] == [1.0, 0.0]
        # one prompt and label: one group of the record, each sample a rollout of its own
        assert right["group_id"] == wrong["group_id"]
        assert right["rollout_id"] != wrong["rollout_id"]
        [slime_row] = await rollouts(http, "exp-7", step=4)
        assert slime_row["verdicts"]["correct"]["status"] == slime.json()["status"]["correct"]
        [gym_row] = await rollouts(http, "gym-run")
        assert gym_row["step"] is None and gym_row["completion"] == "it is \\boxed{5}"
        assert gym_row["verdicts"]["correct"]["reward"] == 1.0


async def test_without_a_run_named_nothing_is_recorded(record_url: str) -> None:
    app = compat_app(record_url)
    async with client(app) as http:
        body = {"query": [RIGHT], "prompts": [PROMPT], "labels": ["4"]}
        assert (await http.post("/get_reward", json=body)).json()["rewards"] == [1.0]
        assert (await http.post("/get_reward?step=3", json=body)).status_code == 200
        assert (await http.post("/verify", json=nemo_gym_body("4", "4"))).status_code == 200
        bad = await http.post("/get_reward?run_id=no spaces", json=body)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "run_id"]
        assert app.state.services.records.health() is None  # nothing was ever queued
        assert (await http.get("/v1/runs")).json()["runs"] == []


class HeldInline(InlineExecutor):
    """Real verdicts once :attr:`gate` opens; counts the scoring calls that entered and the
    samples they hold."""

    held = 0

    async def run(self, calls: Sequence[VerifyCall], progress: Any = None,
                  on_call_done: Any = None) -> list[CallResult]:
        self.entered += 1
        self.held += sum(len(call.samples) for call in calls)
        await self.gate.wait()
        return await super().run(calls, progress, on_call_done)


async def test_samples_batched_together_are_recorded_once_each_under_their_own_run(
        record_url: str) -> None:
    executor = HeldInline()
    app = compat_app(record_url, executor=executor)
    batcher = app.state.services.compat.batcher
    async with client(app) as http:
        async def post(i: int) -> Any:
            run = ("run-a", 1) if i % 2 else ("run-b", 2)
            return await http.post("/get_reward", params={"run_id": run[0], "step": run[1]},
                                   json={"query": [f"{PROMPT}so \\boxed{{{i}}}"],
                                         "prompts": [PROMPT], "labels": [str(i)]})

        answers = [asyncio.create_task(post(i)) for i in range(10)]
        for _ in range(int(FLUSH_S / 0.01)):  # both batches held, every sample in or waiting
            waiting = batcher.waiting("default")
            if executor.entered == 2 and executor.held + waiting == 10:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail(f"{executor.entered} calls holding {executor.held} samples")
        executor.gate.set()
        assert all(a.status_code == 200 for a in await asyncio.gather(*answers))
        # ten requests, scored in two or three calls: the held batches and what waited
        assert executor.entered == 2 + (waiting > 0)
        flush(app)
        a, b = await rollouts(http, "run-a"), await rollouts(http, "run-b")
    assert sorted(r["completion"] for r in a) == [f"so \\boxed{{{i}}}" for i in (1, 3, 5, 7, 9)]
    assert sorted(r["completion"] for r in b) == [f"so \\boxed{{{i}}}" for i in (0, 2, 4, 6, 8)]
    assert {r["step"] for r in a} == {1} and {r["step"] for r in b} == {2}
    assert all(r["verdicts"]["correct"]["reward"] == 1.0 for r in a + b)
    assert len({r["rollout_id"] for r in a + b}) == 10


GROUPS = {"group": {"size": 2, "timeout_s": 1.0, "advantage": {"estimator": "grpo"}},
          "openrlhf": {"value": "advantage"}}


async def test_group_mode_records_each_sample_once_in_its_group_of_its_run(
        record_url: str) -> None:
    app = compat_app(record_url, GROUPS)

    def body(completion: str) -> dict[str, Any]:
        return {"query": [PROMPT + completion], "prompts": [PROMPT], "labels": ["4"]}

    async with client(app) as http:
        pair = await asyncio.gather(*(http.post("/get_reward?run_id=grp&step=5", json=body(c))
                                      for c in ("\\boxed{4}", "\\boxed{5}")))
        assert [r.json()["extra_logs"]["rewardd_group_size"] for r in pair] == [[2.0], [2.0]]
        # the same prompt and label from two runs: two groups, each timing out alone
        apart = await asyncio.gather(*(http.post(f"/get_reward?run_id={run}", json=body(c))
                                       for run, c in (("one", "\\boxed{4}"),
                                                      ("two", "\\boxed{4}"))))
        assert [r.json()["extra_logs"]["rewardd_group_size"] for r in apart] == [[1.0], [1.0]]
        flush(app)
        right, wrong = sorted(await rollouts(http, "grp"), key=lambda r: r["completion"])
        [one], [two] = await rollouts(http, "one"), await rollouts(http, "two")
    assert right["group_id"] == wrong["group_id"]
    assert right["rollout_id"] != wrong["rollout_id"]
    assert (right["step"], right["verdicts"]["correct"]["reward"]) == (5, 1.0)
    advantages = {r["completion"]: r["summary"]["advantage_mean"] for r in (right, wrong)}
    sent = {c: r.json()["rewards"][0] for c, r in zip(("\\boxed{4}", "\\boxed{5}"), pair)}
    assert advantages == pytest.approx(sent) and sent["\\boxed{4}"] > 0 > sent["\\boxed{5}"]
    assert right["zero_advantage"] is False and one["zero_advantage"] is True
