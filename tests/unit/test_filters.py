"""Filters and sampling advice (dynamic_sampling, pairwise_sampling, variance_priority, budget,
ucb_curriculum) and the batch diagnostics of the summary.

Filters return advice beside the advantages and never change them. Golden values are worked
out by hand in each test; the pipeline path (``rewardd.service.pipeline.advantages``) is the one the
API uses, and every response is validated against ScoreResponse.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rewardd.advantages import Advantages, AdvantageBatch, get_entry, pins_for
from rewardd.advantages.inputs import build_batch
from rewardd.service.models import AdvantagesRequest
from rewardd.service.pipeline import advantages as pipeline_advantages
from rewardd.service.runstate import MemoryRunStore, RunStore
from rewardd.advantages.table import FlatBatch, combine, precomputed_columns
from rewardd.advantages.errors import RequestInvalid
from tests.unit.test_estimators import (ESTIMATORS, PROFILES, PROPERTY, assert_valid_response,
                                        run, scalar_groups)

TIGHT = 1e-12
EPS = 1e-6  # the rewardd profile's GRPO epsilon


# ----------------------------------------------------------------------------- helpers


def groups_of(rewards: list[list[float | None]], sources: list[str] | None = None
              ) -> list[dict[str, Any]]:
    """Groups g0, g1, ... with rollouts g<i>r<j>; a None reward is a rollout without one,
    which is excluded from its group's baseline."""
    out = []
    for gi, group in enumerate(rewards):
        rollouts = [{"rollout_id": f"g{gi}r{ri}", **({"reward": r} if r is not None else {})}
                    for ri, r in enumerate(group)]
        out.append({"group_id": f"g{gi}", "rollouts": rollouts,
                    **({"data_source": sources[gi]} if sources else {})})
    return out


def advise(groups: list[dict[str, Any]], filters: list[dict[str, Any]],
           runs: RunStore | None = None, run_id: str | None = None,
           **advantage: Any) -> dict[str, Any]:
    body = {"groups": groups, "run_id": run_id,
            "advantage": {"output": "scalar", "filters": filters, **advantage}}
    resp = pipeline_advantages(AdvantagesRequest.model_validate(body), runs)
    assert_valid_response(resp)
    return resp


def advice(rewards: list[list[float | None]], name: str, **params: Any) -> dict[str, Any]:
    return advise(groups_of(rewards), [{"name": name, "params": params}])["advice"][name]


def invalid(groups: list[dict[str, Any]], filters: list[dict[str, Any]],
            run_id: str | None = None) -> list[dict[str, Any]]:
    with pytest.raises(RequestInvalid) as info:
        advise(groups, filters, MemoryRunStore(), run_id)
    return info.value.errors


def batch_of(groups: list[dict[str, Any]], runs: RunStore | None = None,
             run_id: str | None = None) -> AdvantageBatch:
    """The flat batch the pipeline builds for these groups (for direct calls)."""
    req = AdvantagesRequest.model_validate({"groups": groups, "advantage": {}})
    flat = FlatBatch.of(req.groups)
    columns = precomputed_columns(flat.rollouts, {})
    scope = runs.scope(run_id) if runs is not None and run_id is not None else None
    return build_batch(flat, combine(columns, len(flat.rollouts)), columns, scope)


def call(name: str, batch: AdvantageBatch, result: Advantages, **params: Any) -> dict[str, Any]:
    entry = get_entry(name, "filter")
    return entry.fn(batch, result, entry.Params.model_validate(params), pins_for("rewardd"))


def grpo(xs: list[float]) -> list[float]:
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return [(x - m) / (s + EPS) for x in xs]


# ----------------------------------------------------------------------------- dynamic_sampling


def test_dynamic_sampling_marks_zero_spread_and_empty_groups_and_keeps_singletons():
    # g1 all correct, g3 all wrong: no spread. g4: its only rollout has no reward (excluded).
    resp = advise(groups_of([[1, 0, 1, 0], [1, 1, 1], [0.3], [0, 0], [None], [0.2, 0.7]]),
                  [{"name": "dynamic_sampling"}])
    assert resp["advice"]["dynamic_sampling"] == {
        "filtered": ["g1", "g3", "g4"], "kept": 3, "fraction_filtered": 0.5}
    assert [g["diagnostics"]["filtered"] for g in resp["groups"]] == [
        False, True, False, True, True, False]


def test_dynamic_sampling_filter_singletons_marks_one_rollout_groups_too():
    got = advice([[1, 0], [0.3], [1, None]], "dynamic_sampling", filter_singletons=True)
    assert got == {"filtered": ["g1", "g2"], "kept": 1, "fraction_filtered": 2 / 3}


def test_dynamic_sampling_decides_zero_spread_exactly_for_non_dyadic_rewards():
    # mean of three 0.1s is 0.10000000000000002: min == max still says no spread
    got = advice([[0.1, 0.1, 0.1], [0.1, 0.1, 0.1000000000000001]], "dynamic_sampling")
    assert got["filtered"] == ["g0"]


def test_dynamic_sampling_score_range_marks_groups_whose_mean_is_outside():
    # means: g0 0.5, g1 0.3 (below 0.4), g2 0.8 (above 0.7), g3 0.4 and g4 0.7 on the bounds
    rewards = [[1, 0, 1, 0], [0.2, 0.4], [0.9, 0.7], [0.3, 0.5], [0.6, 0.8]]
    got = advice(rewards, "dynamic_sampling", min_score=0.4, max_score=0.7)
    assert got == {"filtered": ["g1", "g2"], "kept": 3, "fraction_filtered": 0.4}
    assert advice(rewards, "dynamic_sampling", min_score=0.4)["filtered"] == ["g1"]
    assert advice(rewards, "dynamic_sampling", max_score=0.7)["filtered"] == ["g2"]


def test_dynamic_sampling_score_range_ignores_excluded_rollouts():
    # included mean of g0 is 1/2; the excluded rollout would have pulled it to 0.
    got = advice([[1, 0, None], [1, 0]], "dynamic_sampling", min_score=0.5)
    assert got["filtered"] == []


def test_dynamic_sampling_min_score_above_max_score_is_rejected():
    errors = invalid(groups_of([[1, 0]]), [{"name": "dynamic_sampling",
                                           "params": {"min_score": 0.8, "max_score": 0.2}}])
    assert errors[0]["loc"] == ["body", "advantage", "filters", 0, "params"]
    assert "above max_score" in errors[0]["msg"]


def test_dynamic_sampling_unknown_param_is_rejected_naming_it():
    errors = invalid(groups_of([[1, 0]]), [{"name": "dynamic_sampling",
                                           "params": {"min": 0.8}}])
    assert errors[0]["loc"] == ["body", "advantage", "filters", 0, "params", "min"]


def test_filter_name_of_another_kind_is_rejected():
    errors = invalid(groups_of([[1, 0]]), [{"name": "grpo"}])
    assert errors[0]["loc"] == ["body", "advantage", "filters", 0, "name"]
    assert "dynamic_sampling" in errors[0]["msg"]


# ----------------------------------------------------------------------------- pairwise_sampling


def test_pairwise_sampling_by_reward_pairs_jth_largest_with_jth_smallest():
    # sorted: r0 .1, r3 .3, r2 .5, r4 .7, r1 .9 -> (r1, r0), (r4, r3); r2 is left over
    rewards = [[0.1, 0.9, 0.5, 0.3, 0.7]]
    got = advice(rewards, "pairwise_sampling", k=2, by="reward")
    assert got == {"pairs": {"g0": [["g0r1", "g0r0", 0.9 - 0.1], ["g0r4", "g0r3", 0.7 - 0.3]]}}
    assert advice(rewards, "pairwise_sampling", k=5, by="reward") == got  # floor(5/2) pairs
    assert advice(rewards, "pairwise_sampling", by="reward") == {
        "pairs": {"g0": [["g0r1", "g0r0", 0.9 - 0.1]]}}


def test_pairwise_sampling_by_advantage_uses_the_grpo_advantages():
    # GRPO on [1, 0, 0, 0]: 0.75 / (0.5 + eps) against -0.25 / (0.5 + eps); ties keep request
    # order, so the first zero-reward rollout is the lowest.
    got = advice([[1, 0, 0, 0], [0, 1]], "pairwise_sampling")["pairs"]
    assert [p[:2] for p in got["g0"]] == [["g0r0", "g0r1"]]
    assert got["g0"][0][2] == pytest.approx(1.0 / (0.5 + EPS), abs=TIGHT, rel=0)
    hi, lo = grpo([0, 1])[1], grpo([0, 1])[0]
    assert [p[:2] for p in got["g1"]] == [["g1r1", "g1r0"]]
    assert got["g1"][0][2] == pytest.approx(hi - lo, abs=TIGHT, rel=0)


def test_pairwise_sampling_drops_zero_contrast_pairs_and_breaks_ties_in_request_order():
    # sorted: r2 (0), r0, r1, r3 (1 each): pair 0 = (r3, r2, 1); pair 1 = (r1, r0, 0) dropped
    got = advice([[1, 1, 0, 1], [0.5, 0.5]], "pairwise_sampling", k=2, by="reward")
    assert got == {"pairs": {"g0": [["g0r3", "g0r2", 1.0]], "g1": []}}


def test_pairwise_sampling_never_pairs_excluded_rollouts():
    got = advice([[0, None, 1, 0.5], [None, 1]], "pairwise_sampling", k=2, by="reward")
    assert got == {"pairs": {"g0": [["g0r2", "g0r0", 1.0]], "g1": []}}


def test_pairwise_sampling_of_token_level_advantages_uses_the_mean_over_mask_1_tokens():
    groups = [{"group_id": "g0", "rollouts": [
        {"rollout_id": "a", "reward": 1, "num_tokens": 3, "mask": [1, 1, 0]},
        {"rollout_id": "b", "reward": 0, "num_tokens": 2},
        {"rollout_id": "c", "reward": 0, "num_tokens": 2, "mask": [0, 0]}]}]
    batch = batch_of(groups)
    # a: mean(1, 3) = 2 (the masked 100 does not count); b: -1; c: no mask-1 token -> 0
    tokens = torch.tensor([1.0, 3.0, 100.0, -1.0, -1.0, -50.0, 50.0], dtype=torch.float64)
    got = call("pairwise_sampling", batch, Advantages(token=tokens), k=1)
    assert got == {"pairs": {"g0": [["a", "b", 3.0]]}}


def test_pairwise_sampling_k_below_one_is_rejected():
    errors = invalid(groups_of([[1, 0]]), [{"name": "pairwise_sampling", "params": {"k": 0}}])
    assert errors[0]["loc"] == ["body", "advantage", "filters", 0, "params", "k"]


# ----------------------------------------------------------------------------- variance_priority


def test_variance_priority_binary_scores_p_one_minus_p_and_orders_by_it():
    # p: g0 1/4, g1 1/2, g2 1, g3 2/3 (0.6 and 0.5 reach the threshold 0.5), g4 0
    got = advice([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1], [0.6, 0.4, 0.5], [0, 0, 0]],
                 "variance_priority")
    p = 2.0 / 3.0
    assert got == {"scores": {"g0": 0.1875, "g1": 0.25, "g2": 0.0, "g3": p * (1.0 - p),
                              "g4": 0.0},
                   "order": ["g1", "g3", "g0", "g2", "g4"]}


def test_variance_priority_threshold_decides_what_counts_as_correct():
    got = advice([[0.6, 0.4, 0.5]], "variance_priority", threshold=0.65)
    assert got["scores"] == {"g0": 0.0}
    p = 1.0 / 3.0
    assert advice([[0.6, 0.4, 0.5]], "variance_priority", threshold=0.55)["scores"] == {
        "g0": p * (1.0 - p)}


def test_variance_priority_variance_mode_is_population_variance_over_squared_range():
    # mean 0.5, deviations -0.3, -0.1, 0.4: variance 0.26 / 3
    rewards = [[0.2, 0.4, 0.9], [0.1, 0.1, 0.1], [0.5, None, 0.7]]
    got = advice(rewards, "variance_priority", mode="variance")
    assert got["scores"]["g0"] == pytest.approx(0.26 / 3, abs=TIGHT, rel=0)
    assert got["scores"]["g1"] == 0.0  # zero spread is exactly 0, not a rounding error
    assert got["scores"]["g2"] == pytest.approx(0.01, abs=TIGHT, rel=0)  # excluded left out
    assert got["order"] == ["g0", "g2", "g1"]
    wide = advice(rewards, "variance_priority", mode="variance", low=-1.0, high=1.0)
    assert wide["scores"]["g0"] == pytest.approx(0.26 / 3 / 4, abs=TIGHT, rel=0)


def test_variance_priority_modes_agree_on_binary_rewards():
    rewards = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0, 0], [1], [0, 0]]
    binary = advice(rewards, "variance_priority")
    variance = advice(rewards, "variance_priority", mode="variance")
    assert variance["order"] == binary["order"]
    for gid, score in binary["scores"].items():
        assert variance["scores"][gid] == pytest.approx(score, abs=TIGHT, rel=0)


def test_variance_priority_ties_keep_request_order_and_empty_groups_score_zero():
    got = advice([[0, 0], [1, 0], [None], [0, 1]], "variance_priority")
    assert got["order"] == ["g1", "g3", "g0", "g2"]
    assert got["scores"]["g2"] == 0.0


def test_variance_priority_high_not_above_low_is_rejected():
    errors = invalid(groups_of([[1, 0]]), [{"name": "variance_priority",
                                           "params": {"low": 1.0, "high": 1.0}}])
    assert errors[0]["loc"] == ["body", "advantage", "filters", 0, "params"]


# ----------------------------------------------------------------------------- budget


BUDGET_REWARDS = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0]]


def test_budget_allocates_proportionally_to_std_and_skips_solved_and_hopeless_prompts():
    # w0 = sqrt(3/16) = 0.4330, w1 = 0.5: quotas 20 w / (w0 + w1) = 9.282, 10.718
    # floors 9 + 10 = 19; the larger remainder (g1, 0.718) takes the last rollout.
    got = advice(BUDGET_REWARDS, "budget", total=20)
    assert got == {"allocation": {"g0": 9, "g1": 11, "g2": 0, "g3": 0},
                   "skipped": ["g2", "g3"], "unallocated": 0}
    # total 10: 4.641, 5.359 -> floors 4, 5 -> g0 has the larger remainder
    assert advice(BUDGET_REWARDS, "budget", total=10)["allocation"] == {
        "g0": 5, "g1": 5, "g2": 0, "g3": 0}


def test_budget_variance_weight_allocates_proportionally_to_p_one_minus_p():
    # w = 3/16 and 1/4: quotas 10 * 3/7 = 4.286, 10 * 4/7 = 5.714 -> 4, 6
    got = advice(BUDGET_REWARDS, "budget", total=10, weight="variance")
    assert got["allocation"] == {"g0": 4, "g1": 6, "g2": 0, "g3": 0}


def test_budget_caps_at_max_per_prompt_and_redistributes_the_excess():
    # w = 0.5, 0.433, 0.3 (p = 1/2, 1/4, 1/10); total 14, cap 5: g0 and g1 reach the cap,
    # g2 takes the remaining 4.
    rewards = [[1, 0], [1, 0, 0, 0], [1] + [0] * 9]
    got = advice(rewards, "budget", total=14, max_per_prompt=5)
    assert got == {"allocation": {"g0": 5, "g1": 5, "g2": 4}, "skipped": [],
                   "unallocated": 0}


def test_budget_reports_what_every_prompt_at_its_cap_cannot_use():
    got = advice(BUDGET_REWARDS, "budget", total=20, max_per_prompt=5)
    assert got == {"allocation": {"g0": 5, "g1": 5, "g2": 0, "g3": 0},
                   "skipped": ["g2", "g3"], "unallocated": 10}


def test_budget_min_per_prompt_lifts_low_weight_prompts_to_the_floor():
    # w = 0.5 and 0.3: total 8 splits 5 / 3; a floor of 4 makes it 4 / 4
    rewards = [[1, 0], [1] + [0] * 9]
    assert advice(rewards, "budget", total=8)["allocation"] == {"g0": 5, "g1": 3}
    assert advice(rewards, "budget", total=8, min_per_prompt=4)["allocation"] == {
        "g0": 4, "g1": 4}


def test_budget_floor_drops_to_total_over_prompts_when_the_budget_cannot_cover_it():
    # floor 4 for 2 prompts needs 8 > 3: floor becomes 3 // 2 = 1; quotas 1.875, 1.125
    got = advice([[1, 0], [1] + [0] * 9], "budget", total=3, min_per_prompt=4)
    assert got["allocation"] == {"g0": 2, "g1": 1}


def test_budget_all_prompts_skipped_leaves_the_whole_budget_unallocated():
    got = advice([[1, 1], [0, 0, 0]], "budget", total=7)
    assert got == {"allocation": {"g0": 0, "g1": 0}, "skipped": ["g0", "g1"],
                   "unallocated": 7}


def test_budget_without_skip_solved_gives_zero_weight_prompts_the_floor():
    got = advice([[1, 0], [1, 1]], "budget", total=6, min_per_prompt=1, skip_solved=False)
    assert got == {"allocation": {"g0": 5, "g1": 1}, "skipped": [], "unallocated": 0}


def test_budget_splits_evenly_when_no_prompt_has_weight():
    # 2.5 each; equal remainders: the first prompt in request order takes the extra one
    got = advice([[1, 1], [0, 0]], "budget", total=5, skip_solved=False)
    assert got["allocation"] == {"g0": 3, "g1": 2}


def test_budget_needs_min_pilot_rollouts_before_skipping_and_prior_smooths_p():
    # g0 has one correct pilot rollout: not confident, so not skipped (weight 0 with prior 0)
    got = advice([[1], [1, 0]], "budget", total=10)
    assert got == {"allocation": {"g0": 0, "g1": 10}, "skipped": [], "unallocated": 0}
    assert advice([[1], [1, 0]], "budget", total=10, min_pilot=1)["skipped"] == ["g0"]
    # prior 1: p0 = 2/3 (w 0.4714), p1 = 2/4 (w 0.5): quotas 4.853, 5.147 -> 5, 5
    got = advice([[1], [1, 0]], "budget", total=10, prior=1.0)
    assert got["allocation"] == {"g0": 5, "g1": 5}


def test_budget_prompt_without_included_pilot_rollouts_counts_as_unexplored():
    # g0: no included rollout -> p = 1/2, the largest weight, like g1
    got = advice([[None, None], [1, 0]], "budget", total=9)
    assert got == {"allocation": {"g0": 5, "g1": 4}, "skipped": [], "unallocated": 0}


def test_budget_total_is_required():
    errors = invalid(groups_of([[1, 0]]), [{"name": "budget"}])
    assert errors[0]["loc"] == ["body", "advantage", "filters", 0, "params", "total"]
    assert errors[0]["type"] == "missing"


def test_budget_max_below_min_is_rejected():
    errors = invalid(groups_of([[1, 0]]), [{"name": "budget", "params": {
        "total": 10, "min_per_prompt": 8, "max_per_prompt": 4}}])
    assert errors[0]["loc"] == ["body", "advantage", "filters", 0, "params"]
    assert "below min_per_prompt" in errors[0]["msg"]


@st.composite
def budget_cases(draw: Any) -> tuple[list[list[float | None]], dict[str, Any]]:
    reward = st.one_of(st.sampled_from([0.0, 1.0, None]),
                       st.floats(0, 1, allow_nan=False, allow_infinity=False))
    rewards = draw(st.lists(st.lists(reward, min_size=1, max_size=8), min_size=1, max_size=12))
    if all(r is None for g in rewards for r in g):
        rewards[0][0] = 1.0
    lo = draw(st.integers(0, 10))
    params = {"total": draw(st.integers(0, 400)), "min_per_prompt": lo,
              "max_per_prompt": draw(st.integers(max(lo, 1), 80)),
              "weight": draw(st.sampled_from(["std", "variance"])),
              "skip_solved": draw(st.booleans()), "prior": draw(st.sampled_from([0.0, 0.5, 1.0]))}
    return rewards, params


@PROPERTY
@given(budget_cases())
def test_property_budget_allocation_sums_exactly_to_total_within_bounds(case):
    rewards, params = case
    got = advice(rewards, "budget", **params)
    allocation, skipped = got["allocation"], set(got["skipped"])
    active = [gid for gid in allocation if gid not in skipped]
    total, hi = params["total"], params["max_per_prompt"]
    assert sum(allocation.values()) + got["unallocated"] == total
    assert all(allocation[gid] == 0 for gid in skipped)
    if not active:
        assert got["unallocated"] == total
        return
    assert got["unallocated"] == max(total - len(active) * hi, 0)
    lo = min(params["min_per_prompt"], total // len(active))
    assert all(lo <= allocation[gid] <= hi for gid in active)


# ----------------------------------------------------------------------------- ucb_curriculum


def ucb(mean: float, n: int, total: int, c: float = 1.0) -> float:
    return mean + c * math.sqrt(2.0 * math.log(total) / n)


def softmax(scores: dict[str, float], temperature: float = 1.0) -> dict[str, float]:
    top = max(scores.values())
    e = {k: math.exp((v - top) / temperature) for k, v in scores.items()}
    return {k: v / sum(e.values()) for k, v in e.items()}


def assert_close(got: dict[str, float], expected: dict[str, float]) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=TIGHT, rel=0)


def test_ucb_curriculum_accumulates_counts_and_mean_abs_advantage_across_requests():
    runs = MemoryRunStore()
    ucb_filter = [{"name": "ucb_curriculum"}]
    # dr_grpo: [1,0,0,0] -> .75, -.25 x3 (mean |A| .375); [1,1] -> 0; [1,0] -> +-.5 (.5)
    first = advise(groups_of([[1, 0, 0, 0], [1, 1], [1, 0]], ["math", "math", "code"]),
                   ucb_filter, runs, "run-1", estimator="dr_grpo")["advice"]["ucb_curriculum"]
    assert first["counts"] == {"math": 2, "code": 1}
    assert_close(first["mean_abs_advantage"], {"math": 0.1875, "code": 0.5})
    scores = {"math": ucb(0.1875, 2, 3), "code": ucb(0.5, 1, 3)}
    assert_close(first["scores"], scores)
    assert_close(first["weights"], softmax(scores))
    # second request: code [0,1,1,1] -> mean |A| .375; logic new; math not in this batch
    second = advise(groups_of([[0, 1, 1, 1], [1, 0, 0, 0]], ["code", "logic"]),
                    ucb_filter, runs, "run-1", estimator="dr_grpo")["advice"]["ucb_curriculum"]
    assert second["counts"] == {"math": 2, "code": 2, "logic": 1}
    assert_close(second["mean_abs_advantage"],
                 {"math": 0.1875, "code": (0.5 + 0.375) / 2, "logic": 0.375})
    scores = {"math": ucb(0.1875, 2, 5), "code": ucb(0.4375, 2, 5), "logic": ucb(0.375, 1, 5)}
    assert_close(second["scores"], scores)
    assert_close(second["weights"], softmax(scores))
    assert sum(second["weights"].values()) == pytest.approx(1.0, abs=TIGHT)
    assert runs.view("run-1") == {"ucb_curriculum": {"sources": {
        "math": {"count": 2, "mean_abs_advantage": 0.1875},
        "code": {"count": 2, "mean_abs_advantage": 0.4375},
        "logic": {"count": 1, "mean_abs_advantage": 0.375}}}}


def test_ucb_curriculum_state_is_per_run():
    runs = MemoryRunStore()
    groups = groups_of([[1, 0]], ["math"])
    advise(groups, [{"name": "ucb_curriculum"}], runs, "run-a")
    got = advise(groups, [{"name": "ucb_curriculum"}], runs, "run-b")["advice"]
    assert got["ucb_curriculum"]["counts"] == {"math": 1}


def test_ucb_curriculum_c_and_temperature_shape_the_weights():
    runs = MemoryRunStore()
    groups = groups_of([[1, 0, 0, 0], [1, 0]], ["math", "code"])
    got = advise(groups, [{"name": "ucb_curriculum", "params": {"c": 0.0, "temperature": 0.5}}],
                 runs, "run-1", estimator="dr_grpo")["advice"]["ucb_curriculum"]
    assert_close(got["scores"], {"math": 0.375, "code": 0.5})
    assert_close(got["weights"], softmax({"math": 0.375, "code": 0.5}, 0.5))


def test_ucb_curriculum_averages_over_included_rollouts_and_skips_empty_groups():
    runs = MemoryRunStore()
    # g0: included [1, 0] -> dr_grpo +-.5; g1 (code) has no included rollout
    got = advise(groups_of([[1, None, 0], [None], [1, 0]], ["math", "code", "math"]),
                 [{"name": "ucb_curriculum"}], runs, "r", estimator="dr_grpo")["advice"]
    assert got["ucb_curriculum"]["counts"] == {"math": 2}
    assert_close(got["ucb_curriculum"]["mean_abs_advantage"], {"math": 0.5})


def test_ucb_curriculum_reads_token_level_advantages_as_mean_abs_over_mask_1_tokens():
    runs = MemoryRunStore()
    groups = [{"group_id": "g0", "data_source": "math", "rollouts": [
        {"rollout_id": "a", "reward": 1, "num_tokens": 3, "mask": [1, 0, 1]},
        {"rollout_id": "b", "reward": 0, "num_tokens": 1}]}]
    batch = batch_of(groups, runs, "r")
    # a: (|2| + |-4|) / 2 = 3 (masked 9 ignored); b: 1 -> prompt mean (3 + 1) / 2 = 2
    tokens = torch.tensor([2.0, 9.0, -4.0, -1.0], dtype=torch.float64)
    got = call("ucb_curriculum", batch, Advantages(token=tokens))
    assert got["mean_abs_advantage"] == {"math": 2.0}
    assert got["scores"] == {"math": 2.0}  # N = n = 1: ln 1 = 0, no bonus
    assert got["weights"] == {"math": 1.0}


def test_ucb_curriculum_without_run_id_is_rejected():
    errors = invalid(groups_of([[1, 0]], ["math"]), [{"name": "ucb_curriculum"}])
    assert errors == [{"loc": ["body", "run_id"], "type": "value_error",
                       "msg": "filter 'ucb_curriculum' keeps per-run state: send a run_id"}]


def test_ucb_curriculum_called_without_a_run_store_says_so():
    body = {"groups": groups_of([[1, 0]], ["math"]), "run_id": "r",
            "advantage": {"output": "scalar", "filters": [{"name": "ucb_curriculum"}]}}
    with pytest.raises(RuntimeError, match="RunStore"):
        pipeline_advantages(AdvantagesRequest.model_validate(body))


def test_ucb_curriculum_without_data_source_is_rejected_naming_the_group():
    groups = groups_of([[1, 0], [0, 1]], ["math", "code"])
    del groups[1]["data_source"]
    errors = invalid(groups, [{"name": "ucb_curriculum"}], run_id="r")
    assert errors[0]["loc"] == ["body", "groups", 1, "data_source"]
    assert "ucb_curriculum" in errors[0]["msg"]
    assert errors[0]["type"] == "missing"


# ----------------------------------------------------------------------------- never applied


ALL_FILTERS = [{"name": "dynamic_sampling", "params": {"min_score": 0.1}},
               {"name": "pairwise_sampling", "params": {"k": 2}},
               {"name": "variance_priority", "params": {"mode": "variance", "low": -5,
                                                        "high": 5}},
               {"name": "budget", "params": {"total": 37}},
               {"name": "ucb_curriculum"}]


@st.composite
def filter_cases(draw: Any) -> tuple[list[dict[str, Any]], str, str, str]:
    profile = draw(st.sampled_from(PROFILES))
    reward = st.one_of(st.sampled_from([0.0, 1.0, 0.5, None]),
                       st.floats(-5, 5, allow_nan=False, allow_infinity=False))
    size = draw(st.integers(1, 6))  # equal sizes keep the openrlhf profile valid
    rewards = draw(st.lists(st.lists(reward, min_size=size, max_size=size),
                            min_size=1, max_size=5))
    if all(r is None for g in rewards for r in g):
        rewards[0][0] = 1.0
    sources = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=len(rewards),
                            max_size=len(rewards)))
    groups = groups_of(rewards, sources)
    for gi, group in enumerate(groups):
        for rollout in group["rollouts"]:
            n = draw(st.integers(0, 5))
            rollout["num_tokens"] = n
            if draw(st.booleans()):
                rollout["mask"] = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    return groups, profile, draw(st.sampled_from(ESTIMATORS)), draw(st.sampled_from(
        ["dense", "rle", "scalar"]))


@PROPERTY
@given(filter_cases())
def test_property_filters_never_change_the_advantages_or_the_summary(case):
    groups, profile, estimator, output = case
    spec = {"estimator": estimator, "profile": profile, "output": output}
    plain = advise(groups, [], **spec)
    advised = advise(groups, ALL_FILTERS, MemoryRunStore(), "run", **spec)
    assert set(advised["advice"]) == {f["name"] for f in ALL_FILTERS}
    assert plain["advice"] == {}
    assert plain["summary"] == advised["summary"]

    def flat(resp: dict[str, Any]) -> bytes:
        # orjson writes the shortest round-trip repr, so equal bytes mean equal bits (and
        # -0.0 differs from 0.0); dense arrays come as numpy
        values = [r["advantages"] for g in resp["groups"] for r in g["rollouts"]]
        return orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)

    assert flat(plain) == flat(advised)
    marked = set(advised["advice"]["dynamic_sampling"]["filtered"])
    assert [g["diagnostics"]["filtered"] for g in advised["groups"]] == [
        g["group_id"] in marked for g in advised["groups"]]
    assert not any(g["diagnostics"]["filtered"] for g in plain["groups"])


# ----------------------------------------------------------------------------- batch diagnostics


def test_summary_zero_advantage_and_silent_group_fractions():
    # g0 [1,0,0,0]: four nonzero; g1 [1,1]: zero spread, both 0; g2 [0.5]: singleton, 0 under
    # rewardd; g3 [1, 0, excluded]: the excluded rollout is 0, the group still has signal
    resp = advise(groups_of([[1, 0, 0, 0], [1, 1], [0.5], [1, 0, None]]), [])
    summary = resp["summary"]
    assert summary["zero_advantage_fraction"] == 4 / 10
    assert summary["silent_group_fraction"] == 2 / 4
    assert summary["component_energy"] is None  # a single component


def test_summary_fractions_are_zero_when_every_rollout_has_signal():
    summary = advise(groups_of([[1, 0], [0.2, 0.4, 0.9]]), [])["summary"]
    assert summary["zero_advantage_fraction"] == 0.0
    assert summary["silent_group_fraction"] == 0.0


def test_summary_fractions_are_computed_even_when_output_is_none():
    resp = run(scalar_groups([[1, 0]]), output="none")
    assert resp["summary"]["zero_advantage_fraction"] == 0.0
    assert resp["summary"]["silent_group_fraction"] == 0.0


def component_groups(extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    acc = [[1, 0, 0, 0], [1, 0]]
    fmt = [[1, 1, 0, 1], [0.5, 0.5]]
    groups = []
    for gi in range(2):
        rollouts = [{"rollout_id": f"g{gi}r{ri}", "rewards": {"acc": a, "fmt": f}}
                    for ri, (a, f) in enumerate(zip(acc[gi], fmt[gi]))]
        groups.append({"group_id": f"g{gi}", "rollouts": rollouts})
    groups[0]["rollouts"] += extra or []
    return groups


def expected_energy() -> dict[str, float]:
    # acc: g0 GRPO .75, -.25 x3 over (std .5 + eps); g1 +-.5 over (sqrt(.5) + eps)
    acc = [*grpo([1, 0, 0, 0]), *grpo([1, 0])]
    # fmt: g0 [1,1,0,1] -> .25 x3, -.75 over (.5 + eps); g1 zero spread -> 0, 0
    fmt = [*grpo([1, 1, 0, 1]), 0.0, 0.0]
    assert acc[0] == 0.75 / (0.5 + EPS) and fmt[2] == -0.75 / (0.5 + EPS)
    return {"acc": sum(a * a for a in acc) / 6, "fmt": sum(f * f for f in fmt) / 6}


def test_summary_component_energy_is_mean_squared_own_grpo_advantage_per_component():
    resp = advise(component_groups(), [], components=True)
    assert_close(resp["summary"]["component_energy"], expected_energy())
    hand = {"acc": (0.75 / (0.5 + EPS) ** 2 + 0.5 / (math.sqrt(0.5) + EPS) ** 2) / 6,
            "fmt": 0.75 / (0.5 + EPS) ** 2 / 6}
    assert_close(resp["summary"]["component_energy"], hand)
    component = [r["component_advantages"] for g in resp["groups"] for r in g["rollouts"]]
    assert component[4]["acc"] == pytest.approx(0.5 / (math.sqrt(0.5) + EPS), abs=TIGHT)
    assert component[4]["fmt"] == 0.0


def test_summary_component_energy_averages_over_included_rollouts_only():
    # a rollout without fmt is excluded: it enters neither component's baseline nor the mean
    resp = advise(component_groups([{"rollout_id": "late", "rewards": {"acc": 1}}]), [])
    assert resp["summary"]["excluded_rollouts"] == 1
    assert_close(resp["summary"]["component_energy"], expected_energy())


def test_summary_component_energy_does_not_depend_on_component_weights():
    weighted = advise(component_groups(), [], weights={"acc": 2.0, "fmt": 0.25})
    assert_close(weighted["summary"]["component_energy"], expected_energy())
