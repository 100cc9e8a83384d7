"""Issue 30, item 1: canaries. Each listed misconfiguration is flagged in the first batch with
a message that says what is wrong; a healthy verifier raises nothing; canaries never change
rewards or advantages; the rate, the request's opt-out, the metrics and the run record.

Real verifiers throughout, run by the worker's own task function in this process
(:class:`InlineExecutor`), a real bubblewrap sandbox for code and the rule-based judge server
for the judge. Two conditions are made, not found: a g++ hidden from the sandbox (bound over
with /dev/null in its bubblewrap command line) and, for the isolation requirement, a machine
that offers namespaces only (this one runs as root, so its detected level is replaced)."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any, Iterator

import orjson
import pytest

from rewardd.service import canaries, metrics, pipeline
from rewardd.service.models import ScoreRequest, ScoreResponse
from rewardd.service.records.recorder import batch_rows
from rewardd.service.records.store import ROW_COLUMNS
from rewardd.service.settings import Settings
from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import Outcome, Sample
from rewardd.verifiers.code import runtimes
from rewardd.verifiers.code import sandbox as sandbox_module
from rewardd.verifiers.code.settings import sandbox_settings
from rewardd.verifiers.math.verifier import MathVerifier
from tests.support.executors import CountingInlineExecutor, InlineExecutor
from tests.support.judge_server import JudgeServer

ADD = {"tests": {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}}
ADD_SOLUTION = "a, b = map(int, input().split())\nprint(a + b)"
CPP_SOLUTION = ("#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
                "std::cout << a + b << std::endl; }")


def body(reference: dict[str, Any], completions: list[str], verifier: str = "math",
         params: dict[str, Any] | None = None, groups: int = 1, **extra: Any) -> ScoreRequest:
    return ScoreRequest.model_validate({
        "groups": [{"group_id": f"q{g}", "prompt": "Solve it.", "reference": reference,
                    "source": "gsm8k",
                    "rollouts": [{"rollout_id": f"q{g}-{i}", "completion": c, "num_tokens": 4}
                                 for i, c in enumerate(completions)]}
                   for g in range(groups)],
        "rewards": [{"name": "correct", "verifier": verifier, "params": params or {}}],
        **extra})


def score(req: ScoreRequest, settings: Settings | None = None) -> dict[str, Any]:
    out = asyncio.run(pipeline.score(req, InlineExecutor(), settings or Settings()))
    ScoreResponse.model_validate(out)
    return out


def problems(out: dict[str, Any], component: str = "correct") -> list[str]:
    return out["summary"]["canaries"][component]["problems"]


# ---- the misconfigurations, each flagged in the first batch --------------------------------

def test_the_answer_under_another_reference_key_is_named() -> None:
    out = score(body({"ground_truth": "42"}, ["\\boxed{42}", "\\boxed{41}"]))
    [problem] = problems(out)
    assert "it reads `answer` and this reference has `ground_truth`" in problem
    assert "the answer is probably under another key (`ground_truth` holds '42')" in problem


def test_answers_inside_think_only_are_named() -> None:
    """exact_match compares the whole completion: an answer the chat template left inside
    <think> never matches. The plain probe passes, the think-shaped one does not."""
    out = score(body({"answer": "42"}, ["<think>\n42\n</think>", "<think>\n41\n</think>",
                                        "<think>\nstill 42"], verifier="exact_match"))
    [problem] = problems(out)
    assert "the answers are inside <think> only" in problem
    assert "compared='<think> 42 </think>'" in problem
    report = out["summary"]["canaries"]["correct"]
    assert (report["passed"], report["failed"]) == (2, 1)


def test_a_verifier_that_gives_zero_to_everything_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class ZeroMath(MathVerifier):
        """A plugin whose verdicts all come out 0 (it inherits math's probes)."""
        name = "zero_math"

        def verify(self, sample: Sample, reference: Any, params: Any) -> Outcome:
            found = super().verify(sample, reference, params)
            return Outcome.success(0.0, **found.detail)

    monkeypatch.setitem(REGISTRY, "zero_math", ZeroMath())
    out = score(body({"answer": "42"}, ["\\boxed{42}"], verifier="zero_math"))
    [problem] = problems(out)
    assert "gave 0 to every canary" in problem and "it gives 0 to everything" in problem
    assert "decided_by='exact'" in problem or "extracted='42'" in problem


def test_code_tests_with_wrong_expected_outputs_are_named() -> None:
    wrong = {"tests": {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "8\n"]},
             "solution": ADD_SOLUTION}
    out = score(body(wrong, ["```python\nprint(3)\n```"], verifier="code"))
    [problem] = problems(out)
    assert "the reference's own solution fails 1 of 2 tests" in problem
    assert "the expected outputs are probably wrong" in problem
    assert "got '7\\n', expected '8\\n'" in problem  # the test it could not pass


@pytest.fixture
def fresh_sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's sandbox started anew for one test (and closed after it)."""
    monkeypatch.setattr(sandbox_module, "_instance", None)
    yield
    made = sandbox_module._instance
    if made is not None:
        made.close()


def test_a_sandbox_without_the_runtime_is_named(monkeypatch: pytest.MonkeyPatch,
                                                 fresh_sandbox: None) -> None:
    real = sandbox_module.bwrap_command
    gpp = os.path.realpath(shutil.which("g++") or "/usr/bin/g++")

    def without_gpp(level: str, **kwargs: Any) -> list[str]:
        argv = real(level, **kwargs)
        at = argv.index("/usr") + 2  # after --ro-bind /usr /usr
        return argv[:at] + ["--ro-bind", "/dev/null", gpp] + argv[at:]

    monkeypatch.setattr(sandbox_module, "bwrap_command", without_gpp)
    reference = {**ADD, "language": "cpp", "solution": CPP_SOLUTION}
    out = score(body(reference, ["```cpp\nint main() {}\n```"], verifier="code"))
    [problem] = problems(out)
    assert "the sandbox cannot run cpp programs (g++ is not installed in the sandbox)" in problem


def test_isolation_below_the_required_level_is_named(monkeypatch: pytest.MonkeyPatch,
                                                     fresh_sandbox: None) -> None:
    detected, found = runtimes._detected()
    monkeypatch.setattr(runtimes, "_cached", (
        type(detected)(level="namespaces", network=True, per_run_uid=False,
                       filesystem="private", detail="simulated: not root",
                       memory_detail=detected.memory_detail), found))
    monkeypatch.setenv("REWARDD_SANDBOX_REQUIRE_ISOLATION", "full")
    sandbox_settings.cache_clear()
    try:
        out = score(body({**ADD, "solution": ADD_SOLUTION}, ["```python\nprint(3)\n```"],
                         verifier="code"))
    finally:
        monkeypatch.delenv("REWARDD_SANDBOX_REQUIRE_ISOLATION")
        sandbox_settings.cache_clear()
    [problem] = problems(out)
    assert "the verifier cannot run at all (unavailable)" in problem
    assert "the operator requires isolation 'full'" in problem
    assert "this machine offers 'namespaces'" in problem


def test_a_judge_whose_replies_do_not_parse_is_named(judge: JudgeServer) -> None:
    params = {"rubric": [{"criterion": "Mentions 'aspirin'", "points": 5}], "retries": 0,
              "verdict_pattern": r"VERDICT: (?P<met>yes|no)"}
    out = score(body({"answer": "aspirin"}, ["Aspirin."], verifier="rubric", params=params))
    [problem] = problems(out)
    assert "the judge's reply to a canary could not be read as a verdict" in problem
    assert "criteria_met" in problem  # the reply it could not read, quoted


# ---- healthy verifiers raise nothing -------------------------------------------------------

@pytest.mark.parametrize("verifier,reference", [
    ("math", {"answer": "\\frac{1}{2}"}), ("math", {"answer": "(C)"}),
    ("math", {"answer": "She sold 48 + 24 = 72 clips.\n#### 72"}), ("exact_match", {"answer": "Paris"}),
    ("code", {**ADD, "solution": ADD_SOLUTION}), ("code", ADD)])
def test_a_healthy_verifier_passes_every_canary(verifier: str, reference: dict) -> None:
    out = score(body(reference, ["<think>\nhmm\n</think>\nno idea", "x"], verifier=verifier))
    report = out["summary"]["canaries"]["correct"]
    assert report["problems"] == [] and report["failed"] == 0 and report["passed"] >= 1
    assert report["sources"] == {"gsm8k": {"passed": report["passed"], "failed": 0}}


def test_a_healthy_judge_passes(judge: JudgeServer) -> None:
    params = {"rubric": [{"criterion": "Mentions 'aspirin'", "points": 5}]}
    out = score(body({}, ["Aspirin."], verifier="rubric", params=params))
    assert out["summary"]["canaries"]["correct"] == {
        "verifier": "rubric", "passed": 1, "failed": 0, "problems": [],
        "sources": {"gsm8k": {"passed": 1, "failed": 0}}}


def test_verifiers_without_a_probe_maker_are_not_canaried() -> None:
    req = body({"answer": "42"}, ["\\boxed{42}"])
    req.rewards.append(req.rewards[0].model_copy(update={
        "name": "format", "verifier": "regex", "params": {"pattern": "boxed"}}))
    out = score(req)
    assert set(out["summary"]["canaries"]) == {"correct"}


# ---- never part of rewards or advantages ---------------------------------------------------

def test_canaries_never_change_rewards_or_advantages() -> None:
    """The same broken batch with canaries on and off: the same bytes but summary.canaries."""
    reference = {"ground_truth": "42"}
    completions = ["\\boxed{42}", "\\boxed{41}", "7"]
    on = score(body({"answer": "42"}, completions, groups=4))
    off = score(body({"answer": "42"}, completions, groups=4, canaries=False))
    assert "canaries" in on["summary"] and "canaries" not in off["summary"]
    del on["summary"]["canaries"]
    assert on == off
    broken_on = score(body(reference, completions, groups=4, canaries={"rate": 1.0}))
    broken_off = score(body(reference, completions, groups=4, canaries={"enabled": False}))
    assert len(problems(broken_on)) == 4
    del broken_on["summary"]["canaries"]
    assert broken_on == broken_off


# ---- rate and opt-out ----------------------------------------------------------------------

def test_chosen_groups_at_a_rate_spread_from_the_first() -> None:
    assert canaries.chosen(100, 0.02) == [0, 50]
    assert canaries.chosen(8, 0.02) == [0]          # at least one group
    assert canaries.chosen(4, 1.0) == [0, 1, 2, 3]
    assert canaries.chosen(10, 0.0) == [] and canaries.chosen(0, 0.5) == []


def test_the_rate_comes_from_the_request_else_the_server() -> None:
    completions = ["\\boxed{42}"]
    per_group = 2  # math: the accept and the reject probe
    out = score(body({"answer": "42"}, completions, groups=10),
                Settings(canary_rate=0.2))
    assert out["summary"]["canaries"]["correct"]["passed"] == 2 * per_group
    out = score(body({"answer": "42"}, completions, groups=10, canaries={"rate": 0.5}),
                Settings(canary_rate=0.2))
    assert out["summary"]["canaries"]["correct"]["passed"] == 5 * per_group
    off = score(body({"answer": "42"}, completions, groups=10), Settings(canary_rate=0.0))
    assert "canaries" not in off["summary"]


def test_a_request_may_turn_canaries_off() -> None:
    out = score(body({"ground_truth": "42"}, ["\\boxed{42}"], canaries=False))
    assert "canaries" not in out["summary"]
    with pytest.raises(Exception, match="less than or equal to 1"):
        body({"answer": "1"}, ["1"], canaries={"rate": 2})


# ---- metrics and the record ----------------------------------------------------------------

def counted(verifier: str, kind: str, result: str) -> float:
    value = metrics.CANARIES.labels(verifier, "gsm8k", kind, result)._value.get()
    return float(value)


def test_canaries_are_counted_by_verifier_source_kind_and_result() -> None:
    before = {(k, r): counted("math", k, r) for k in ("accept", "reject")
              for r in ("passed", "failed")}
    score(body({"answer": "42"}, ["\\boxed{42}"], groups=2, canaries={"rate": 1.0}))
    score(body({"ground_truth": "42"}, ["\\boxed{42}"]))
    after = {key: counted("math", *key) - value for key, value in before.items()}
    assert after == {("accept", "passed"): 2, ("reject", "passed"): 2,
                     ("accept", "failed"): 1, ("reject", "failed"): 1}


def test_the_run_record_keeps_the_batch_report_on_its_first_rollout() -> None:
    req = body({"ground_truth": "42"}, ["\\boxed{42}", "1"], groups=2, run_id="exp-1")
    out = score(req)
    rows = batch_rows("t", "exp-1", 3, req.groups, out, Settings(), 0.0)
    at = ROW_COLUMNS.index("summary")
    summaries = [orjson.loads(row.values[at]) for row in rows]
    assert summaries[0]["canaries"] == out["summary"]["canaries"]
    assert all("canaries" not in summary for summary in summaries[1:])


def test_canaries_ride_in_the_batch_executor_run_and_not_in_its_progress() -> None:
    """One executor run per batch (one fair-queue flow, one round trip), and a job's
    progress counts the batch's checks only."""
    executor, done = CountingInlineExecutor(), []
    req = body({"answer": "42"}, ["\\boxed{42}", "1", "2"], groups=2, canaries={"rate": 1.0})
    out = asyncio.run(pipeline.score(req, executor, Settings(), progress=done.append))
    assert executor.runs == [2 + 2]  # the batch's 2 calls and 2 canaries, together
    assert sum(done) == 6  # 2 groups x 3 rollouts
    assert out["summary"]["canaries"]["correct"]["passed"] == 4
