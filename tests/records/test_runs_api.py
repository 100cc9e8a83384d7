"""The run record through the API: a scored batch with a `run_id` is recorded (REST score,
rewards and jobs), listed by GET /v1/runs, summarised per step by GET /v1/runs/{run_id} and
paged by GET /v1/runs/{run_id}/rollouts with real math verdicts; tenants see their own runs
only; the completion policy; a database that cannot be reached never fails scoring and is
reported (/readyz, 503 on the queries)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
import tests.plugins.faulty  # noqa: F401 - registers test_raise in this process
from tests.support.executors import InlineExecutor
from tests.support.redis_server import free_port

ALICE = {"Authorization": "Bearer alice-key"}
BOB = {"Authorization": "Bearer bob-key"}
KEYS = "alice-key=alice,bob-key=bob"
FLUSH_S = 120.0
"""A guard against a hang only."""


def score_body(run_id: str | None = "run-1", step: int | None = 3, groups: int = 2,
               source: str | None = None) -> dict[str, Any]:
    """Each group: a right answer, a wrong one, and one without any number."""
    body: dict[str, Any] = {
        "rewards": [{"name": "math", "verifier": "math"}],
        "advantage": {"estimator": "grpo"},
        "groups": [{"group_id": f"g{i}", "reference": {"answer": str(i + 2)},
                    **({"source": source} if source else {}),
                    "rollouts": [
                        {"rollout_id": f"g{i}-right", "completion": f"so \\boxed{{{i + 2}}}",
                         "num_tokens": 2},
                        {"rollout_id": f"g{i}-wrong", "completion": f"so \\boxed{{{i + 9}}}",
                         "num_tokens": 2},
                        {"rollout_id": f"g{i}-none", "completion": "no idea", "num_tokens": 1},
                    ]} for i in range(groups)]}
    if run_id is not None:
        body["run_id"] = run_id
    if step is not None:
        body["step"] = step
    return body


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://rewardd")


def recorded_app(tmp_path: Path, **settings: Any) -> Any:
    return create_app(Settings(data_dir=str(tmp_path), **settings), executor=InlineExecutor())


def flush(app: Any) -> None:
    assert app.state.services.records.writer().flush(FLUSH_S)


async def test_a_scored_run_is_recorded_listed_summarised_and_paged(tmp_path: Path) -> None:
    app = recorded_app(tmp_path)
    async with client(app) as http:
        scored = await http.post("/v1/score", json=score_body(step=3, source="gsm8k"))
        assert scored.status_code == 200, scored.text
        assert [g["source"] for g in scored.json()["groups"]] == ["gsm8k", "gsm8k"]
        rewards_only = score_body(step=4)
        del rewards_only["advantage"]
        for group in rewards_only["groups"]:  # the record falls back on data_source
            group["data_source"] = "math-train"
        assert (await http.post("/v1/rewards", json=rewards_only)).status_code == 200
        unrecorded = await http.post("/v1/score", json=score_body(run_id=None))
        assert unrecorded.status_code == 200
        assert "source" not in unrecorded.json()["groups"][0]  # echoed only when sent
        flush(app)

        runs = (await http.get("/v1/runs")).json()["runs"]
        assert [(r["run_id"], r["rollouts"], r["last_step"]) for r in runs] == [
            ("run-1", 12, 4)]  # the batch without a run_id is not recorded
        view = (await http.get("/v1/runs/run-1")).json()
        assert view["state"] is None and view["record"]["rollouts"] == 12
        [four, three] = view["steps"]
        assert (three["step"], three["rollouts"], three["sources"]) == (3, 6, {"gsm8k": 6})
        math = three["components"]["math"]
        assert math["rollouts"] == 6 and math["mean"] == pytest.approx(1 / 3)
        assert four["sources"] == {"math-train": 6}
        assert three["mean_length"] == pytest.approx(5 / 3)  # num_tokens 2, 2, 1 per group
        assert three["zero_advantage_fraction"] == 0.0  # every group has spread
        assert four["zero_advantage_fraction"] is None  # /v1/rewards: no advantages

        page = (await http.get("/v1/runs/run-1/rollouts", params={"step": 3})).json()
        answered = {r["rollout_id"]: r for g in scored.json()["groups"] for r in g["rollouts"]}
        assert [r["rollout_id"] for r in page["rollouts"]] == list(answered)
        for item in page["rollouts"]:
            sent = answered[item["rollout_id"]]
            assert item["verdicts"]["math"]["reward"] == sent["rewards"]["math"]
            assert item["verdicts"]["math"]["status"] == sent["status"]["math"]
            assert item["summary"]["reward"] == sent["reward"]
            runs = sent["advantages"]["rle"]  # the default output
            assert item["num_tokens"] == sum(n for _, n in runs) == sent["num_tokens"]
            assert item["zero_advantage"] is all(v == 0 for v, _ in runs)
            assert item["summary"]["advantage_mean"] == pytest.approx(
                sum(v * n for v, n in runs) / sum(n for _, n in runs))
            assert item["source"] == "gsm8k" and item["step"] == 3
        assert page["rollouts"][0]["completion"] == "so \\boxed{2}"
        assert page["next_cursor"] is None

        seen, cursor = [], None
        while True:
            params: dict[str, Any] = {"limit": 5, **({"cursor": cursor} if cursor else {})}
            body = (await http.get("/v1/runs/run-1/rollouts", params=params)).json()
            seen += [r["rollout_id"] for r in body["rollouts"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == 12
        text = (await http.get("/v1/runs/run-1/rollouts", params={"q": "boxed{9}"})).json()
        assert [r["rollout_id"] for r in text["rollouts"]] == ["g0-wrong", "g0-wrong"]
        bad = await http.get("/v1/runs/run-1/rollouts", params={"cursor": "x1"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "cursor"]
        assert (await http.get("/v1/runs/nope/rollouts")).status_code == 404
        assert (await http.get("/v1/runs/nope")).status_code == 404
        ready = (await http.get("/readyz")).json()["record"]
        assert ready["ok"] is True and ready["written"] == 12


async def test_a_failed_verdict_is_recorded_with_its_kind_and_filtered(tmp_path: Path) -> None:
    app = recorded_app(tmp_path)
    body = {"run_id": "run-1", "step": 0,
            "rewards": [{"name": "echo", "verifier": "test_raise", "params": {"when": ["boom"]}}],
            "groups": [{"group_id": "g", "rollouts": [
                {"rollout_id": rid, "completion": rid} for rid in ("1", "0", "boom")]}]}
    async with client(app) as http:
        answer = (await http.post("/v1/rewards", json=body)).json()
        flush(app)
        status = answer["groups"][0]["rollouts"][2]["status"]["echo"]
        assert status["ok"] is False
        failed = (await http.get("/v1/runs/run-1/rollouts",
                                 params={"outcome": "failed"})).json()["rollouts"]
        assert [r["rollout_id"] for r in failed] == ["boom"]
        verdict = failed[0]["verdicts"]["echo"]
        assert (verdict["outcome"], verdict["reward"]) == (status["error"], None)
        assert verdict["status"] == status
        by_kind = (await http.get("/v1/runs/run-1/rollouts", params={
            "component": "echo", "outcome": status["error"]})).json()["rollouts"]
        assert [r["rollout_id"] for r in by_kind] == ["boom"]
        ok = (await http.get("/v1/runs/run-1/rollouts", params={"outcome": "ok"})).json()
        assert [r["rollout_id"] for r in ok["rollouts"]] == ["1", "0"]
        view = (await http.get("/v1/runs/run-1")).json()
        assert view["steps"][0]["components"]["echo"]["failures"] == {status["error"]: 1}
        assert view["steps"][0]["failed_rollouts"] == 1


async def test_tenants_see_only_their_own_runs(tmp_path: Path) -> None:
    app = recorded_app(tmp_path, api_keys=KEYS)
    async with client(app) as http:
        assert (await http.post("/v1/score", json=score_body(), headers=ALICE)).status_code \
            == 200
        assert (await http.post("/v1/score", json=score_body(run_id="bobs", groups=1),
                                headers=BOB)).status_code == 200
        flush(app)
        alice = (await http.get("/v1/runs", headers=ALICE)).json()["runs"]
        bob = (await http.get("/v1/runs", headers=BOB)).json()["runs"]
        assert [r["run_id"] for r in alice] == ["run-1"]
        assert [r["run_id"] for r in bob] == ["bobs"]
        assert (await http.get("/v1/runs/run-1", headers=BOB)).status_code == 404
        assert (await http.get("/v1/runs/run-1/rollouts", headers=BOB)).status_code == 404
        assert (await http.get("/v1/runs")).status_code == 401


@pytest.mark.parametrize("policy, kept", [
    ("all", {"g0-right", "g0-wrong", "g0-none"}),
    ("failed", {"g0-wrong", "g0-none"}),  # reward 0 counts as failed for keeping
    ("none", set()),
])
async def test_the_completion_policy_decides_which_texts_are_kept(
        tmp_path: Path, policy: str, kept: set[str]) -> None:
    app = recorded_app(tmp_path, record_completions=policy)
    async with client(app) as http:
        assert (await http.post("/v1/score", json=score_body(groups=1))).status_code == 200
        flush(app)
        page = (await http.get("/v1/runs/run-1/rollouts")).json()["rollouts"]
        assert {r["rollout_id"] for r in page if r["completion"] is not None} == kept
        assert len(page) == 3


async def test_recording_off_records_nothing_and_says_so(tmp_path: Path) -> None:
    app = recorded_app(tmp_path, record_runs=False)
    async with client(app) as http:
        assert (await http.post("/v1/score", json=score_body())).status_code == 200
        listed = await http.get("/v1/runs")
        assert listed.status_code == 404 and "REWARDD_RECORD_RUNS" in listed.text
        assert (await http.get("/readyz")).json()["record"] == {"enabled": False}
    assert not (tmp_path / "records.sqlite3").exists()


async def test_a_database_that_cannot_be_reached_never_fails_scoring(tmp_path: Path) -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    app = recorded_app(tmp_path, database_url=dead)
    async with client(app) as http:
        scored = await http.post("/v1/score", json=score_body())
        assert scored.status_code == 200 and scored.json()["summary"]["rollouts"] == 6
        writer = app.state.services.records.writer()
        assert not writer.flush(1.0)
        record = (await http.get("/readyz")).json()["record"]
        assert record["ok"] is False and record["queued"] == 6
        assert record["failing_since"] and "OperationalError" in record["last_error"]
        listed = await http.get("/v1/runs")
        assert listed.status_code == 503
        assert "REWARDD_DATABASE_URL" in listed.json()["detail"]


def test_a_job_with_a_run_id_is_recorded_too(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    app = recorded_app(tmp_path)
    with TestClient(app) as http:  # the lifespan runs the job runner
        job = http.post("/v1/jobs", json=score_body(run_id="via-job", step=7)).json()
        for _ in range(int(FLUSH_S / 0.05)):
            state = http.get(f"/v1/jobs/{job['id']}").json()["state"]
            if state not in ("queued", "running"):
                break
            time.sleep(0.05)
        assert state == "succeeded"
        flush(app)
        view = http.get("/v1/runs/via-job").json()
        assert view["record"]["rollouts"] == 6 and view["record"]["last_step"] == 7


async def test_a_tenant_runs_a_bounded_number_of_record_queries_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """REWARDD_TENANT_MAX_RECORD_QUERIES: a tenant past its bound is refused with 429 naming
    the setting while its queries run; another tenant's query is served meanwhile, and the
    first tenant is served again once its query ended."""
    import asyncio
    import threading

    from rewardd.service.records.store import RecordStore

    app = recorded_app(tmp_path, api_keys=KEYS, tenant_max_record_queries=1)
    release, entered = threading.Event(), threading.Event()
    real_runs = RecordStore.runs

    def slow_runs(self: RecordStore, tenant: str, limit: int = 100) -> Any:
        if tenant == "alice" and not release.is_set():
            entered.set()
            assert release.wait(FLUSH_S)
        return real_runs(self, tenant, limit)

    monkeypatch.setattr(RecordStore, "runs", slow_runs)
    async with client(app) as http:
        assert (await http.post("/v1/score", json=score_body(), headers=ALICE)).status_code == 200
        flush(app)
        held = asyncio.create_task(http.get("/v1/runs", headers=ALICE))
        assert await asyncio.to_thread(entered.wait, FLUSH_S)
        refused = await http.get("/v1/runs/run-1/rollouts", headers=ALICE)
        assert refused.status_code == 429 and "Retry-After" in refused.headers
        assert "REWARDD_TENANT_MAX_RECORD_QUERIES" in refused.json()["detail"]
        assert (await http.get("/v1/runs", headers=BOB)).status_code == 200
        release.set()
        assert (await held).status_code == 200
        assert (await http.get("/v1/runs/run-1/rollouts", headers=ALICE)).status_code == 200
