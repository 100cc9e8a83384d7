"""The sentinel through the API, on a real recorded run: a scripted policy drifting into the
lenient-reading exploit (tests/support/policy_sim.py) is scored step by step over HTTP with
its run recorded in SQLite; the alert appears in GET /v1/runs/{id}/alerts at the step the
acceptance test expects, in the run's next answers (summary.sentinel) and in the metric; the
run view's steps carry the statistics the inspector charts (audit agreement, signals)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rewardd.service import metrics
from rewardd.service.sentinel import SIGNALS
from tests.records.test_runs_api import ALICE, BOB, KEYS, client, flush, recorded_app
from tests.support.policy_sim import EXPLOITS, ONSET, step_request

STEPS = ONSET + 10


def counted(signal: str) -> float:
    return float(metrics.SENTINEL_ALERTS.labels(signal)._value.get())


async def test_an_exploit_is_alerted_over_the_api_in_the_answers_and_the_metric(
        tmp_path: Path) -> None:
    app = recorded_app(tmp_path, api_keys=KEYS)
    rng, before = random.Random(7), counted("lenient_fallback")
    answers = []
    async with client(app) as http:
        for step in range(STEPS):
            body = step_request("drift", step, rng, EXPLOITS["lenient_fallback"]).model_dump(
                mode="json", exclude_none=True)
            answer = await http.post("/v1/score", json=body, headers=ALICE)
            assert answer.status_code == 200, answer.text
            answers.append(answer.json()["summary"])
            flush(app)  # the sentinel looks at each step as it is written

        found = (await http.get("/v1/runs/drift/alerts", headers=ALICE)).json()
        assert found["steps"] == STEPS
        assert [s["name"] for s in found["signals"]] == [s.name for s in SIGNALS]
        lenient = [a for a in found["alerts"] if a["signal"] == "lenient_fallback"]
        assert lenient and ONSET <= lenient[0]["step"] <= ONSET + 10
        assert "lenient reading" in lenient[0]["message"]
        assert counted("lenient_fallback") - before == len(lenient)
        # the answers after the raise carry it (a step behind: recorded after answering)
        raised = lenient[0]["step"]
        assert "lenient_fallback" in {a["signal"]
                                      for a in answers[raised + 1]["sentinel"]["alerts"]}
        assert answers[5]["sentinel"]["alerts"] == []
        assert "sentinel" not in answers[0]  # nothing recorded yet when it was answered

        view = (await http.get("/v1/runs/drift", params={"steps": 3},
                               headers=ALICE)).json()
        newest = view["steps"][0]
        assert newest["step"] == STEPS - 1
        assert newest["signals"]["lenient_share"] == pytest.approx(1.0, abs=0.05)
        assert newest["audit"]["strict"]["compared"] > 0
        assert newest["reward_mean"] is not None and newest["source_rewards"]["math"] > 0
        # another tenant sees no such run
        assert (await http.get("/v1/runs/drift/alerts", headers=BOB)).status_code == 404
