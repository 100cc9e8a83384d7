"""Issue 30, item 2: audit components. Scored on a share of the rollouts, beside the batch;
reported per rollout and per component (agreement with the training reward); recorded; never
part of rewards or advantages; refused with the field named when malformed.

Real verifiers run by the worker's task function in this process (:class:`InlineExecutor`).
The audit that disagrees is the math verifier restricted to boxed answers, auditing the
default math verifier, which also reads "The answer is 42." (a stricter second opinion)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from rewardd.service import audit, pipeline
from rewardd.service.agreement import Agreement, ranks, spearman
from rewardd.service.app import create_app
from rewardd.service.grpc.convert import score_response
from rewardd.service.models import ScoreRequest, ScoreResponse
from rewardd.service.records.recorder import batch_rows
from rewardd.service.records.store import ROW_COLUMNS
from rewardd.service.settings import Settings
from tests.support.executors import CountingInlineExecutor, InlineExecutor

STRICT = {"name": "strict", "verifier": "math", "params": {"extract": "boxed"}}


def body(groups: int = 4, completions: tuple[str, ...] = ("\\boxed{42}", "\\boxed{41}",
                                                         "The answer is 42.", "no idea"),
         audit_specs: list[dict[str, Any]] | None = None, **extra: Any) -> ScoreRequest:
    return ScoreRequest.model_validate({
        "run_id": "exp", "step": 3,
        "groups": [{"group_id": f"q{g}", "prompt": "Solve it.", "reference": {"answer": "42"},
                    "rollouts": [{"rollout_id": f"q{g}-{i}", "completion": c, "num_tokens": 4}
                                 for i, c in enumerate(completions)]}
                   for g in range(groups)],
        "rewards": [{"name": "correct", "verifier": "math"}],
        "audit": audit_specs if audit_specs is not None else [{**STRICT, "rate": 1.0}],
        **extra})


def score(req: ScoreRequest, executor: InlineExecutor | None = None) -> dict[str, Any]:
    out = asyncio.run(pipeline.score(req, executor or InlineExecutor(), Settings()))
    ScoreResponse.model_validate(out)
    return out


def without_audit(out: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(out)
    out["summary"].pop("audit", None)
    for group in out["groups"]:
        for rollout in group["rollouts"]:
            rollout.pop("audit", None)
    return out


# ---- agreement -----------------------------------------------------------------------------

def test_spearman_matches_published_and_hand_computed_values() -> None:
    # SciPy's documented example of scipy.stats.spearmanr (ties in the second sample)
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233,
                                                                       abs=1e-15)
    # no ties: 1 - 6 sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 4 / 120
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8, abs=1e-15)
    assert ranks([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]


def test_spearman_sees_ranks_only_and_refuses_what_has_none() -> None:
    xs, ys = [0.1, 0.9, 0.4, 0.3, 0.7], [1.0, 3.0, 2.5, 0.5, 2.0]
    assert spearman(xs, ys) == spearman([x ** 3 for x in xs], [y * 10 - 4 for y in ys])
    assert spearman(xs, [-y for y in ys]) == pytest.approx(-spearman(xs, ys))
    assert spearman([1, 2], [2, 1]) is None          # under 3 pairs
    assert spearman([1, 1, 1], [1, 2, 3]) is None    # one side constant
    gap = Agreement.of([(1.0, 0.0), (1.0, 1.0), (0.0, 0.0)])
    assert gap.mean_gap == pytest.approx(1 / 3) and gap.compared == 3


# ---- scoring -------------------------------------------------------------------------------

def test_audit_never_changes_rewards_or_advantages() -> None:
    audited = score(body())
    plain = score(body(audit_specs=[]))
    assert "audit" in audited["summary"] and "audit" not in plain["summary"]
    assert without_audit(audited) == plain


def test_each_audited_rollout_carries_the_audit_verdict_with_its_receipt() -> None:
    out = score(body(groups=1))
    verdicts = [r["audit"]["strict"] for r in out["groups"][0]["rollouts"]]
    assert [v["reward"] for v in verdicts] == [1.0, 0.0, 0.0, 0.0]
    assert [r["reward"] for r in out["groups"][0]["rollouts"]] == [1.0, 0.0, 1.0, 0.0]
    assert all(v["ok"] and v["receipt"]["verifier"] == "math" for v in verdicts)
    assert verdicts[2]["detail"]["rule"] != out["groups"][0]["rollouts"][2]["status"][
        "correct"]["detail"]["rule"]  # the evidence is the audit's own


def test_the_summary_reports_agreement_over_the_audited_rollouts() -> None:
    out = score(body(groups=3))
    pairs = [(r["reward"], r["audit"]["strict"]["reward"])
             for g in out["groups"] for r in g["rollouts"]]
    report = out["summary"]["audit"]["strict"]
    assert report["rollouts"] == report["compared"] == 12 and report["failed"] == 0
    assert report["agreement"] == spearman([t for t, _ in pairs], [a for _, a in pairs])
    assert 0 < report["agreement"] < 1
    assert report["mean_gap"] == pytest.approx(0.25)  # "The answer is 42." only training likes
    assert report["training_mean"] == 0.5 and report["audit_mean"] == 0.25


def test_rollouts_are_audited_at_the_rate_by_a_hash_of_their_identity() -> None:
    req = body(groups=100, audit_specs=[{**STRICT, "rate": 0.25},
                                       {**STRICT, "name": "again", "rate": 0.25}])
    out = score(req)
    picked = {name: {r["rollout_id"] for g in out["groups"] for r in g["rollouts"]
                     if name in r.get("audit", {})} for name in ("strict", "again")}
    assert 60 <= len(picked["strict"]) <= 140  # 400 rollouts at 0.25 (binomial sd 8.7)
    assert picked["strict"] != picked["again"]  # each component draws its own share
    assert out["summary"]["audit"]["strict"]["rollouts"] == len(picked["strict"])
    again = score(req)
    assert {r["rollout_id"] for g in again["groups"] for r in g["rollouts"]
            if "strict" in r.get("audit", {})} == picked["strict"]
    assert all(audit.audited("exp", 3, rid.split("-")[0], rid, "strict", 0.25)
               for rid in picked["strict"])


def test_a_component_that_audited_nothing_still_reports() -> None:
    out = score(body(groups=1, completions=("\\boxed{42}",),
                     audit_specs=[{**STRICT, "rate": 1e-9}]))
    assert out["summary"]["audit"]["strict"]["rollouts"] == 0
    assert out["summary"]["audit"]["strict"]["agreement"] is None


def test_audit_calls_ride_in_the_batch_executor_run() -> None:
    executor = CountingInlineExecutor()
    score(body(groups=2, canaries=False), executor)
    assert executor.runs == [2 + 2]  # the batch's two calls and one audit call per group


def test_the_record_keeps_each_audited_rollouts_audit_verdicts() -> None:
    req = body(groups=2)
    out = score(req)
    rows = batch_rows("t", "exp", 3, req.groups, out, Settings(), 0.0)
    at = ROW_COLUMNS.index("summary")
    kept = [orjson.loads(row.values[at])["audit"] for row in rows]
    answered = [r["audit"] for g in out["groups"] for r in g["rollouts"]]
    assert kept == answered


def test_the_grpc_answer_carries_the_audit() -> None:
    message = score_response(score(body(groups=1)))
    assert message.summary.audit["strict"].compared == 4
    assert message.groups[0].rollouts[2].audit["strict"].reward == 0.0
    assert message.groups[0].rollouts[0].audit["strict"].receipt.verifier == "math"


# ---- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, loc, words", [
    ({"name": "a", "verifier": "nope", "rate": 0.5}, ["body", "audit", 0, "verifier"], "nope"),
    ({"name": "a", "verifier": "math", "rate": 0}, ["body", "audit", 0, "rate"], "greater than"),
    ({"name": "a", "verifier": "math"}, ["body", "audit", 0, "rate"], "required"),
    ({"name": "a", "verifier": "math", "rate": 0.5, "params": {"extract": "maybe"}},
     ["body", "audit", 0, "params", "extract"], "auto"),
])
def test_a_malformed_audit_is_refused_naming_the_field(spec: dict, loc: list, words: str
                                                       ) -> None:
    request = body(audit_specs=[]).model_dump(mode="json")
    request["audit"] = [spec]
    with TestClient(create_app(Settings())) as client:
        answer = client.post("/v1/score", json=request)
    assert answer.status_code == 422
    found = [e for e in answer.json()["detail"] if e["loc"] == loc]
    assert found and words in found[0]["msg"], answer.json()


def test_more_audit_components_than_the_bound_are_refused_before_any_check() -> None:
    """At most MAX_AUDIT_COMPONENTS (8): each multiplies a batch's checks, so the bound is
    checked with the body, before anything runs."""
    from rewardd.service.models import MAX_AUDIT_COMPONENTS
    from tests.support.executors import RefusingExecutor

    request = body(audit_specs=[]).model_dump(mode="json")
    request["audit"] = [{**STRICT, "name": f"a{i}", "rate": 0.5}
                        for i in range(MAX_AUDIT_COMPONENTS + 1)]
    executor = RefusingExecutor()
    with TestClient(create_app(Settings(), executor=executor)) as client:
        answer = client.post("/v1/score", json=request)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "audit"]
    assert "at most 8" in answer.json()["detail"][0]["msg"]
    assert executor.run_calls == 0


def test_duplicate_audit_names_are_refused() -> None:
    request = body(audit_specs=[]).model_dump(mode="json")
    request["audit"] = [{**STRICT, "rate": 0.5}, {**STRICT, "rate": 0.2}]
    with TestClient(create_app(Settings())) as client:
        answer = client.post("/v1/score", json=request)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "audit", 1, "name"]
    assert "duplicate audit name 'strict'" in answer.json()["detail"][0]["msg"]


# ---- sessions ------------------------------------------------------------------------------

async def test_a_sessions_audit_runs_at_its_close_and_is_recorded(tmp_path: Any) -> None:
    """A session with `audit`: its close answers as /v1/score answers the same batch with
    the same audit (rewards, advantages, the audit and the canaries alike), and the record
    keeps it."""
    import httpx

    from tests.support.executors import InlineExecutor as Inline

    request = body(groups=2)
    spec = {"rewards": [{"name": "correct", "verifier": "math"}], "group_size": 4,
            "run_id": "exp", "step": 3, "audit": [{**STRICT, "rate": 1.0}],
            "advantage": {"estimator": "grpo"}}
    app = create_app(Settings(data_dir=str(tmp_path)), executor=Inline())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                 base_url="http://rewardd") as http:
        opened = await http.post("/v1/sessions", json=spec)
        assert opened.status_code == 201, opened.text
        sid = opened.json()["session_id"]
        sent = request.model_dump(mode="json", exclude_none=True)
        added = await http.post(f"/v1/sessions/{sid}/rollouts",
                                json={"groups": sent["groups"]})
        assert added.status_code == 200, added.text
        closed = (await http.post(f"/v1/sessions/{sid}/close")).json()
        scored = (await http.post("/v1/score", json={**sent, "run_id": "other"})).json()
        result = closed["result"]
        assert result["summary"]["audit"] == scored["summary"]["audit"]
        assert result["summary"]["canaries"] == scored["summary"]["canaries"]
        assert result["summary"]["canaries"]["correct"]["passed"] == 2  # accept and reject
        assert [[r.get("audit") for r in g["rollouts"]] for g in result["groups"]] == [
            [r.get("audit") for r in g["rollouts"]] for g in scored["groups"]]
        assert [[r["reward"] for r in g["rollouts"]] for g in result["groups"]] == [
            [r["reward"] for r in g["rollouts"]] for g in scored["groups"]]
        assert app.state.services.records.writer().flush(60)
        page = (await http.get("/v1/runs/exp/rollouts")).json()["rollouts"]
        assert [r["summary"]["audit"]["strict"]["reward"] for r in page] == [
            1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
