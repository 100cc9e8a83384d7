"""The rest of the outcome catalogue and the return-based estimators: opo, gpg, remax,
reinforce_pp, reinforce_pp_baseline, gae, passk, grpo_passk.

Every case goes through the full request path (``rewardd.service.pipeline.advantages``) and the
response is validated against ScoreResponse. Golden values are hand computations written
out in the comments; dyadic inputs make most of them exact.
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

from rewardd.advantages import decode_rle, pins_for
from rewardd.advantages.returns import reverse_scan
from rewardd.service.api.catalogue import list_estimators
from rewardd.service.models import AdvantagesRequest, ScoreResponse
from rewardd.service.pipeline import advantages as pipeline_advantages
from rewardd.advantages.errors import RequestInvalid

TIGHT = 1e-12
PROFILES = ("rewardd", "verl", "trl", "openrlhf")


# ----------------------------------------------------------------------------- helpers


def request(groups: list[dict[str, Any]], **advantage: Any) -> AdvantagesRequest:
    return AdvantagesRequest.model_validate({"groups": groups, "advantage": advantage})


def run(groups: list[dict[str, Any]], **advantage: Any) -> dict[str, Any]:
    resp = pipeline_advantages(request(groups, **advantage))
    wire = orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY)
    ScoreResponse.model_validate(orjson.loads(wire))
    return resp


def group(rollouts: list[dict[str, Any]], gid: str = "g0") -> dict[str, Any]:
    return {"group_id": gid, "rollouts": [{"rollout_id": f"{gid}r{i}", **r}
                                          for i, r in enumerate(rollouts)]}


def scalar_groups(groups: list[list[float]]) -> list[dict[str, Any]]:
    return [group([{"reward": r} for r in g], f"g{gi}") for gi, g in enumerate(groups)]


def rollouts(resp: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in resp["groups"] for r in g["rollouts"]]


def scalars(groups: list[dict[str, Any]], estimator: str, **advantage: Any) -> list[float]:
    resp = run(groups, estimator=estimator, output="scalar", **advantage)
    return [r["advantages"] for r in rollouts(resp)]


def dense(groups: list[dict[str, Any]], estimator: str, **advantage: Any) -> list[list[float]]:
    resp = run(groups, estimator=estimator, output="dense", **advantage)
    return [[float(x) for x in r["advantages"]] for r in rollouts(resp)]


def dense_returns(groups: list[dict[str, Any]], estimator: str, **advantage: Any
                  ) -> list[list[float]]:
    resp = run(groups, estimator=estimator, output="dense", **advantage)
    return [[float(x) for x in r["returns"]] for r in rollouts(resp)]


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def is_plus_zero(x: float) -> bool:
    return x == 0.0 and math.copysign(1.0, x) == 1.0


def approx(values: list[Any]) -> Any:
    """pytest.approx at 1e-12, also for a list of per-rollout lists."""
    if values and isinstance(values[0], list):
        return [pytest.approx(v, abs=TIGHT, rel=0) for v in values]
    return pytest.approx(values, abs=TIGHT, rel=0)


def invalid(groups: list[dict[str, Any]], **advantage: Any) -> list[dict[str, Any]]:
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(groups, **advantage))
    return info.value.errors


# ----------------------------------------------------------------------------- opo


def test_opo_baseline_weights_each_reward_by_its_length():
    # baseline = (2*1 + 4*0 + 2*0) / (2 + 4 + 2) = 0.25
    groups = [group([{"reward": 1.0, "num_tokens": 2}, {"reward": 0.0, "num_tokens": 4},
                     {"reward": 0.0, "num_tokens": 2}])]
    assert scalars(groups, "opo") == [0.75, -0.25, -0.25]


def test_opo_length_counts_only_mask_one_tokens():
    # lengths are the mask-1 counts [2, 2], not num_tokens [4, 2]: baseline 0.5
    masked = [group([{"reward": 1.0, "num_tokens": 4, "mask": [1, 0, 0, 1]},
                     {"reward": 0.0, "num_tokens": 2}])]
    assert scalars(masked, "opo") == [0.5, -0.5]
    # without the mask: baseline (4*1 + 2*0) / 6 = 2/3
    plain = [group([{"reward": 1.0, "num_tokens": 4}, {"reward": 0.0, "num_tokens": 2}])]
    assert scalars(plain, "opo") == approx([1 / 3, -2 / 3])


def test_opo_without_token_counts_falls_back_to_the_group_mean():
    assert scalars(scalar_groups([[1.0, 0.0, 0.0, 0.0]]), "opo") == [0.75, -0.25, -0.25, -0.25]


def test_opo_singleton_keeps_r_under_verl_and_gets_zero_under_rewardd():
    groups = [group([{"reward": 0.75, "num_tokens": 3}])]
    assert scalars(groups, "opo", profile="verl") == [0.75]
    assert scalars(groups, "opo", profile="rewardd") == [0.0]


def test_opo_zero_spread_group_gets_exact_zeros():
    groups = [group([{"reward": 0.1, "num_tokens": n} for n in (1, 2, 3)])]
    assert all(is_plus_zero(a) for a in scalars(groups, "opo"))


# ----------------------------------------------------------------------------- gpg


def test_gpg_alpha_counts_rollouts_of_groups_with_spread_under_rewardd():
    # B = 8 included rollouts; only g0's 4 carry signal: alpha = 8 / 4 = 2
    # g0: 2 * (r - 0.25) = [1.5, -0.5, -0.5, -0.5]; g1 has zero spread -> 0
    resp = run(scalar_groups([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), estimator="gpg",
               output="scalar")
    assert [r["advantages"] for r in rollouts(resp)] == [1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]
    assert resp["report"]["gpg"] == {"alpha": 2.0, "batch_size": 8, "valid": 4,
                                     "count": "spread"}


def test_gpg_alpha_counts_nonzero_rewards_under_verl_like_verl():
    # verl: alpha = bsz / count_nonzero(scores) = 8 / 5 = 1.6; g0: 1.6 * (r - 0.25)
    resp = run(scalar_groups([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), estimator="gpg",
               output="scalar", profile="verl")
    got = [r["advantages"] for r in rollouts(resp)]
    assert got == approx([1.6 * 0.75, -1.6 * 0.25, -1.6 * 0.25, -1.6 * 0.25, 0, 0, 0, 0])
    assert resp["report"]["gpg"]["count"] == "reward"


def test_gpg_count_param_overrides_the_profile():
    got = scalars(scalar_groups([[1.0, 0.0], [0.0, 0.0]]), "gpg", params={"count": "reward"})
    assert got == [2.0, -2.0, 0.0, 0.0]  # alpha = 4 / 1, r - mean = +-0.5


def test_gpg_batch_without_signal_gets_zero_and_alpha_b():
    resp = run(scalar_groups([[0.0, 0.0], [1.0, 1.0]]), estimator="gpg", output="scalar")
    assert all(is_plus_zero(r["advantages"]) for r in rollouts(resp))
    assert resp["report"]["gpg"]["alpha"] == 4.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.integers(-8, 8).map(lambda k: k / 4), min_size=2, max_size=6),
                min_size=1, max_size=4), st.sampled_from(PROFILES))
def test_property_gpg_sums_to_zero_in_every_group(groups, profile):
    if profile == "openrlhf":
        groups = [g[:2] for g in groups]  # contiguous blocks of equal size
    got = scalars(scalar_groups(groups), "gpg", profile=profile)
    i = 0
    for g in groups:
        assert abs(math.fsum(got[i:i + len(g)])) < 1e-9
        i += len(g)


# ----------------------------------------------------------------------------- remax


def test_remax_baseline_is_the_greedy_reward_and_greedy_gets_zero():
    groups = [group([{"reward": 0.5, "greedy": True}, {"reward": 1.0}, {"reward": 0.0},
                     {"reward": 0.25}])]
    got = scalars(groups, "remax")
    assert got == [0.0, 0.5, -0.5, -0.25]
    assert is_plus_zero(got[0])


def test_remax_without_a_greedy_rollout_is_a_422_naming_remax():
    [err] = invalid(scalar_groups([[1.0, 0.0]]), estimator="remax", output="scalar")
    assert err["loc"] == ["body", "groups", 0, "rollouts"]
    assert "remax" in err["msg"] and "greedy" in err["msg"]


def test_remax_with_two_greedy_rollouts_is_a_422():
    groups = [group([{"reward": 1.0, "greedy": True}, {"reward": 0.0, "greedy": True}])]
    [err] = invalid(groups, estimator="remax", output="scalar")
    assert "exactly one" in err["msg"]


def test_remax_group_whose_greedy_rollout_failed_gets_zero_and_a_report_entry():
    groups = [group([{"rewards": {"acc": None}, "greedy": True}, {"rewards": {"acc": 1.0}}],
                    "lost"),
              group([{"rewards": {"acc": 0.5}, "greedy": True}, {"rewards": {"acc": 1.0}}],
                    "kept")]
    resp = run(groups, estimator="remax", output="scalar")
    assert [r["advantages"] for r in rollouts(resp)] == [0.0, 0.0, 0.0, 0.5]
    assert resp["report"]["remax"] == {"no_baseline": ["lost"]}


# ----------------------------------------------------------------------------- reinforce_pp


def test_reinforce_pp_returns_add_token_rewards_and_the_outcome_at_the_last_token():
    # r = token_rewards + [0, 0, outcome 1] = [0.5, 0, 0.75]; gamma 1: G = [1.25, 0.75, 0.75]
    groups = [group([{"reward": 1.0, "num_tokens": 3, "token_rewards": [0.5, 0.0, -0.25]}])]
    assert dense(groups, "reinforce_pp", params={"whiten": False}) == [[1.25, 0.75, 0.75]]
    assert dense_returns(groups, "reinforce_pp") == [[1.25, 0.75, 0.75]]


def test_reinforce_pp_discounts_right_to_left():
    # r = [0.5, 0, 0.75], gamma 0.5: G2 = 0.75, G1 = 0.375, G0 = 0.5 + 0.1875 = 0.6875
    groups = [group([{"reward": 1.0, "num_tokens": 3, "token_rewards": [0.5, 0.0, -0.25]}])]
    got = dense(groups, "reinforce_pp", params={"whiten": False, "gamma": 0.5})
    assert got == [[0.6875, 0.375, 0.75]]


def test_reinforce_pp_subtracts_kl_coef_times_kl():
    # r = [0.5 - 0.5*1, 0 - 0.5*0.5, -0.25 - 0.5*2 + 1] = [0, -0.25, -0.25]; G = [-0.5, -0.5, -0.25]
    groups = [group([{"reward": 1.0, "num_tokens": 3, "token_rewards": [0.5, 0.0, -0.25],
                      "kl": [1.0, 0.5, 2.0]}])]
    got = dense(groups, "reinforce_pp", params={"whiten": False, "kl_coef": 0.5})
    assert got == [[-0.5, -0.5, -0.25]]
    # kl_coef 0 (the default) ignores the sent kl
    assert dense(groups, "reinforce_pp", params={"whiten": False}) == [[1.25, 0.75, 0.75]]


def test_reinforce_pp_carries_the_return_across_a_mask_zero_span():
    # mask-0 tokens add no reward and no discount: the same as the rollout without them
    with_span = [group([{"reward": 1.0, "num_tokens": 5, "mask": [1, 1, 0, 0, 1],
                         "token_rewards": [0.5, 0.0, 7.0, -3.0, -0.25]}])]
    without = [group([{"reward": 1.0, "num_tokens": 3, "token_rewards": [0.5, 0.0, -0.25]}])]
    params = {"whiten": False, "gamma": 0.5}
    [a] = dense(with_span, "reinforce_pp", params=params)
    [b] = dense(without, "reinforce_pp", params=params)
    assert [a[0], a[1], a[4]] == b == [0.6875, 0.375, 0.75]
    assert is_plus_zero(a[2]) and is_plus_zero(a[3])
    [ret] = dense_returns(with_span, "reinforce_pp", params=params)
    assert ret == [0.6875, 0.375, 0.0, 0.0, 0.75]


TWO_ROLLOUTS = [group([{"reward": 1.0, "num_tokens": 2}, {"reward": 0.0, "num_tokens": 2}])]


def test_reinforce_pp_verl_whitening_uses_unbiased_var_inside_rsqrt():
    # G = [1, 1 | 0, 0]; mean 0.5; unbiased var = 4 * 0.25 / 3 = 1/3
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    assert dense(TWO_ROLLOUTS, "reinforce_pp", profile="verl") == approx([[a, a], [-a, -a]])


def test_reinforce_pp_openrlhf_whitening_uses_biased_var_clamped_at_1e_8():
    # biased var = 0.25: (G - mean) * rsqrt(max(var, 1e-8))
    a = 0.5 / math.sqrt(max(0.25, 1e-8))
    assert dense(TWO_ROLLOUTS, "reinforce_pp", profile="openrlhf") == approx([[a, a], [-a, -a]])


def test_reinforce_pp_is_not_whitened_under_trl_and_whitened_under_rewardd():
    assert dense(TWO_ROLLOUTS, "reinforce_pp", profile="trl") == [[1.0, 1.0], [0.0, 0.0]]
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    assert dense(TWO_ROLLOUTS, "reinforce_pp", profile="rewardd") == approx([[a, a], [-a, -a]])


def test_reinforce_pp_whiten_param_overrides_the_profile_and_keeps_its_whitening_pins():
    assert dense(TWO_ROLLOUTS, "reinforce_pp", profile="rewardd",
                 params={"whiten": False}) == [[1.0, 1.0], [0.0, 0.0]]
    # trl does not whiten reinforce_pp; asked to, it whitens the 4 tokens as verl does
    how = pins_for("trl").whitening_for("reinforce_pp")
    var = 4 * 0.25 / (4 - how.ddof)
    a = 0.5 / math.sqrt(var + how.eps)
    assert dense(TWO_ROLLOUTS, "reinforce_pp", profile="trl",
                 params={"whiten": True}) == approx([[a, a], [-a, -a]])


def test_reinforce_pp_excluded_rollout_gets_zero_and_stays_out_of_the_whitening():
    groups = [group([{"rewards": {"acc": 1.0}, "num_tokens": 2},
                     {"rewards": {"acc": None}, "num_tokens": 3},
                     {"rewards": {"acc": 0.0}, "num_tokens": 2}])]
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)  # the same four tokens as TWO_ROLLOUTS
    got = dense(groups, "reinforce_pp", profile="verl")
    assert got == approx([[a, a], [0.0, 0.0, 0.0], [-a, -a]])
    assert all(is_plus_zero(x) for x in got[1])


def test_reinforce_pp_scalar_output_of_varying_advantages_is_a_422():
    groups = [group([{"reward": 1.0, "num_tokens": 2, "token_rewards": [1.0, 0.0]}])]
    [err] = invalid(groups, estimator="reinforce_pp", output="scalar", params={"whiten": False})
    assert err["loc"] == ["body", "advantage", "output"]


# ------------------------------------------------------------------- reinforce_pp_baseline


# a = r - mean = [0.5, -0.5], broadcast over [2, 1] tokens: [0.5, 0.5 | -0.5]
# token mean 1/6, centred [1/3, 1/3 | -2/3], sum of squares 2/3
BASELINE_GROUPS = [group([{"reward": 1.0, "num_tokens": 2}, {"reward": 0.0, "num_tokens": 1}])]


def test_reinforce_pp_baseline_verl_whitens_tokens_with_unbiased_var_and_rsqrt():
    s = 1 / math.sqrt(2 / 3 / 2 + 1e-8)  # unbiased var = (2/3) / (3 - 1)
    got = dense(BASELINE_GROUPS, "reinforce_pp_baseline", profile="verl")
    assert got == approx([[s / 3, s / 3], [-2 * s / 3]])


def test_reinforce_pp_baseline_openrlhf_whitens_with_biased_var_clamped_at_1e_8():
    d = math.sqrt(max(2 / 3 / 3, 1e-8))  # biased var = (2/3) / 3
    got = dense(BASELINE_GROUPS, "reinforce_pp_baseline", profile="openrlhf")
    assert got == approx([[1 / 3 / d, 1 / 3 / d], [-2 / 3 / d]])


def test_reinforce_pp_baseline_is_not_whitened_under_trl():
    assert scalars(BASELINE_GROUPS, "reinforce_pp_baseline", profile="trl") == [0.5, -0.5]


def test_reinforce_pp_baseline_whiten_false_is_dr_grpo_with_exact_zero_spread():
    groups = scalar_groups([[1.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1]])
    got = scalars(groups, "reinforce_pp_baseline", params={"whiten": False})
    assert got == [0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0]


def test_reinforce_pp_baseline_without_token_counts_whitens_over_rollouts():
    # a = [0.75, -0.25, -0.25, -0.25], mean 0, unbiased var = 0.75 / 3 = 0.25
    s = 1 / math.sqrt(0.25 + 1e-8)
    got = scalars(scalar_groups([[1.0, 0.0, 0.0, 0.0]]), "reinforce_pp_baseline")
    assert got == approx([0.75 * s, -0.25 * s, -0.25 * s, -0.25 * s])


def test_reinforce_pp_baseline_weighs_rollouts_by_mask_one_tokens_only():
    # the first rollout's mask keeps 1 of its 3 tokens: the same statistics as one token each
    masked = [group([{"reward": 1.0, "num_tokens": 3, "mask": [0, 1, 0]},
                     {"reward": 0.0, "num_tokens": 1}])]
    s = 1 / math.sqrt(0.5 + 1e-8)  # tokens [0.5, -0.5], unbiased var 0.5
    got = dense(masked, "reinforce_pp_baseline", profile="verl")
    assert got == approx([[0.0, 0.5 * s, 0.0], [-0.5 * s]])
    assert is_plus_zero(got[0][0]) and is_plus_zero(got[0][2])


def test_reinforce_pp_baseline_verl_singleton_keeps_r_before_whitening():
    # g1's lone rollout keeps 1.0 (verl's mean 0); tokens [0.5, -0.5, 1.0], mean 1/3,
    # centred [1/6, -5/6, 2/3], unbiased var = (1/36 + 25/36 + 16/36) / 2 = 7/12
    groups = scalar_groups([[1.0, 0.0], [1.0]])
    for g in groups:
        for r in g["rollouts"]:
            r["num_tokens"] = 1
    s = 1 / math.sqrt(7 / 12 + 1e-8)
    got = scalars(groups, "reinforce_pp_baseline", profile="verl")
    assert got == approx([s / 6, -5 * s / 6, 2 * s / 3])


# ----------------------------------------------------------------------------- gae


# V = [0.5, 0.25, 1.0], outcome 1 at the last token
GAE_ROLLOUT = {"reward": 1.0, "num_tokens": 3, "values": [0.5, 0.25, 1.0]}


def test_gae_golden_with_gamma_and_lambda_one_is_return_minus_value():
    # delta = [0 + 0.25 - 0.5, 0 + 1 - 0.25, 1 + 0 - 1] = [-0.25, 0.75, 0]
    # A = [0.5, 0.75, 0] (= G - V with G = 1); returns = A + V = [1, 1, 1]
    resp = run([group([GAE_ROLLOUT])], estimator="gae", output="dense")
    [r] = rollouts(resp)
    assert [float(x) for x in r["advantages"]] == [0.5, 0.75, 0.0]
    assert [float(x) for x in r["returns"]] == [1.0, 1.0, 1.0]


def test_gae_golden_with_gamma_and_lambda_one_half():
    # delta0 = 0.5*0.25 - 0.5 = -0.375, delta1 = 0.5*1 - 0.25 = 0.25, delta2 = 1 - 1 = 0
    # A2 = 0, A1 = 0.25, A0 = -0.375 + 0.25 * 0.25 = -0.3125; returns = [0.1875, 0.5, 1]
    params = {"gamma": 0.5, "lam": 0.5}
    assert dense([group([GAE_ROLLOUT])], "gae", params=params) == [[-0.3125, 0.25, 0.0]]
    assert dense_returns([group([GAE_ROLLOUT])], "gae", params=params) == [[0.1875, 0.5, 1.0]]


def test_gae_carries_values_and_advantages_across_a_mask_zero_span():
    span = {"reward": 1.0, "num_tokens": 5, "mask": [1, 0, 0, 1, 1],
            "values": [0.5, 9.0, -9.0, 0.25, 1.0], "token_rewards": [0.0, 5.0, 5.0, 0.0, 0.0]}
    params = {"gamma": 0.5, "lam": 0.5}
    [a] = dense([group([span])], "gae", params=params)
    assert [a[0], a[3], a[4]] == [-0.3125, 0.25, 0.0]
    assert is_plus_zero(a[1]) and is_plus_zero(a[2])
    [ret] = dense_returns([group([span])], "gae", params=params)
    assert ret == [0.1875, 0.0, 0.0, 0.5, 1.0]


def test_gae_uses_token_rewards_and_kl_like_reinforce_pp():
    # r = [0.5 - 0.5*1, 0, 1]; delta0 = 0 + 0.25 - 0.5 = -0.25 -> A0 = 0.5 as without them
    rollout = {**GAE_ROLLOUT, "token_rewards": [0.5, 0.0, 0.0], "kl": [1.0, 0.0, 0.0]}
    assert dense([group([rollout])], "gae", params={"kl_coef": 0.5}) == [[0.5, 0.75, 0.0]]


def test_gae_missing_values_is_a_422_naming_the_rollout_field_and_gae():
    groups = [group([GAE_ROLLOUT, {"reward": 0.0, "num_tokens": 2}])]
    [err] = invalid(groups, estimator="gae", output="dense")
    assert err["loc"] == ["body", "groups", 0, "rollouts", 1, "values"]
    assert "gae" in err["msg"]


def test_gae_returns_come_back_as_rle_when_output_is_rle():
    span = {"reward": 1.0, "num_tokens": 5, "mask": [1, 1, 0, 0, 1], "values": [0.0] * 5}
    resp = run([group([span])], estimator="gae", output="rle")
    [r] = rollouts(resp)
    assert r["returns"] == {"rle": [[1.0, 2], [0.0, 2], [1.0, 1]]}
    assert r["advantages"] == {"rle": [[1.0, 2], [0.0, 2], [1.0, 1]]}
    assert decode_rle(r["returns"]["rle"]) == [1.0, 1.0, 0.0, 0.0, 1.0]


GAE_TWO = [group([{"reward": 1.0, "num_tokens": 2, "values": [0.0, 0.0]},
                  {"reward": 0.0, "num_tokens": 2, "values": [0.0, 0.0]}])]


def test_gae_is_not_whitened_under_rewardd():
    assert dense(GAE_TWO, "gae", profile="rewardd") == [[1.0, 1.0], [0.0, 0.0]]


def test_gae_verl_whitening_uses_unbiased_var_inside_rsqrt():
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    assert dense(GAE_TWO, "gae", profile="verl") == approx([[a, a], [-a, -a]])
    # returns stay the unwhitened A + V
    assert dense_returns(GAE_TWO, "gae", profile="verl") == [[1.0, 1.0], [0.0, 0.0]]


def test_gae_openrlhf_whitening_uses_biased_var_clamped_at_1e_8():
    a = 0.5 / math.sqrt(max(0.25, 1e-8))
    assert dense(GAE_TWO, "gae", profile="openrlhf") == approx([[a, a], [-a, -a]])


def test_gae_whiten_param_overrides_the_profile():
    assert dense(GAE_TWO, "gae", profile="verl", params={"whiten": False}) == [[1.0, 1.0],
                                                                               [0.0, 0.0]]


# ----------------------------------------------------------------------------- passk


def test_passk_one_correct_of_eight_with_k_4_gives_one_and_minus_a_seventh():
    # rho = 1 - C(7,4)/C(8,4) = 1 - 35/70 = 0.5, s = 0.5
    # a+ = 0.5 / (0.5 + eps); a- = (0.5 - C(6,3)/C(7,3)) / (0.5 + eps) = (0.5 - 4/7) / (...)
    got = scalars(scalar_groups([[1.0] + [0.0] * 7]), "passk", params={"k": 4})
    assert got == approx([0.5 / (0.5 + 1e-6)] + [(0.5 - 4 / 7) / (0.5 + 1e-6)] * 7)
    assert [round(a, 4) for a in got] == [1.0] + [-0.1429] * 7
    assert abs(math.fsum(got)) < TIGHT


def test_passk_with_k_1_is_grpo_with_the_population_std():
    # p = 1/4, population std = sqrt(p (1 - p)); a = (r - p) / (std + eps)
    std = math.sqrt(0.25 * 0.75)
    got = scalars(scalar_groups([[0.0, 1.0, 0.0, 0.0]]), "passk")
    assert got == approx([-0.25 / (std + 1e-6), 0.75 / (std + 1e-6), -0.25 / (std + 1e-6),
                          -0.25 / (std + 1e-6)])


def test_passk_threshold_makes_scores_binary():
    # correct = reward >= 0.5: [1, 0, 1, 0]; n = 4, c = 2, k = 2
    # rho = 1 - C(2,2)/C(4,2) = 5/6, s = sqrt(5/36); a+ = (1/6)/(s+eps)
    # a- = (1/6 - C(1,1)/C(3,1)) / (s+eps) = (-1/6) / (s+eps)
    s = math.sqrt(5 / 36) + 1e-6
    got = scalars(scalar_groups([[0.7, 0.2, 0.9, 0.4]]), "passk", params={"k": 2})
    assert got == approx([1 / 6 / s, -1 / 6 / s, 1 / 6 / s, -1 / 6 / s])
    got = scalars(scalar_groups([[0.7, 0.2, 0.9, 0.4]]), "passk",
                  params={"k": 2, "threshold": 0.8})
    assert got[2] > 0 and got[0] < 0  # only 0.9 is correct now


@pytest.mark.parametrize("rewards", ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0], [0.0]))
def test_passk_group_without_both_outcomes_gets_exact_zeros(rewards):
    got = scalars(scalar_groups([rewards]), "passk", params={"k": 2})
    assert all(is_plus_zero(a) for a in got)


def test_passk_k_larger_than_the_group_is_clipped_to_n_and_reported():
    # k = n: every k-subset is the whole group, rho = 1 for c >= 1 -> all 0
    resp = run(scalar_groups([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]), estimator="passk",
               output="scalar", params={"k": 4})
    got = [r["advantages"] for r in rollouts(resp)]
    assert got[:3] == [0.0, 0.0, 0.0]
    # g1: n = 5, c = 1, k = 4: rho = 1 - C(4,4)/C(5,4) = 0.8, s = 0.4
    # a+ = 0.2 / s, a- = (0.2 - C(3,3)/C(4,3)) / s = -0.05 / s
    assert got[3:] == approx([0.2 / 0.400001] + [-0.05 / 0.400001] * 4)
    assert resp["report"]["passk"] == {"clipped_k_groups": 1}


def test_passk_excluded_rollouts_are_not_counted_in_n_or_c():
    groups = [group([{"rewards": {"acc": 1.0}}, {"rewards": {"acc": None}},
                     {"rewards": {"acc": 0.0}}])]
    # n = 2, c = 1, k = 1: p = 0.5, std 0.5
    assert scalars(groups, "passk") == approx([0.5 / 0.500001, 0.0, -0.5 / 0.500001])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=12), min_size=1,
                max_size=4), st.integers(1, 14))
def test_property_passk_sums_to_zero_in_every_group(groups, k):
    got = scalars(scalar_groups(groups), "passk", params={"k": k})
    i = 0
    for g in groups:
        part = got[i:i + len(g)]
        i += len(g)
        assert abs(math.fsum(part)) <= 1e-9 * max(1.0, max(abs(a) for a in part))


# ----------------------------------------------------------------------------- grpo_passk


def test_grpo_passk_credits_only_the_best_rollout_by_its_margin_over_the_second():
    rewards = [0.25, 1.0, 0.5, 0.0]
    mean = sum(rewards) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3)
    got = scalars(scalar_groups([rewards]), "grpo_passk")
    assert got == approx([0.0, (1.0 - 0.5) / (std + 1e-6), 0.0, 0.0])
    assert scalars(scalar_groups([rewards]), "grpo_passk",
                   params={"norm_by_std": False}) == [0.0, 0.5, 0.0, 0.0]


@pytest.mark.parametrize("rewards", ([1.0, 0.0, 1.0], [0.5, 0.5], [1.0]))
def test_grpo_passk_ties_at_the_top_and_singletons_give_exact_zeros(rewards):
    got = scalars(scalar_groups([rewards]), "grpo_passk")
    assert all(is_plus_zero(a) for a in got)


def test_grpo_passk_ignores_excluded_rollouts():
    groups = [group([{"rewards": {"acc": 0.0}}, {"rewards": {"acc": None}},
                     {"rewards": {"acc": 1.0}}])]
    std = math.sqrt(0.5)  # unbiased std of [0, 1]
    assert scalars(groups, "grpo_passk") == approx([0.0, 0.0, 1.0 / (std + 1e-6)])


# ----------------------------------------------------------------------------- shared behaviour


MASKED = {"num_tokens": 4, "mask": [1, 0, 1, 0], "values": [0.5, 0.5, 0.25, 0.75],
          "token_rewards": [0.25, 1.0, 0.0, 1.0]}
ALL_NEW = ("opo", "gpg", "remax", "reinforce_pp", "reinforce_pp_baseline", "gae", "passk",
           "grpo_passk")


def masked_batch() -> list[dict[str, Any]]:
    return [group([{**MASKED, "reward": 1.0, "greedy": True}, {**MASKED, "reward": 0.0},
                   {**MASKED, "reward": 0.5}, {**MASKED, "rewards": {"reward": None}}])]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("estimator", ALL_NEW)
def test_masked_tokens_and_excluded_rollouts_are_exactly_plus_zero(estimator, profile):
    resp = run(masked_batch(), estimator=estimator, profile=profile, output="dense")
    got = [[float(x) for x in r["advantages"]] for r in rollouts(resp)]
    for values in got:
        assert is_plus_zero(values[1]) and is_plus_zero(values[3])
    assert all(is_plus_zero(x) for x in got[3])
    assert any(x != 0 for values in got for x in values)


@pytest.mark.parametrize("estimator", ALL_NEW)
def test_rle_decodes_bit_for_bit_to_dense(estimator):
    d = run(masked_batch(), estimator=estimator, output="dense")
    r = run(masked_batch(), estimator=estimator, output="rle")
    for rd, rr in zip(rollouts(d), rollouts(r)):
        assert [bits(x) for x in decode_rle(rr["advantages"]["rle"])] == \
               [bits(float(x)) for x in rd["advantages"]]


def test_catalogue_lists_every_new_entry_with_documented_params():
    entries = {e.name: e for e in list_estimators("estimator")}
    assert set(ALL_NEW) <= set(entries)
    params = {name: {p.name: p.default for p in entries[name].params} for name in ALL_NEW}
    assert params["reinforce_pp"] == {"gamma": 1.0, "holes": None, "kl_coef": 0.0,
                                      "whiten": None, "no_std_norm": False, "clip_range": None}
    assert params["gae"] == {"gamma": 1.0, "holes": None, "kl_coef": 0.0, "whiten": None,
                             "lam": 1.0, "no_std_norm": False, "clip_range": None}
    assert params["passk"] == {"k": 1, "threshold": 0.5, "eps": None}
    assert params["gpg"] == {"count": None}
    assert entries["gae"].inputs == ["rewards", "values"]
    assert entries["remax"].inputs == ["rewards", "greedy"]
    for name in ALL_NEW:
        assert entries[name].description and entries[name].formula
        assert all(p.description for p in entries[name].params)


# ----------------------------------------------------------------------------- properties


def reference_scan(rewards: list[float], values: list[float], mask: list[int], outcome: float,
                   gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """The documented rule, token by token: (reinforce_pp returns, gae advantages)."""
    kept = [t for t, m in enumerate(mask) if m]
    r = [rewards[t] for t in kept]
    if kept:
        r[-1] += outcome
    v = [values[t] for t in kept]
    g_out, a_out = [0.0] * len(mask), [0.0] * len(mask)
    g = a = v_next = 0.0
    for j in reversed(range(len(kept))):
        g = r[j] + gamma * g
        a = r[j] + gamma * v_next - v[j] + gamma * lam * a
        v_next = v[j]
        g_out[kept[j]], a_out[kept[j]] = g, a
    return g_out, a_out


@st.composite
def token_rollouts(draw: Any) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 30))
        small = st.integers(-8, 8).map(lambda k: k / 4)
        out.append({"reward": draw(small), "num_tokens": n,
                    "mask": draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)),
                    "token_rewards": draw(st.lists(small, min_size=n, max_size=n)),
                    "values": draw(st.lists(small, min_size=n, max_size=n))})
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(token_rollouts(), st.sampled_from([1.0, 0.5, 0.99, 0.0]),
       st.sampled_from([1.0, 0.5, 0.95, 0.0]))
def test_property_reinforce_pp_and_gae_match_the_token_by_token_rule(rolls, gamma, lam):
    groups = [group(rolls)]
    ret = dense(groups, "reinforce_pp", params={"gamma": gamma, "whiten": False})
    adv = dense(groups, "gae", params={"gamma": gamma, "lam": lam, "whiten": False})
    for roll, got_g, got_a in zip(rolls, ret, adv):
        want_g, want_a = reference_scan(roll["token_rewards"], roll["values"], roll["mask"],
                                        roll["reward"], gamma, lam)
        assert got_g == pytest.approx(want_g, abs=1e-9, rel=1e-12)
        assert got_a == pytest.approx(want_a, abs=1e-9, rel=1e-12)
        assert all(is_plus_zero(x) for x, m in zip(got_a, roll["mask"]) if not m)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(-8, 8).map(lambda k: k / 4), st.integers(0, 9)),
                min_size=2, max_size=8))
def test_property_opo_length_weighted_advantages_sum_to_zero(rows):
    groups = [group([{"reward": r, "num_tokens": n} for r, n in rows])]
    got = scalars(groups, "opo")
    lengths = [n for _, n in rows]
    if sum(lengths) == 0:
        assert abs(math.fsum(got)) < 1e-12  # plain-mean fallback
    else:
        assert abs(math.fsum(n * a for n, a in zip(lengths, got))) < 1e-9


def test_reinforce_pp_long_rollout_with_gamma_below_one_stays_finite_and_exact():
    # one reward of 1 at the end of 4096 tokens: G_t = 0.99 ** (4095 - t), never overflowing
    n = 4096
    groups = [group([{"reward": 1.0, "num_tokens": n}])]
    [got] = dense(groups, "reinforce_pp", params={"gamma": 0.99, "whiten": False})
    assert got[-1] == 1.0
    assert got[0] == pytest.approx(0.99 ** (n - 1), rel=1e-12)
    assert got[2048] == pytest.approx(0.99 ** (n - 1 - 2048), rel=1e-12)


@pytest.mark.parametrize("size", (0, 1, 63, 64, 65, 5000, 300_000))
def test_reverse_scan_matches_the_sequential_recursion_across_block_boundaries(size):
    # segments of random length (decay 0 ends one), long enough to cross blocks of 64 and
    # to make the block starts themselves need a second level of blocks
    gen = torch.Generator().manual_seed(size)
    x = torch.randn(size, generator=gen, dtype=torch.float64)
    decay = torch.full((size,), 0.99, dtype=torch.float64)
    decay[torch.rand(size, generator=gen) < 0.001] = 0.0
    want, carry = [0.0] * size, 0.0
    for k, (xk, dk) in enumerate(zip(reversed(x.tolist()), reversed(decay.tolist()))):
        carry = xk + dk * carry
        want[size - 1 - k] = carry
    assert reverse_scan(x, decay).tolist() == pytest.approx(want, abs=1e-9, rel=1e-12)


def test_gae_under_trl_is_whitened_as_its_ppo_trainer_does():
    # TRL's PPOTrainer whitens GAE advantages: unbiased var, (x - mean) * rsqrt(var + 1e-8)
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    assert dense(GAE_TWO, "gae", profile="trl") == approx([[a, a], [-a, -a]])
