"""Judges end to end: a real ``rewardd serve`` (embedded pool) grading with a rubric through a
real local OpenAI-compatible judge server; rewards, typed failures, dropout by step, and the
judge usage metrics."""

from __future__ import annotations

import statistics
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.judge_server import JudgeServer
from tests.support.server import ServerFailed, running_server

pytestmark = pytest.mark.e2e

RUBRIC = [{"criterion": "Mentions 'aspirin'", "points": 6},
          {"criterion": "Mentions 'water'", "points": 2},
          {"criterion": "Suggests 'alcohol'", "points": -4}]


@pytest.fixture(scope="module")
def judged(judge_server: JudgeServer) -> Iterator[str]:
    env = {"REWARDD_JUDGE_BASE_URL": judge_server.base_url, "REWARDD_JUDGE_MODEL": "rule-judge"}
    try:
        with running_server("--pool-size", "2", env=env) as url:
            yield url
    except ServerFailed as exc:
        pytest.fail(str(exc))


def batch(completions: list[str], **extra: Any) -> dict[str, Any]:
    return {"run_id": "judge-run", "groups": [{
        "group_id": "g0", "prompt": "What helps a headache?", "reference": {"rubric": RUBRIC},
        "rollouts": [{"rollout_id": f"r{i}", "completion": c, "num_tokens": 4}
                     for i, c in enumerate(completions)]}],
        "rewards": [{"name": "rubric", "verifier": "rubric", "params": extra.pop("params", {})}],
        **extra}


def test_rubric_rewards_and_advantages(judged: str) -> None:
    texts = ["Aspirin and water.", "Aspirin.", "Water, then alcohol.", "Nothing."]
    body = httpx.post(f"{judged}/v1/score", json=batch(texts), timeout=60).json()
    rollouts = body["groups"][0]["rollouts"]
    rewards = [r["rewards"]["rubric"] for r in rollouts]
    assert rewards == [1.0, 6 / 8, 0.0, 0.0]  # water 2 - alcohol 4 clips to 0
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    for r, reward in zip(rollouts, rewards):
        assert r["advantages"]["rle"][0][0] == pytest.approx((reward - mean) / (std + 1e-6),
                                                             rel=1e-12)
    detail = rollouts[2]["status"]["rubric"]["detail"]
    assert [c["met"] for c in detail["criteria"]] == [False, True, True]
    assert detail["judge"]["calls"] == 3


def test_a_judge_that_cannot_grade_is_a_typed_failure_excluded_from_the_baseline(
        judged: str) -> None:
    body = httpx.post(f"{judged}/v1/score", json=batch(
        ["Aspirin.", "GARBAGE-ME", "Nothing."], params={"retries": 1}), timeout=60).json()
    rollouts = body["groups"][0]["rollouts"]
    status = rollouts[1]["status"]["rubric"]
    assert status["ok"] is False and status["error"] == "judge_unparseable"
    assert rollouts[1]["rewards"]["rubric"] is None
    assert body["summary"]["failed_cells"] == 1
    # the baseline is the mean of the two graded rollouts (0.75 and 0), not of three
    assert rollouts[0]["advantages"]["rle"][0][0] > 0 > rollouts[2]["advantages"]["rle"][0][0]


def test_dropout_follows_the_step_and_is_off_for_evaluation(judged: str) -> None:
    rubric = [{"criterion": f"Mentions 'w{i}'", "points": 1} for i in range(8)]
    params = {"rubric": rubric, "dropout": 0.5, "dropout_seed": 3}

    def dropped(**extra: Any) -> list[list[int]]:
        body = httpx.post(f"{judged}/v1/rewards", json=batch(["w1 w2", "w3"], params=params,
                                                              **extra), timeout=60).json()
        return [r["status"]["rubric"]["detail"]["dropped"] for r in body["groups"][0]["rollouts"]]

    step1, step1_again, step2 = dropped(step=1), dropped(step=1), dropped(step=2)
    assert step1[0] == step1[1] and len(step1[0]) == 4  # one subset for the whole group
    assert step1 == step1_again                          # seeded: reproducible
    assert step2[0] != step1[0]                          # a new subset at the next step
    assert dropped(step=1, evaluation=True) == [[], []]


def test_judge_usage_is_exported_as_metrics(judged: str) -> None:
    httpx.post(f"{judged}/v1/score", json=batch(["Aspirin."]), timeout=60)
    text = httpx.get(f"{judged}/metrics").text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    base = {"verifier": "rubric", "backend": "default", "model": "rule-judge"}
    assert value("rewardd_judge_calls_total", result="answered", **base) >= 3
    assert value("rewardd_judge_tokens_total", kind="prompt", **base) > 0
    assert value("rewardd_judge_tokens_total", kind="completion", **base) > 0
