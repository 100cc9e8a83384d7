"""Judges on the distributed path: a real ``rewardd worker`` consuming only the ``gpu`` queue
grades a rubric through a real local OpenAI-compatible judge server; the same results as
the embedded pool, and the group context (step, evaluation) crosses the broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rewardd.service import pipeline
from rewardd.service.models import ScoreRequest
from tests.integration.conftest import PLUGINS, make_settings
from tests.support.judge_server import JudgeServer
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.embedded import EmbeddedExecutor

SETTINGS = make_settings()
RUBRIC = [{"criterion": f"Mentions 'w{i}'", "points": i + 1} for i in range(6)]


@pytest.fixture(scope="module")
def judge_env(judge_server: JudgeServer) -> dict[str, str]:
    return {"REWARDD_JUDGE_BASE_URL": judge_server.base_url,
            "REWARDD_JUDGE_MODEL": "rule-judge"}


@pytest.fixture(scope="module")
def gpu_worker(fleet_for: Any, judge_env: dict[str, str]) -> Any:
    return fleet_for(SETTINGS, judge_env).start(1, queues="gpu", concurrency=2)


def request(step: int, evaluation: bool = False) -> ScoreRequest:
    return ScoreRequest.model_validate({
        "run_id": "judge-run", "step": step, "evaluation": evaluation,
        "groups": [{"group_id": f"g{g}", "prompt": "Say some words.",
                    "reference": {"rubric": RUBRIC},
                    "rollouts": [{"rollout_id": f"g{g}-{i}", "num_tokens": 3,
                                  "completion": " ".join(f"w{j}" for j in range(i + g))}
                                 for i in range(4)]} for g in range(3)],
        "rewards": [{"name": "rubric", "verifier": "rubric",
                     "params": {"dropout": 0.5, "criteria_per_call": 3}}]})


def details(response: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(r["rewards"]["rubric"], tuple(r["status"]["rubric"]["detail"]["dropped"]))
            for g in response["groups"] for r in g["rollouts"]]


async def test_rubric_on_a_gpu_worker_matches_the_embedded_pool(
        gpu_worker: Any, judge_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in judge_env.items():
        monkeypatch.setenv(key, value)  # the embedded pool's processes inherit it
    celery = CeleryExecutor(SETTINGS)
    embedded = EmbeddedExecutor(2, (PLUGINS,))  # one forkserver per process: same preload
    try:
        assert await embedded.ready(wait_s=120)
        for step, evaluation in ((1, False), (2, False), (2, True)):
            req = request(step, evaluation)
            distributed = await asyncio.wait_for(pipeline.score(req, celery, SETTINGS), 120)
            local = await pipeline.score(req, embedded, SETTINGS)
            assert details(distributed) == details(local)
            assert distributed["summary"]["failed_cells"] == 0
            dropped = {d for _, d in details(distributed)}
            if evaluation:
                assert dropped == {()}
            else:
                assert all(len(d) == 3 for d in dropped)
                assert len(dropped) == 3  # each group its own subset
    finally:
        celery.close()
        embedded.close()
