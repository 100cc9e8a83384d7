"""Judges on the distributed path: a real ``rewardd worker`` consuming only the ``gpu`` queue
grades a rubric through a real local OpenAI-compatible judge server; the same results as
the embedded pool, and the group context (step, evaluation) crosses the broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rewardd.service import pipeline
from rewardd.service.models import ScoreRequest
from tests.integration.conftest import PLUGINS, make_settings
from tests.support.judge_server import JudgeServer
from rewardd.workers.distributed import CeleryExecutor

SETTINGS = make_settings()
REPO = Path(__file__).resolve().parents[2]
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


EMBEDDED_SCRIPT = """
import asyncio, json, sys
from rewardd.service import pipeline
from rewardd.workers.embedded import EmbeddedExecutor
from tests.integration.test_judges import SETTINGS, PLUGINS, request, details

async def main():
    embedded = EmbeddedExecutor(2, (PLUGINS,))
    try:
        assert await embedded.ready(wait_s=120)
        out = []
        for step, evaluation in json.loads(sys.argv[1]):
            out.append(details(await pipeline.score(request(step, evaluation), embedded, SETTINGS)))
        print(json.dumps(out))
    finally:
        embedded.close()

asyncio.run(main())
"""

STEPS = ((1, False), (2, False), (2, True))


def embedded_details(judge_env: dict[str, str]) -> list[list[Any]]:
    """The same requests through an embedded pool in a fresh process: pool processes fork
    from their process's forkserver and inherit its environment, and one started by an
    earlier test in this process lacks the judge's address."""
    env = {**os.environ, **judge_env}
    done = subprocess.run([sys.executable, "-c", EMBEDDED_SCRIPT, json.dumps(STEPS)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


async def test_rubric_on_a_gpu_worker_matches_the_embedded_pool(
        gpu_worker: Any, judge_env: dict[str, str]) -> None:
    local = await asyncio.to_thread(embedded_details, judge_env)
    celery = CeleryExecutor(SETTINGS)
    try:
        for (step, evaluation), local_details in zip(STEPS, local):
            req = request(step, evaluation)
            distributed = await asyncio.wait_for(pipeline.score(req, celery, SETTINGS), 120)
            as_json = json.loads(json.dumps(details(distributed)))
            assert as_json == local_details
            assert distributed["summary"]["failed_cells"] == 0
            dropped = {d for _, d in details(distributed)}
            if evaluation:
                assert dropped == {()}
            else:
                assert all(len(d) == 3 for d in dropped)
                assert len(dropped) == 3  # each group its own subset
    finally:
        celery.close()
