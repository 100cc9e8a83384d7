"""continuation (RLTR) against a real local OpenAI-compatible chat server that continues
reasoning by rule: success rates over k seeded samples, the prefix handed over, both request
modes, the math verifier's judgement, typed failures, the gpu queue."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import FailureKind, Sample, run_group_verifier
from rewardd.verifiers.judge.continuation import ContinuationParams, reasoning_prefix
from rewardd.workers.routing import Router
from tests.support.generating_judge import GeneratingJudgeServer, generating, judge  # noqa: F401

PROBLEM = "What is 3 * 4 + 5?"


def run(completions: list[str], answer: Any = "17", **params: Any) -> list[Any]:
    samples = [Sample(c, prompt=PROBLEM) for c in completions]
    return run_group_verifier(REGISTRY["continuation"], samples, {"answer": answer},
                              {"prefix_fraction": 1.0, **params})


def think(reasoning: str, answer: str = "17") -> str:
    return f"<think>{reasoning}</think>\nThe answer is \\boxed{{{answer}}}."


def test_reward_is_the_success_rate_of_k_continuations(judge: GeneratingJudgeServer) -> None:
    out = run([think("3 * 4 = 12, plus 5, so far: 17"),       # every continuation reaches 17
               think("3 * 4 = 12, plus 5, so far: 17 SHAKY"),  # odd seeds say 18
               think("3 * 4 = 12, so far: 12"),                # every continuation says 12
               think("NO-ANSWER")], k=4)
    assert [o.reward for o in out] == [1.0, 0.5, 0.0, 0.0]
    assert [o.detail["successes"] for o in out] == [4, 2, 0, 0]
    assert [s["correct"] for s in out[1].detail["samples"]] == [True, False, True, False]
    assert [s["seed"] for s in out[1].detail["samples"]] == [0, 1, 2, 3]
    assert len(judge.requests) == 16  # 4 rollouts x k, one batch
    assert sorted(r["seed"] for r in judge.requests) == sorted([0, 1, 2, 3] * 4)
    assert out[0].detail["judge"]["calls"] == 4


def test_seeds_start_at_the_seed_param(judge: GeneratingJudgeServer) -> None:
    out = run([think("so far: 17 SHAKY")], k=3, seed=1)  # seeds 1, 2, 3: odd, even, odd
    assert out[0].reward == pytest.approx(1 / 3)


def test_continue_mode_sends_an_unfinished_assistant_turn(judge: GeneratingJudgeServer) -> None:
    run([think("so far: 17")], k=1, temperature=0.0, extra_body={"top_k": 20})
    [body] = judge.requests
    assert body["messages"] == [{"role": "user", "content": PROBLEM},
                                {"role": "assistant", "content": "<think>so far: 17"}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["top_k"] == 20 and body["temperature"] == 0.0


def test_instruct_mode_asks_in_one_user_message(judge: GeneratingJudgeServer) -> None:
    out = run([think("so far: 17")], k=2, mode="instruct")
    assert out[0].reward == 1.0
    body = judge.requests[0]
    [message] = body["messages"]
    assert message["role"] == "user" and PROBLEM in message["content"]
    assert "<think>so far: 17" in message["content"]
    assert "continue_final_message" not in body


def test_the_rollouts_own_answer_is_never_handed_over() -> None:
    assert reasoning_prefix("<think>a b c d</think> \\boxed{9}", 1.0) == "<think>a b c d"
    assert reasoning_prefix("12 plus 5 gives \\boxed{17} so done", 1.0) == "12 plus 5 gives "
    assert reasoning_prefix("alpha beta gamma delta", 0.5) == "alpha beta "  # no split word
    assert reasoning_prefix("alpha beta gamma delta", 0.3) == "alpha "


def test_only_the_continuation_is_checked(judge: GeneratingJudgeServer) -> None:
    # the prefix is cut before its box, and the continuation's own answer (12) is what counts
    out = run(["so far: 12 therefore \\boxed{17}"], k=1, temperature=0.0)
    assert out[0].reward == 0.0 and out[0].detail["samples"][0]["extracted"] == "12"


def test_the_math_verifier_decides_equivalence(judge: GeneratingJudgeServer) -> None:
    assert run([think("so far: 17")], answer="\\frac{34}{2}", k=1,
               temperature=0.0)[0].reward == 1.0


def test_a_failed_sample_fails_the_cell_with_counts(judge: GeneratingJudgeServer) -> None:
    out = run([think("so far: 17 FAIL-503"), think("so far: 17")], k=2)
    assert out[0].error is FailureKind.judge_unavailable and out[0].reward is None
    assert "2 of 2 continuations" in out[0].detail["message"]
    assert out[1].ok and out[1].reward == 1.0


def test_a_refused_continuation_is_judge_refused(judge: GeneratingJudgeServer) -> None:
    judge.faults.append(("refusal_field",))
    out = run([think("so far: 17")], k=1, temperature=0.0)
    assert out[0].error is FailureKind.judge_refused
    assert out[0].detail["successes"] == 0 and out[0].detail["samples"][0]["error"] == \
        "judge_refused"


def test_a_bad_reference_fails_before_any_call(judge: GeneratingJudgeServer) -> None:
    out = run([think("so far: 17")], answer="", k=2)
    assert out[0].error is FailureKind.invalid_reference and judge.requests == []
    errors = REGISTRY["continuation"].reference_errors
    assert errors({"answer": ""}) == errors({}) == errors({"answer": True}) == [
        (("answer",), "the math verifier needs a non-empty string or number")]
    assert errors({"answer": "17"}) == errors({"answer": 17}) == []
    # an answer that does not parse: the worker's math verifier says so, before any call
    assert errors({"answer": "\\frac{1}{"}) == []
    out = run([think("so far: 17")], answer="\\frac{1}{", k=2)
    assert out[0].error is FailureKind.invalid_reference and judge.requests == []


def test_no_backend_is_judge_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    from rewardd.verifiers.judge.config import reset_backends

    monkeypatch.delenv("REWARDD_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("REWARDD_JUDGE_BACKENDS_FILE", raising=False)
    reset_backends()
    [out] = run([think("so far: 17")])
    assert out.error is FailureKind.judge_unavailable


@pytest.mark.parametrize("params,loc", [({"k": 4, "temperature": 0.0}, ()),
                                        ({"k": 0}, ("k",)),
                                        ({"prefix_fraction": 0}, ("prefix_fraction",)),
                                        ({"math": {"mode": "loose"}}, ("math", "mode")),
                                        ({"mode": "chat"}, ("mode",))])
def test_bad_params(params: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        ContinuationParams.model_validate(params)
    assert info.value.errors()[0]["loc"] == loc


def test_judge_verifiers_route_to_gpu_and_text_ones_to_cpu() -> None:
    router = Router()
    assert [router.queue_for(n) for n in ("continuation", "refusal_judge")] == ["gpu", "gpu"]
    assert [router.queue_for(n) for n in ("tool_call", "json_schema", "critique",
                                          "refusal")] == ["cpu"] * 4
