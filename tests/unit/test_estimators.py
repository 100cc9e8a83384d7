"""GRPO-family estimators (grpo, dr_grpo, rloo) under every trainer profile.

Checked two ways: directly through ``rewardd.advantages`` (AdvantageBatch + compute) and through
the pure pipeline ``rewardd.service.pipeline.advantages``. Golden values come from docs/estimators.md; each
is compared with the hand formula evaluated here in float64.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import orjson
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rewardd import advantages as adv
from rewardd.advantages import AdvantageBatch, compute, decode_rle
from rewardd.service.models import AdvantagesRequest, ScoreResponse
from rewardd.service.pipeline import advantages as pipeline_advantages
from rewardd.advantages.errors import RequestInvalid

PROFILES = ("rewardd", "verl", "trl", "openrlhf")
ESTIMATORS = ("grpo", "dr_grpo", "rloo")
EPS = {"rewardd": 1e-6, "verl": 1e-6, "trl": 1e-4, "openrlhf": 1e-9}
TIGHT = 1e-12


# ----------------------------------------------------------------------------- helpers


def outcome_batch(groups: list[list[float]], valid: list[list[bool]] | None = None) -> AdvantageBatch:
    rewards = [r for g in groups for r in g]
    group = [gi for gi, g in enumerate(groups) for _ in g]
    flat_valid = ([v for g in valid for v in g] if valid is not None else [True] * len(rewards))
    return AdvantageBatch(rewards=torch.tensor(rewards, dtype=torch.float64),
                        group=torch.tensor(group, dtype=torch.int64),
                        valid=torch.tensor(flat_valid, dtype=torch.bool),
                        num_tokens=torch.ones(len(rewards), dtype=torch.int64),
                        num_groups=len(groups))


def direct(groups: list[list[float]], estimator: str, profile: str) -> list[float]:
    return compute(outcome_batch(groups), estimator, {}, profile).rollout.tolist()


def request(groups: list[dict[str, Any]], **advantage: Any) -> AdvantagesRequest:
    return AdvantagesRequest.model_validate({"groups": groups, "advantage": advantage})


def scalar_groups(groups: list[list[float]], **extra: Any) -> list[dict[str, Any]]:
    return [{"group_id": f"g{gi}",
             "rollouts": [{"rollout_id": f"g{gi}r{ri}", "reward": r, **extra}
                          for ri, r in enumerate(g)]}
            for gi, g in enumerate(groups)]


def run(groups: list[dict[str, Any]], **advantage: Any) -> dict[str, Any]:
    resp = pipeline_advantages(request(groups, **advantage))
    assert_valid_response(resp)
    return resp


def assert_valid_response(resp: dict[str, Any]) -> ScoreResponse:
    wire = orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY)
    return ScoreResponse.model_validate(orjson.loads(wire))


def pipeline_scalars(groups: list[list[float]], estimator: str, profile: str) -> list[float]:
    resp = run(scalar_groups(groups), estimator=estimator, profile=profile, output="scalar")
    return [r["advantages"] for g in resp["groups"] for r in g["rollouts"]]


def both_paths(groups: list[list[float]], estimator: str, profile: str) -> list[list[float]]:
    return [direct(groups, estimator, profile), pipeline_scalars(groups, estimator, profile)]


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def is_plus_zero(x: float) -> bool:
    return x == 0.0 and math.copysign(1.0, x) == 1.0


def unbiased_std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def grpo_formula(xs: list[float], eps: float) -> list[float]:
    if len(set(xs)) == 1:  # zero spread: exactly 0 by definition, whatever the rounding
        return [0.0] * len(xs)
    m = sum(xs) / len(xs)
    s = unbiased_std(xs)
    return [(x - m) / (s + eps) for x in xs]


# ----------------------------------------------------------------------------- golden values


@pytest.mark.parametrize("profile", PROFILES)
def test_grpo_golden_one_correct_of_four_matches_hand_formula_under_each_profile(profile):
    eps = EPS[profile]
    std = 0.5  # unbiased std of [1, 0, 0, 0]
    assert unbiased_std([1.0, 0.0, 0.0, 0.0]) == std
    hi, lo = 0.75 / (std + eps), -0.25 / (std + eps)
    for got in both_paths([[1.0, 0.0, 0.0, 0.0]], "grpo", profile):
        assert got == pytest.approx([hi, lo, lo, lo], abs=TIGHT, rel=0)


def test_grpo_golden_verl_gives_documented_1_499997_and_minus_0_499999():
    got = direct([[1.0, 0.0, 0.0, 0.0]], "grpo", "verl")
    assert round(got[0], 6) == 1.499997
    assert round(got[1], 6) == -0.499999
    assert got[0] == pytest.approx(0.75 / (0.5 + 1e-6), abs=TIGHT, rel=0)


@pytest.mark.parametrize("profile", PROFILES)
def test_dr_grpo_golden_one_correct_of_four_gives_075_and_minus_025(profile):
    for got in both_paths([[1.0, 0.0, 0.0, 0.0]], "dr_grpo", profile):
        assert got == pytest.approx([0.75, -0.25, -0.25, -0.25], abs=TIGHT, rel=0)


@pytest.mark.parametrize("profile", PROFILES)
def test_rloo_golden_one_correct_of_four_gives_1_and_minus_one_third(profile):
    for got in both_paths([[1.0, 0.0, 0.0, 0.0]], "rloo", profile):
        assert got == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=TIGHT, rel=0)


@pytest.mark.parametrize("profile", PROFILES)
def test_grpo_golden_two_groups_of_one_zero_give_plus_minus_0_707106(profile):
    std = unbiased_std([1.0, 0.0])
    assert std == pytest.approx(0.7071067811865476, abs=1e-15)
    a = 0.5 / (std + EPS[profile])
    for got in both_paths([[1.0, 0.0], [1.0, 0.0]], "grpo", profile):
        assert got == pytest.approx([a, -a, a, -a], abs=TIGHT, rel=0)
    if profile in ("rewardd", "verl"):
        assert round(a, 6) == 0.707106


def test_grpo_groups_are_independent_and_use_their_own_statistics():
    groups = [[1.0, 0.0, 0.0, 0.0], [3.0, 1.0, 2.0], [0.5, -0.5]]
    expected = [a for g in groups for a in grpo_formula(g, 1e-6)]
    for got in both_paths(groups, "grpo", "rewardd"):
        assert got == pytest.approx(expected, abs=TIGHT, rel=0)


# ----------------------------------------------------------------------------- singleton / zero spread


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("profile", ("rewardd", "trl", "openrlhf"))
def test_singleton_group_gets_zero_and_singleton_diagnostic_under_zero_rule_profiles(
        profile, estimator):
    resp = run(scalar_groups([[0.7], [0.3]]), estimator=estimator, profile=profile,
               output="scalar")
    for group in resp["groups"]:
        [rollout] = group["rollouts"]
        assert is_plus_zero(rollout["advantages"])
        assert group["diagnostics"]["singleton"] is True
        assert group["diagnostics"]["baseline_size"] == 1
        assert group["diagnostics"]["reward_std"] is None
    assert resp["summary"]["singleton_groups"] == 2
    assert direct([[0.7], [0.3]], estimator, profile) == [0.0, 0.0]


def test_grpo_singleton_group_gets_zero_under_rewardd_profile():
    resp = run(scalar_groups([[1.0]]), estimator="grpo", profile="rewardd", output="scalar")
    assert resp["groups"][0]["rollouts"][0]["advantages"] == 0.0
    assert resp["groups"][0]["diagnostics"]["singleton"] is True


def test_grpo_singleton_group_keeps_r_over_one_plus_eps_under_verl_profile():
    for r in (1.0, 0.3, -2.5):
        for got in both_paths([[r]], "grpo", "verl"):
            assert got == pytest.approx([r / (1 + 1e-6)], abs=TIGHT, rel=0)
    resp = run(scalar_groups([[0.3]]), estimator="grpo", profile="verl", output="scalar")
    assert resp["groups"][0]["diagnostics"]["singleton"] is True


@pytest.mark.parametrize("estimator", ("dr_grpo", "rloo"))
def test_mean_baseline_singleton_group_keeps_raw_reward_under_verl_profile(estimator):
    for r in (1.0, 0.3, -2.5):
        for got in both_paths([[r]], estimator, "verl"):
            assert got == [r]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("value", (0.0, 1.0, -3.0, 0.5))
def test_zero_spread_group_gets_all_zero_and_zero_spread_diagnostic(profile, estimator, value):
    resp = run(scalar_groups([[value] * 3, [1.0, 0.0, 0.0]]), estimator=estimator, profile=profile,
               output="scalar")
    zero_group = resp["groups"][0]
    assert zero_group["diagnostics"]["zero_spread"] is True
    assert zero_group["diagnostics"]["singleton"] is False
    assert all(is_plus_zero(r["advantages"]) for r in zero_group["rollouts"])
    assert resp["groups"][1]["diagnostics"]["zero_spread"] is False
    assert resp["summary"]["zero_spread_groups"] == 1


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("profile", PROFILES)
def test_zero_spread_group_of_non_dyadic_rewards_gets_exactly_zero(profile, estimator):
    resp = run(scalar_groups([[0.1, 0.1, 0.1]]), estimator=estimator, profile=profile,
               output="scalar")
    assert resp["groups"][0]["diagnostics"]["zero_spread"] is True
    got = [r["advantages"] for r in resp["groups"][0]["rollouts"]]
    assert got == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("rewards,expected", [([1e200, 0.0], [0.7071067811865476] * 2),
                                              ([1e308, 1e308], [0.0, 0.0])])
def test_rewards_beyond_the_reward_bound_are_rejected(rewards, expected):
    with pytest.raises(ValidationError) as info:
        request(scalar_groups([rewards]), output="scalar")
    assert info.value.errors()[0]["loc"] == ("groups", 0, "rollouts", 0, "reward")
    assert "less than or equal to 1000000000000" in info.value.errors()[0]["msg"]


def test_openrlhf_profile_rejects_groups_of_unequal_size():
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(scalar_groups([[1.0, 0.0], [1.0, 0.0, 0.0]]),
                                    profile="openrlhf", output="scalar"))
    [err] = info.value.errors
    assert err["loc"] == ["body", "advantage", "profile"]
    assert "equal size" in err["msg"] and "[2, 3]" in err["msg"]


def test_openrlhf_profile_accepts_groups_of_equal_size():
    resp = run(scalar_groups([[1.0, 0.0], [0.0, 1.0]]), profile="openrlhf", output="scalar")
    assert resp["profile"] == "openrlhf"


# ----------------------------------------------------------------------------- masks and encodings


MASKED_GROUP = [{"group_id": "g", "rollouts": [
    {"rollout_id": "a", "reward": 1.0, "num_tokens": 5, "mask": [1, 0, 1, 1, 0]},
    {"rollout_id": "b", "reward": 0.0, "num_tokens": 5, "mask": [1, 0, 1, 1, 0]},
    {"rollout_id": "c", "reward": 0.0, "num_tokens": 3},
    {"rollout_id": "d", "reward": 0.0, "num_tokens": 0},
]}]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_dense_advantages_are_plus_zero_on_masked_tokens_and_the_scalar_elsewhere(estimator):
    dense = run(MASKED_GROUP, estimator=estimator, output="dense")
    scalar = run(MASKED_GROUP, estimator=estimator, output="scalar")
    for rd, rs in zip(dense["groups"][0]["rollouts"], scalar["groups"][0]["rollouts"]):
        values = [float(x) for x in rd["advantages"]]
        assert len(values) == rd["num_tokens"]
        mask = next(r.get("mask") for r in MASKED_GROUP[0]["rollouts"]
                    if r["rollout_id"] == rd["rollout_id"]) or [1] * len(values)
        for m, x in zip(mask, values):
            if m == 0:
                assert is_plus_zero(x)
            else:
                assert bits(x) == bits(rs["advantages"])
    assert [float(x) for x in dense["groups"][0]["rollouts"][0]["advantages"]][1] == 0.0


def test_masked_negative_advantage_rollout_has_no_negative_zero():
    dense = run(MASKED_GROUP, output="dense")
    b = [float(x) for x in dense["groups"][0]["rollouts"][1]["advantages"]]
    assert b[0] < 0
    assert bits(b[1]) == bits(0.0) and bits(b[4]) == bits(0.0)


def test_rle_with_mask_decodes_bit_for_bit_to_dense_including_empty_rollouts():
    dense = run(MASKED_GROUP, output="dense")
    rle = run(MASKED_GROUP, output="rle")
    for rd, rr in zip(dense["groups"][0]["rollouts"], rle["groups"][0]["rollouts"]):
        decoded = decode_rle(rr["advantages"]["rle"])
        assert [bits(x) for x in decoded] == [bits(float(x)) for x in rd["advantages"]]
    a = rle["groups"][0]["rollouts"][0]["advantages"]["rle"]
    hi = 0.75 / (0.5 + 1e-6)
    assert [[v, n] for v, n in a] == [[pytest.approx(hi, abs=TIGHT), 1], [0.0, 1],
                                      [pytest.approx(hi, abs=TIGHT), 2], [0.0, 1]]
    assert rle["groups"][0]["rollouts"][3]["advantages"] == {"rle": []}


def test_rle_without_any_mask_is_one_run_per_rollout_and_empty_for_zero_tokens():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "reward": 1.0, "num_tokens": 4},
        {"rollout_id": "b", "reward": 0.0, "num_tokens": 0},
        {"rollout_id": "c", "reward": 0.0, "token_ids": [5, 6, 7]}]}]
    rle = run(groups, estimator="dr_grpo", output="rle")
    got = [r["advantages"]["rle"] for r in rle["groups"][0]["rollouts"]]
    assert got == [[[pytest.approx(2 / 3, abs=TIGHT), 4]], [],
                   [[pytest.approx(-1 / 3, abs=TIGHT), 3]]]
    assert rle["groups"][0]["rollouts"][2]["num_tokens"] == 3


def test_output_none_returns_null_advantages_but_keeps_rewards():
    resp = run(scalar_groups([[1.0, 0.0]]), output="none")
    for r in resp["groups"][0]["rollouts"]:
        assert r["advantages"] is None
    assert [r["reward"] for r in resp["groups"][0]["rollouts"]] == [1.0, 0.0]


def test_output_scalar_does_not_need_num_tokens():
    resp = run(scalar_groups([[1.0, 0.0]]), output="scalar")
    assert resp["groups"][0]["rollouts"][0]["num_tokens"] is None


def test_rle_output_without_num_tokens_is_rejected_naming_the_field():
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(scalar_groups([[1.0, 0.0]]), output="rle"))
    locs = [e["loc"] for e in info.value.errors]
    assert ["body", "groups", 0, "rollouts", 0, "num_tokens"] in locs


# ----------------------------------------------------------------------------- property tests


small_rewards = st.sampled_from([0.0, -0.0, 1.0, 0.5, -1.0, 2.0])
float_rewards = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def batches(draw: Any, rewards: st.SearchStrategy[float] | None = None,
            equal_sizes: bool = False, min_size: int = 1) -> list[dict[str, Any]]:
    reward_st = rewards if rewards is not None else st.one_of(small_rewards, float_rewards)
    n_groups = draw(st.integers(1, 4))
    fixed = draw(st.integers(min_size, 6)) if equal_sizes else None
    groups = []
    for gi in range(n_groups):
        size = fixed or draw(st.integers(min_size, 6))
        rollouts = []
        for ri in range(size):
            n = draw(st.integers(0, 40))
            rollout: dict[str, Any] = {"rollout_id": f"g{gi}r{ri}",
                                       "reward": draw(reward_st), "num_tokens": n}
            if draw(st.booleans()):
                rollout["mask"] = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
            rollouts.append(rollout)
        groups.append({"group_id": f"g{gi}", "rollouts": rollouts})
    return groups


@st.composite
def batches_with_setup(draw: Any) -> tuple[list[dict[str, Any]], str, str]:
    profile = draw(st.sampled_from(PROFILES))
    estimator = draw(st.sampled_from(ESTIMATORS))
    return draw(batches(equal_sizes=profile == "openrlhf")), profile, estimator


PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(batches_with_setup())
def test_property_rle_dense_and_scalar_agree_bit_for_bit(case):
    groups, profile, estimator = case
    outs = {o: run(groups, estimator=estimator, profile=profile, output=o)
            for o in ("dense", "rle", "scalar", "none")}
    flat_in = [r for g in groups for r in g["rollouts"]]
    per = {o: [r for g in outs[o]["groups"] for r in g["rollouts"]] for o in outs}
    expected_scalars = direct([[r["reward"] for r in g["rollouts"]] for g in groups],
                              estimator, profile)
    for i, rin in enumerate(flat_in):
        n = rin["num_tokens"]
        mask = rin.get("mask") or [1] * n
        dense = [float(x) for x in per["dense"][i]["advantages"]]
        decoded = decode_rle(per["rle"][i]["advantages"]["rle"])
        scalar = per["scalar"][i]["advantages"]
        assert len(dense) == n
        assert [bits(x) for x in decoded] == [bits(x) for x in dense]
        assert bits(scalar) == bits(expected_scalars[i])
        assert not (scalar == 0.0 and math.copysign(1.0, scalar) < 0)
        for m, x in zip(mask, dense):
            assert bits(x) == (bits(scalar) if m else bits(0.0))
        runs = per["rle"][i]["advantages"]["rle"]
        assert all(length > 0 for _, length in runs)
        assert all(bits(a) != bits(b) for (a, _), (b, _) in zip(runs, runs[1:]))
        assert per["none"][i]["advantages"] is None


dyadic = st.integers(-640, 640).map(lambda k: k / 64)


@st.composite
def shift_cases(draw: Any) -> tuple[list[dict[str, Any]], float, str]:
    profile = draw(st.sampled_from(PROFILES))
    groups = draw(batches(rewards=dyadic, equal_sizes=profile == "openrlhf"))
    return groups, draw(st.integers(-6400, 6400).map(lambda k: k / 64)), profile


@PROPERTY
@given(shift_cases())
def test_property_grpo_is_invariant_to_adding_a_constant_to_every_reward(case):
    groups, c, profile = case
    base = [[r["reward"] for r in g["rollouts"]] for g in groups]
    shifted = [[x + c for x in g] for g in base]
    a = direct(base, "grpo", profile)
    b = direct(shifted, "grpo", profile)
    single = [len(g) == 1 for g in base for _ in g]
    if profile == "verl":  # verl's singleton keeps r / (1 + eps): not shift invariant
        a = [0.0 if s else x for s, x in zip(single, a)]
        b = [0.0 if s else x for s, x in zip(single, b)]
    assert b == pytest.approx(a, abs=1e-9, rel=0)
    pipe = pipeline_scalars(shifted, "grpo", profile)
    if profile == "verl":
        pipe = [0.0 if s else x for s, x in zip(single, pipe)]
    assert pipe == b


@PROPERTY
@given(batches(rewards=float_rewards, min_size=2),
       st.floats(min_value=0.01, max_value=100.0))
def test_property_grpo_scaling_rewards_by_positive_c_only_changes_the_eps_term(groups, c):
    base = [[r["reward"] for r in g["rollouts"]] for g in groups]
    scaled = [[x * c for x in g] for g in base]
    a = direct(base, "grpo", "rewardd")
    b = direct(scaled, "grpo", "rewardd")
    k = 0
    for g, gs in zip(base, scaled):
        s, ss = unbiased_std(g), unbiased_std(gs)
        m = sum(g) / len(g)
        for x in g:
            # a * (std + eps) is the centred reward, whatever the scale
            assert a[k] * (s + 1e-6) == pytest.approx(x - m, abs=1e-9, rel=1e-9)
            assert b[k] * (ss + 1e-6) / c == pytest.approx(x - m, abs=1e-9, rel=1e-9)
            if min(s, ss) >= 0.1:  # eps changes the ratio by at most eps / min(s, ss) = 1e-5
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-9)
            k += 1


@PROPERTY
@given(batches(rewards=st.one_of(small_rewards, float_rewards)),
       st.sampled_from(("rewardd", "trl", "openrlhf", "verl")))
def test_property_dr_grpo_and_rloo_sum_to_zero_and_rloo_is_n_over_n_minus_1_dr_grpo(
        groups, profile):
    base = [[r["reward"] for r in g["rollouts"]] for g in groups]
    # openrlhf clips the shaped reward to (-10, 10) by default; these identities hold unclipped
    unclipped = {"clip_range": [-1e13, 1e13]} if profile == "openrlhf" else {}
    dr = compute(outcome_batch(base), "dr_grpo", unclipped, profile).rollout.tolist()
    lo = compute(outcome_batch(base), "rloo", unclipped, profile).rollout.tolist()
    k = 0
    for g in base:
        n = len(g)
        dg, lg = dr[k:k + n], lo[k:k + n]
        k += n
        if n < 2:
            continue  # singleton rule, checked separately
        scale = max(1.0, max(abs(x) for x in g))
        assert abs(math.fsum(dg)) <= 1e-9 * scale
        assert abs(math.fsum(lg)) <= 1e-9 * scale
        for d, r in zip(dg, lg):
            assert r == pytest.approx(n / (n - 1) * d, abs=1e-9 * scale, rel=1e-9)


@PROPERTY
@given(batches(rewards=float_rewards, min_size=2))
def test_property_grpo_matches_hand_formula_on_float_rewards(groups):
    base = [[r["reward"] for r in g["rollouts"]] for g in groups]
    got = direct(base, "grpo", "trl")
    k = 0
    for g in base:
        for want in grpo_formula(g, 1e-4):
            assert got[k] == pytest.approx(want, abs=1e-9, rel=1e-9)
            k += 1


# ----------------------------------------------------------------------------- failure policy


def test_null_precomputed_component_excludes_rollout_and_baseline_uses_the_others():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "rewards": {"acc": 1.0}, "num_tokens": 3},
        {"rollout_id": "b", "rewards": {"acc": None}, "num_tokens": 4},
        {"rollout_id": "c", "rewards": {"acc": 0.0}, "num_tokens": 2},
        {"rollout_id": "d", "rewards": {"acc": 0.5}, "num_tokens": 2}]}]
    resp = run(groups, estimator="grpo", output="rle")
    a, b, c, d = resp["groups"][0]["rollouts"]
    assert b["excluded"] is True and b["reward"] is None
    assert b["rewards"] == {"acc": None}
    assert b["status"]["acc"]["ok"] is False and b["status"]["acc"]["error"] == "missing"
    assert b["status"]["acc"].get("fallback_used", False) is False
    assert b["advantages"] == {"rle": [[0.0, 4]]}
    assert is_plus_zero(b["advantages"]["rle"][0][0])
    included = [1.0, 0.0, 0.5]
    mean = 0.5
    std = math.sqrt(((0.5) ** 2 + (0.5) ** 2 + 0.0) / 2)  # = 0.5
    assert std == unbiased_std(included)
    for r, x in ((a, 1.0), (c, 0.0), (d, 0.5)):
        # values the trainer sent are not echoed back; only their failures are reported
        assert r["excluded"] is False and r["rewards"] == {} and r["status"] == {}
        assert r["reward"] == x
        [[value, length]] = r["advantages"]["rle"]
        assert value == pytest.approx((x - mean) / (std + 1e-6), abs=TIGHT, rel=0)
        assert length == r["num_tokens"]
    diag = resp["groups"][0]["diagnostics"]
    assert diag["excluded"] == ["b"] and diag["baseline_size"] == 3
    assert diag["reward_mean"] == pytest.approx(mean, abs=TIGHT)
    assert diag["reward_std"] == pytest.approx(std, abs=TIGHT)
    assert resp["summary"]["failed_cells"] == 1 and resp["summary"]["excluded_rollouts"] == 1


def test_excluded_rollout_gets_single_zero_run_even_with_a_mask():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "rewards": {"acc": 1.0}, "num_tokens": 3, "mask": [1, 0, 1]},
        {"rollout_id": "b", "rewards": {"acc": None}, "num_tokens": 4, "mask": [1, 0, 0, 1]},
        {"rollout_id": "c", "rewards": {"acc": 0.0}, "num_tokens": 2}]}]
    resp = run(groups, estimator="dr_grpo", output="rle")
    a, b, c = resp["groups"][0]["rollouts"]
    assert b["advantages"] == {"rle": [[0.0, 4]]}
    assert a["advantages"]["rle"] == [[0.5, 1], [0.0, 1], [0.5, 1]]
    assert c["advantages"]["rle"] == [[-0.5, 2]]


def test_component_absent_on_one_rollout_counts_as_missing():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "rewards": {"acc": 1.0, "fmt": 1.0}},
        {"rollout_id": "b", "rewards": {"acc": 0.0}},
        {"rollout_id": "c", "rewards": {"acc": 0.0, "fmt": 0.0}}]}]
    resp = run(groups, estimator="dr_grpo", output="scalar")
    a, b, c = resp["groups"][0]["rollouts"]
    assert b["excluded"] is True and b["status"]["fmt"]["error"] == "missing"
    assert "acc" not in b["status"] and b["rewards"] == {"fmt": None}
    assert [a["advantages"], b["advantages"], c["advantages"]] == [1.0, 0.0, -1.0]


def test_weights_apply_in_the_weighted_sum_of_precomputed_components():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "rewards": {"acc": 1.0, "fmt": 0.0}},
        {"rollout_id": "b", "rewards": {"acc": 0.0, "fmt": 1.0}},
        {"rollout_id": "c", "rewards": {"acc": 1.0, "fmt": 1.0}}]}]
    resp = run(groups, estimator="dr_grpo", output="scalar", weights={"acc": 2.0, "fmt": 0.5})
    a, b, c = resp["groups"][0]["rollouts"]
    assert [a["reward"], b["reward"], c["reward"]] == [2.0, 0.5, 2.5]
    mean = (2.0 + 0.5 + 2.5) / 3
    assert [a["advantages"], b["advantages"], c["advantages"]] == pytest.approx(
        [2.0 - mean, 0.5 - mean, 2.5 - mean], abs=TIGHT, rel=0)
    assert a["rewards"] == {} and a["status"] == {}  # precomputed values are not echoed


def test_unweighted_components_default_to_weight_one():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "rewards": {"acc": 1.0, "fmt": 0.25}},
        {"rollout_id": "b", "rewards": {"acc": 0.0, "fmt": 0.75}}]}]
    resp = run(groups, output="scalar", weights={"acc": 3.0})
    assert [r["reward"] for r in resp["groups"][0]["rollouts"]] == [3.25, 0.75]


def test_reward_and_rewards_on_the_same_rollout_is_rejected():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "reward": 1.0, "rewards": {"acc": 1.0}, "num_tokens": 2},
        {"rollout_id": "b", "reward": 0.0, "num_tokens": 2}]}]
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(groups, output="rle"))
    [err] = info.value.errors
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "reward"]
    assert "not both" in err["msg"]


def test_reward_and_rewards_on_the_same_rollout_is_rejected_without_num_tokens():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "reward": 1.0, "rewards": {"acc": 1.0}},
        {"rollout_id": "b", "reward": 0.0}]}]
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(groups, output="scalar"))
    [err] = info.value.errors
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "reward"]


def test_request_without_any_reward_is_rejected():
    groups = [{"group_id": "g", "rollouts": [{"rollout_id": "a"}, {"rollout_id": "b"}]}]
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(groups, output="scalar"))
    assert info.value.errors[0]["loc"] == ["body", "groups"]


def test_all_but_one_rollout_excluded_makes_the_group_singleton_with_zero_advantage():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "rewards": {"acc": 1.0}},
        {"rollout_id": "b", "rewards": {"acc": None}}]}]
    resp = run(groups, estimator="grpo", profile="rewardd", output="scalar")
    a, b = resp["groups"][0]["rollouts"]
    assert a["advantages"] == 0.0 and b["advantages"] == 0.0
    assert resp["groups"][0]["diagnostics"]["singleton"] is True
    assert resp["groups"][0]["diagnostics"]["baseline_size"] == 1


# ----------------------------------------------------------------------------- response contract


@pytest.mark.parametrize("output", ("dense", "rle", "scalar", "none"))
@pytest.mark.parametrize("profile", PROFILES)
def test_response_validates_against_score_response_model(output, profile):
    groups = [{"group_id": "g0", "rollouts": [
        {"rollout_id": "a", "reward": 1.0, "num_tokens": 3, "mask": [1, 1, 0]},
        {"rollout_id": "b", "reward": 0.0, "num_tokens": 2}]},
              {"group_id": "g1", "rollouts": [
        {"rollout_id": "c", "rewards": {"x": None}, "num_tokens": 2},
        {"rollout_id": "d", "reward": 0.5, "num_tokens": 0}]}]
    resp = pipeline_advantages(request(groups, output=output, profile=profile))
    model = assert_valid_response(resp)
    assert model.profile.value == profile and model.estimator == "grpo"
    assert model.summary.rollouts == 4 and model.summary.groups == 2
    assert [g.group_id for g in model.groups] == ["g0", "g1"]


def test_library_exports_registry_with_the_three_outcome_estimators():
    assert {"grpo", "dr_grpo", "rloo"} <= set(adv.ESTIMATORS)


def test_grpo_eps_param_overrides_the_profile_epsilon():
    resp = run(scalar_groups([[1.0, 0.0, 0.0, 0.0]]), profile="verl", output="scalar",
               params={"eps": 0.5})
    got = [r["advantages"] for r in resp["groups"][0]["rollouts"]]
    assert got == [0.75 / (0.5 + 0.5), -0.25 / (0.5 + 0.5), -0.25 / 1.0, -0.25 / 1.0]


def test_estimator_catalogue_lists_grpo_eps_with_type_and_default():
    from rewardd.service.api.catalogue import list_estimators

    grpo = next(e for e in list_estimators() if e.name == "grpo")
    [eps] = [p for p in grpo.params if p.name == "eps"]
    assert (eps.name, eps.required, eps.default) == ("eps", False, None)
    assert "float" in eps.type and "profile" in eps.description
