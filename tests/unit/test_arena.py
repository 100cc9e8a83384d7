"""The arena verifier against a real local OpenAI-compatible judge: tournaments over a group,
rank rewards, swapped orders against position bias, typed failures, agreement sampling."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.judge_server import JudgeServer
from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import GroupContext, Sample, run_group_verifier
from rewardd.verifiers.judge import openai_compat
from rewardd.verifiers.judge.arena import ArenaParams
from rewardd.verifiers.judge.ratings import spearman


@pytest.fixture(autouse=True)
def _clean(judge: JudgeServer) -> None:
    """Every test starts from a reset judge server, reply cache and backend set."""


def arena(qualities: list[float] | list[str], params: dict[str, Any] | None = None,
          reference: dict[str, Any] | None = None,
          context: GroupContext | None = None) -> list[Any]:
    texts = [q if isinstance(q, str) else f"My answer. quality={q}" for q in qualities]
    return run_group_verifier(REGISTRY["arena"], [Sample(t, prompt="Explain tides.")
                                                  for t in texts],
                              reference or {}, params or {}, context or GroupContext("r", "g"))


def test_round_robin_ranks_a_group_by_the_judges_verdicts(judge: JudgeServer) -> None:
    out = arena([3, 9, 1, 6], {"scheme": "round_robin"})
    assert [o.reward for o in out] == [1 / 3, 1.0, 0.0, 2 / 3]
    assert len(judge.requests) == 6 == out[0].detail["judge_calls"]
    assert out[1].detail["wins"] == 3 and out[2].detail["losses"] == 3
    assert out[0].detail["judge"]["shared_by"] == 4
    assert out[0].detail["judge"]["calls"] == 6


def test_ties_share_their_rank() -> None:
    out = arena([5, 5, 1], {"scheme": "round_robin"})
    assert [o.reward for o in out] == [0.75, 0.75, 0.0]


def test_the_default_scheme_orders_a_larger_group_with_fewer_calls(judge: JudgeServer) -> None:
    qualities = [7, 2, 15, 11, 4, 9, 0, 13, 6, 1, 14, 3, 10, 8, 12, 5]
    out = arena(qualities)
    assert all(o.ok for o in out)
    assert spearman([o.reward for o in out], qualities) >= 0.9
    assert len(judge.requests) <= 16 * 15 // 2  # fewer than a one-order round-robin


def test_swapping_orders_cancels_position_bias(judge: JudgeServer) -> None:
    """The judge adds 1.5 quality points to whichever answer it sees first. In one order that
    can flip close pairs; asked both ways, a close pair disagrees with itself and counts as a tie
    (never as a wrong win), and clear pairs keep their winner."""
    rr = {"scheme": "round_robin"}
    judge.position_bias = 1.5
    try:
        one_order = arena([4, 5, 6], {**rr, "swap": False})
        close = arena([4, 5, 6], {**rr, "swap": True})
        clear = arena([0, 4, 8], {**rr, "swap": True})
    finally:
        judge.position_bias = 0.0
    assert one_order[0].detail["judge_calls"] == 3 and one_order[0].detail["inconsistent"] == 0
    assert close[0].detail["judge_calls"] == 6 and close[0].detail["inconsistent"] == 2
    assert [o.reward for o in close] == [0.0, 0.5, 1.0]  # 4 vs 6 stays decided
    assert [o.reward for o in clear] == [0.0, 0.5, 1.0] and clear[0].detail["inconsistent"] == 0


def test_anchor_scheme_compares_each_rollout_with_the_reference(judge: JudgeServer) -> None:
    out = arena([2, 8, 5], {"scheme": "anchor"},
                reference={"anchor": "Reference. quality=5"})
    assert [o.reward for o in out] == [0.0, 1.0, 0.5]
    assert len(judge.requests) == 3
    users = [r["messages"][-1]["content"] for r in judge.requests]
    assert all("Reference. quality=5" in u for u in users)


def test_anchor_scheme_without_an_anchor_is_invalid_reference() -> None:
    out = arena([1, 2], {"scheme": "anchor"})
    assert [o.error.value for o in out] == ["invalid_reference"] * 2


def test_a_rollout_the_judge_cannot_compare_gets_a_typed_failure(judge: JudgeServer) -> None:
    out = arena(["quality=3", "GARBAGE-ME", "quality=1"],
                {"scheme": "round_robin", "retries": 1})
    assert out[1].error.value == "judge_unparseable" and out[1].reward is None
    assert [out[0].reward, out[2].reward] == [1.0, 0.0]  # ranked among the decided
    assert out[0].detail["failed_calls"] == 2


def test_a_judge_that_is_down_fails_every_rollout(judge: JudgeServer) -> None:
    judge.faults.extend([("status", 400)] * 10)
    out = arena([1, 2, 3], {"scheme": "round_robin"})
    assert [o.error.value for o in out] == ["judge_unavailable"] * 3


def test_agreement_with_a_full_round_robin_is_reported_when_sampled() -> None:
    out = arena([5, 1, 9, 3], {"scheme": "round_robin", "agreement_sample": 1.0})
    assert out[0].detail["agreement_with_round_robin"] == 1.0
    one_round = arena([5, 1, 9, 3], {"agreement_sample": 1.0, "options": {"rounds": 1}})
    assert -1.0 <= one_round[0].detail["agreement_with_round_robin"] < 1.0
    assert one_round[0].detail["judge_calls"] == 2
    assert "agreement_with_round_robin" not in arena([5, 1], {"agreement_sample": 0.0})[0].detail
    default = arena([5, 1, 9, 3], {})  # swiss on a budget of 4 * 3 / 4 calls
    assert default[0].detail["judge_calls"] == 3


def test_each_group_and_step_draws_its_own_bracket(judge: JudgeServer) -> None:
    params = {"scheme": "single_elimination"}
    pairs = []
    for group in ("g1", "g2"):
        judge.reset()
        arena([1, 2, 3, 4, 5, 6, 7, 8], params, context=GroupContext("r", group, 1))
        pairs.append(sorted(r["messages"][-1]["content"] for r in judge.requests))
    assert pairs[0] != pairs[1]
    judge.reset()
    openai_compat.CACHE.clear()  # ask again rather than read the cached answers
    arena([1, 2, 3, 4, 5, 6, 7, 8], params, context=GroupContext("r", "g1", 1))
    assert sorted(r["messages"][-1]["content"] for r in judge.requests) == pairs[0]


def test_a_single_rollout_group_says_why_it_cannot_be_ranked() -> None:
    [out] = arena([3])
    assert out.error.value == "invalid_reference" and "at least two" in out.detail["message"]


def test_unknown_schemes_and_options_are_refused() -> None:
    with pytest.raises(Exception, match="unknown scheme"):
        REGISTRY["arena"].Params.model_validate({"scheme": "knockout"})
    with pytest.raises(Exception, match="has no option"):
        REGISTRY["arena"].Params.model_validate({"scheme": "round_robin",
                                                 "options": {"rounds": 3}})


def test_rollouts_the_judge_cannot_tell_apart_share_their_rank() -> None:
    out = arena([3, 1, 1, 3, 0, 1], {"scheme": "round_robin"})
    rewards = [o.reward for o in out]
    assert rewards[0] == rewards[3] == 0.9
    assert rewards[1] == rewards[2] == rewards[5] == 0.4  # mean rank 2 of 0..5
    assert rewards[4] == 0.0


def test_a_group_of_one_is_rewarded_by_its_result_against_the_anchor() -> None:
    anchor = {"anchor": "Reference. quality=5"}
    [better] = arena([7], {"scheme": "anchor"}, reference=anchor)
    [worse] = arena([3], {"scheme": "anchor"}, reference=anchor)
    assert better.ok and better.reward == 1.0 and better.detail["judge_calls"] == 1
    assert worse.ok and worse.reward == 0.0


def test_three_rollouts_are_all_judged_by_default() -> None:
    out = arena([2, 9, 5])
    assert all(o.ok for o in out) and out[0].detail["judge_calls"] == 2
    assert all(o.detail["wins"] + o.detail["losses"] + o.detail["ties"] >= 1 for o in out)
    assert out[1].reward == 1.0


def test_a_groups_shared_judge_usage_is_counted_once_and_whole() -> None:
    from prometheus_client import REGISTRY

    from rewardd.service.metrics import observe_judge_usage

    labels = {"verifier": "arena-metrics-test", "backend": "b", "model": "m"}

    def counted() -> tuple[float, float]:
        return (REGISTRY.get_sample_value("rewardd_judge_calls_total",
                                          {**labels, "result": "answered"}) or 0.0,
                REGISTRY.get_sample_value("rewardd_judge_tokens_total",
                                          {**labels, "kind": "prompt"}) or 0.0)

    before = counted()
    usage = {"backend": "b", "model": "m", "calls": 60, "prompt_tokens": 7001, "shared_by": 7}
    for index in range(7):
        observe_judge_usage("arena-metrics-test", {**usage, "share_index": index})
    after = counted()
    assert (after[0] - before[0], after[1] - before[1]) == (60.0, 7001.0)  # exactly
    out = arena([5, 1, 9])
    assert [o.detail["judge"]["share_index"] for o in out] == [0, 1, 2]


def test_a_custom_template_must_show_both_responses() -> None:
    with pytest.raises(ValueError, match="must name {response_b}"):
        ArenaParams.model_validate({"template": "Is {response_a} good? [[A>B]]"})
    with pytest.raises(ValueError, match="names {response}"):
        ArenaParams.model_validate({"template": "{response} vs {response_a} {response_b}"})


def test_a_custom_template_and_verdict_pattern() -> None:
    template = ("Which of {response_a} and {response_b} answers {prompt} better? "
                "End with [[A>B]], [[A=B]] or [[B>A]].")
    out = arena([2, 7, 4], {"scheme": "round_robin", "template": template,
                            "verdict_pattern": r"\[\[(?P<verdict>[AB][<>=]+[AB])\]\]"})
    assert [o.reward for o in out] == [0.0, 1.0, 0.5]
    with pytest.raises(Exception, match="named group"):
        REGISTRY["arena"].Params.model_validate({"verdict_pattern": r"\[\[(.*)\]\]"})
