"""Replay (POST /v1/runs/{run_id}/reverify): a recorded run re-scored with changed verifier
parameters reports exactly the verdicts that flip, with both receipts, as a job; unchanged
parameters flip nothing; rollouts recorded without their completion are skipped; bad
overrides are a 422 naming the field; another tenant's run is not there. On SQLite and a
real PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rewardd.service.models import JobStatus
from tests.records.test_runs_api import ALICE, BOB, KEYS, client, flush, recorded_app
from tests.support.jobs import final

# (completion, reference): what the math verifier's default (`extract: auto`) accepts and
# what `extract: boxed` accepts; the flips of that change are known in advance
ROLLOUTS = [
    ("so \\boxed{4}", "4", 1.0, 1.0),
    ("The answer is 4.", "4", 1.0, 0.0),   # found by `auto` only
    ("x = 7, so the answer is 7", "7", 1.0, 0.0),
    ("\\boxed{5}", "4", 0.0, 0.0),
    ("I think 9", "9", 1.0, 0.0),
]


def run_body(step: int, run_id: str = "replayed") -> dict[str, Any]:
    return {"run_id": run_id, "step": step, "rewards": [{"name": "m", "verifier": "math"}],
            "advantage": {"estimator": "grpo"},
            "groups": [{"group_id": f"s{step}-g{i}", "reference": {"answer": ref},
                        "source": "gsm8k" if i % 2 else "math",
                        "rollouts": [{"rollout_id": f"s{step}-g{i}-r", "completion": text,
                                      "num_tokens": 3}]}
                       for i, (text, ref, _, _) in enumerate(ROLLOUTS)]}


async def _recorded(http: Any, app: Any, steps: range, headers: dict | None = None) -> None:
    for step in steps:
        answer = await http.post("/v1/score", json=run_body(step), headers=headers)
        assert answer.status_code == 200, answer.text
        rewards = [g["rollouts"][0]["rewards"]["m"] for g in answer.json()["groups"]]
        assert rewards == [before for _, _, before, _ in ROLLOUTS]
    flush(app)


async def _reverify(http: Any, body: dict, headers: dict | None = None) -> dict[str, Any]:
    submitted = await http.post("/v1/runs/replayed/reverify", json=body, headers=headers)
    assert submitted.status_code == 202, submitted.text
    job = await final(http, submitted.json()["id"], headers)
    assert job["state"] == "succeeded", job["error"]
    JobStatus.model_validate(job)
    return job


async def test_a_parameter_change_reports_exactly_the_verdicts_that_flip(
        tmp_path: Path, record_url: str) -> None:
    app = recorded_app(tmp_path, database_url=record_url)
    async with app.router.lifespan_context(app), client(app) as http:
        await _recorded(http, app, range(3))
        job = await _reverify(http, {"steps": [1, 2], "set": {"m.extract": "boxed"}})
        result = job["result"]
        expected = {(f"s{step}-g{i}-r", before, after)
                    for step in (1, 2) for i, (_, _, before, after) in enumerate(ROLLOUTS)
                    if before != after}
        assert {(f["rollout_id"], f["before"], f["after"]) for f in result["flips"]} == expected
        flip = result["flips"][0]
        assert flip["component"] == "m" and flip["step"] in (1, 2)
        assert flip["outcomes"] == {"before": "ok", "after": "ok"}
        before, after = flip["receipts"]["before"], flip["receipts"]["after"]
        assert before["verifier"] == after["verifier"] == "math"
        assert before["completion_hash"] == after["completion_hash"]
        assert before["reference_hash"] == after["reference_hash"]
        assert before["params_hash"] != after["params_hash"]  # what changed: the params
        summary = result["summary"]
        assert (summary["rollouts"], summary["rescored"], summary["skipped"]) == (10, 10, 0)
        assert summary["flips"] == len(expected) == 6
        assert summary["components"]["m"] == {"rescored": 10, "flipped": 6, "up": 0, "down": 6}
        assert summary["sources"]["gsm8k"] == {"rescored": 4, "flipped": 2, "up": 0, "down": 2}
        assert summary["sources"]["math"]["flipped"] == 4  # rollouts 2 and 4 of each step
        assert job["progress"] == {"done": 10, "total": 10}

        same = (await _reverify(http, {}))["result"]
        assert same["flips"] == [] and same["summary"]["rescored"] == 15


async def test_rollouts_without_their_completion_are_skipped(tmp_path: Path) -> None:
    app = recorded_app(tmp_path, record_completions="none")
    async with app.router.lifespan_context(app), client(app) as http:
        await _recorded(http, app, range(2))
        result = (await _reverify(http, {}))["result"]
        assert result["flips"] == []
        assert result["summary"] | {"components": None, "sources": None} == {
            "rollouts": 10, "rescored": 0, "skipped": 10, "checks": 0, "flips": 0,
            "components": None, "sources": None}
        overriding = await http.post("/v1/runs/replayed/reverify",
                                     json={"set": {"m.extract": "boxed"}})
        assert overriding.status_code == 422  # nothing recorded that `set` could change
        assert "none recorded with completions" in overriding.json()["detail"][0]["msg"]


async def test_bad_overrides_and_unknown_runs_are_refused_with_the_field(tmp_path: Path) -> None:
    app = recorded_app(tmp_path, api_keys=KEYS)
    async with app.router.lifespan_context(app), client(app) as http:
        await _recorded(http, app, range(1), ALICE)
        cases = [({"set": {"nope.extract": "boxed"}}, ["body", "set", "nope.extract"],
                  "no component 'nope'"),
                 ({"set": {"m.extract": "sometimes"}}, ["body", "set"], "extract"),
                 ({"set": {"extract": "boxed"}}, ["body", "set"], "<component>.<param>"),
                 ({"steps": [3, 1]}, ["body", "steps"], "first <= last")]
        for body, loc, reason in cases:
            answer = await http.post("/v1/runs/replayed/reverify", json=body, headers=ALICE)
            assert answer.status_code == 422, (body, answer.text)
            detail = answer.json()["detail"][0]
            assert detail["loc"] == loc and reason in detail["msg"], detail
        missing = await http.post("/v1/runs/other/reverify", json={}, headers=ALICE)
        assert missing.status_code == 404
        theirs = await http.post("/v1/runs/replayed/reverify", json={}, headers=BOB)
        assert theirs.status_code == 404  # another tenant's run is not there


async def test_a_per_sample_protocol_run_can_be_replayed(tmp_path: Path) -> None:
    """A slime request naming its run in the URL is recorded with the configuration's reward
    components, so replay re-scores it like a batch."""
    app = recorded_app(tmp_path)
    async with app.router.lifespan_context(app), client(app) as http:
        for response, label in (("The answer is 4.", "4"), ("\\boxed{5}", "5")):
            answer = await http.post("/slime/reward?run_id=replayed&step=1",
                                     json={"prompt": "p", "response": response, "label": label})
            assert answer.status_code == 200 and answer.json()["reward"] == 1.0, answer.text
        flush(app)
        result = (await _reverify(http, {"set": {"correct.extract": "boxed"}}))["result"]
        assert result["summary"]["rescored"] == 2
        assert [(f["component"], f["before"], f["after"]) for f in result["flips"]] == [
            ("correct", 1.0, 0.0)]
