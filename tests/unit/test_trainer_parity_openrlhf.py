"""Issue 16, items 2 and 4: mask holes per profile, and OpenRLHF's clip_range, per-token KL
on group estimators and no_std_norm.

Golden values are OpenRLHF's (and verl's) formulas written out by hand on small inputs;
tests/trainers/test_openrlhf.py and test_verl.py run the trainers' own code on random batches.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardd.advantages import compute_advantages
from rewardd.advantages.errors import RequestInvalid


def rollout(i: int, reward: float, n: int, **fields: Any) -> dict[str, Any]:
    return {"rollout_id": f"r{i}", "reward": reward, "num_tokens": n, **fields}


def dense(groups: list[list[dict[str, Any]]], estimator: str, profile: str,
          params: dict[str, Any] | None = None, key: str = "advantages") -> list[list[float]]:
    body = {"groups": [{"group_id": f"g{gi}", "rollouts": g} for gi, g in enumerate(groups)],
            "advantage": {"estimator": estimator, "profile": profile, "params": params or {},
                          "output": "dense"}}
    out = compute_advantages(body)
    return [[float(v) for v in r[key]] for g in out["groups"] for r in g["rollouts"]]


def close(got: list[list[float]], expected: list[list[float]], **tolerance: float) -> bool:
    """Row lengths equal and every value within ``tolerance`` (pytest.approx's keywords)."""
    assert [len(r) for r in got] == [len(r) for r in expected], (got, expected)
    return [v for r in got for v in r] == pytest.approx([v for r in expected for v in r],
                                                        **tolerance)


# ---- item 2: mask holes -----------------------------------------------------------------

HOLED = [[rollout(0, 1.0, 3, mask=[1, 0, 1], values=[0.5, 9.0, 0.25])]]


def test_reinforce_holes_are_discounted_steps_under_openrlhf_and_reset_under_verl():
    # OpenRLHF get_cumulative_returns over positions 0..2, rewards [0, 0, 1] (hole masked):
    # G2 = 1, G1 = .5, G0 = .25; verl (b178a3c) resets the return at the hole: G0 = 0;
    # verl 0.9.1 (holes: carry) carries across it: G0 = .5 (one step)
    params = {"gamma": 0.5, "whiten": False}
    assert dense(HOLED, "reinforce", "openrlhf", params) == [[0.25, 0.0, 1.0]]
    assert dense(HOLED, "reinforce_plus_plus", "verl", params) == [[0.0, 0.0, 1.0]]
    assert dense(HOLED, "reinforce_plus_plus", "verl", {**params, "holes": "carry"}) == \
        [[0.5, 0.0, 1.0]]
    assert dense(HOLED, "reinforce_pp", "rewardd", params) == [[0.5, 0.0, 1.0]]
    assert dense(HOLED, "reinforce_pp", "trl", params) == [[0.5, 0.0, 1.0]]


def test_gae_holes_are_steps_with_reward_and_value_0_under_openrlhf():
    params = {"gamma": 0.5, "lam": 1.0, "whiten": False}
    # OpenRLHF: V = [.5, 0, .25] (masked), r = [0, 0, 1]
    # delta2 = 1 - .25 = .75; delta1 = .5 * .25 - 0 = .125; delta0 = .5 * 0 - .5 = -.5
    # A2 = .75, A1 = .125 + .5 * .75 = .5, A0 = -.5 + .5 * .5 = -.25
    assert dense(HOLED, "gae", "openrlhf", params) == [[-0.25, 0.0, 0.75]]
    # verl skips the observation token: delta0 = .5 * .25 - .5 = -.375, A0 = -.375 + .375 = 0
    assert dense(HOLED, "gae", "verl", params) == [[0.0, 0.0, 0.75]]
    lam_half = {"gamma": 0.5, "lam": 0.5, "whiten": False}
    # A1 = .125 + .25 * .75 = .3125, A0 = -.5 + .25 * .3125 = -.421875
    assert dense(HOLED, "gae", "openrlhf", lam_half) == [[-0.421875, 0.0, 0.75]]


def test_trailing_mask_0_tokens_are_not_steps_under_either_rule():
    tail = [[rollout(0, 1.0, 3, mask=[1, 1, 0])]]
    params = {"gamma": 0.5, "whiten": False}
    assert dense(tail, "reinforce", "openrlhf", params) == [[0.5, 1.0, 0.0]]
    assert dense(tail, "reinforce_plus_plus", "verl", params) == [[0.5, 1.0, 0.0]]


def test_openrlhf_whitening_counts_mask_1_tokens_only():
    # gamma 1: returns [1, 1, 1] on positions, 1 on both mask-1 tokens; and r = -1 for the
    # second rollout's one token: mask-1 values [1, 1, -1], mean 1/3, biased var 8/9
    groups = [[rollout(0, 1.0, 3, mask=[1, 0, 1]), rollout(1, -1.0, 1)]]
    got = dense(groups, "reinforce", "openrlhf", {"gamma": 0.99999})
    scale = (8 / 9) ** -0.5
    assert got[0][0] == pytest.approx((0.99999 ** 2 - 1 / 3) * scale, abs=1e-4)
    exact = dense(groups, "reinforce", "openrlhf")
    assert close(exact, [[(1 - 1 / 3) * scale, 0.0, (1 - 1 / 3) * scale],
                         [(-1 - 1 / 3) * scale]], rel=1e-12)


# ---- item 4: per-token KL on group estimators -------------------------------------------

KL_GROUP = [[rollout(0, 1.0, 2, kl=[0.1, 0.2]), rollout(1, 0.0, 2, kl=[0.3, 0.4])]]


def test_kl_coef_on_dr_grpo_subtracts_the_kl_ahead_of_each_token():
    # OpenRLHF: shaped r = [.5, -.5] at the last token, -kl_coef * kl per token, cumulative
    got = dense(KL_GROUP, "dr_grpo", "openrlhf", {"kl_coef": 0.5})
    assert close(got, [[0.5 - 0.5 * 0.3, 0.5 - 0.5 * 0.2],
                       [-0.5 - 0.5 * 0.7, -0.5 - 0.5 * 0.4]], rel=1e-15)


@pytest.mark.parametrize("estimator, shaped", [
    ("group_norm", [0.5 / (2 ** -0.5 + 1e-9), -0.5 / (2 ** -0.5 + 1e-9)]),
    ("rloo", [1.0, -1.0]),
    ("dr_grpo", [0.5, -0.5]),
])
def test_kl_coef_on_each_group_estimator(estimator, shaped):
    got = dense(KL_GROUP, estimator, "openrlhf", {"kl_coef": 2.0})
    assert close(got, [[shaped[0] - 0.6, shaped[0] - 0.4],
                       [shaped[1] - 1.4, shaped[1] - 0.8]], rel=1e-12)


def test_kl_coef_on_reinforce_baseline_comes_before_the_whitening():
    got = dense(KL_GROUP, "reinforce_baseline", "openrlhf", {"kl_coef": 1.0})
    tokens = [0.5 - 0.3, 0.5 - 0.2, -0.5 - 0.7, -0.5 - 0.4]
    mean = sum(tokens) / 4
    scale = (sum((t - mean) ** 2 for t in tokens) / 4) ** -0.5  # OpenRLHF: biased variance
    assert close(got, [[(t - mean) * scale for t in tokens[:2]],
                       [(t - mean) * scale for t in tokens[2:]]], rel=1e-12)


def test_kl_on_holes_and_excluded_rollouts_counts_nothing():
    groups = [[rollout(0, 1.0, 3, kl=[0.1, 5.0, 0.2], mask=[1, 0, 1]),
               rollout(1, 0.0, 1, kl=[0.4]),
               {"rollout_id": "r2", "rewards": {"reward": None}, "num_tokens": 1, "kl": [9.0]}]]
    got = dense(groups, "dr_grpo", "openrlhf", {"kl_coef": 1.0})
    assert close(got, [[0.5 - 0.3, 0.0, 0.5 - 0.2], [-0.5 - 0.4], [0.0]], rel=1e-12)


def test_kl_coef_without_kl_is_a_422_at_kl_coef():
    with pytest.raises(RequestInvalid) as caught:
        dense([[rollout(0, 1.0, 1), rollout(1, 0.0, 1)]], "rloo", "openrlhf", {"kl_coef": 0.1})
    [err] = caught.value.errors
    assert err["loc"] == ["body", "advantage", "params", "kl_coef"] and "kl" in err["msg"]


def test_kl_coef_0_keeps_one_value_per_rollout():
    body = {"groups": [{"group_id": "g", "rollouts": KL_GROUP[0]}],
            "advantage": {"estimator": "rloo", "profile": "openrlhf", "output": "scalar"}}
    out = compute_advantages(body)
    assert [r["advantages"] for r in out["groups"][0]["rollouts"]] == [1.0, -1.0]


# ---- item 4: clip_range -------------------------------------------------------------------

def scalars(rewards: list[float], estimator: str, profile: str, params: dict | None = None
            ) -> list[float]:
    return [row[0] for row in dense([[rollout(i, r, 1) for i, r in enumerate(rewards)]],
                                    estimator, profile, params)]


def test_clip_range_clips_the_group_shaped_reward():
    assert scalars([3.0, 0.0], "rloo", "openrlhf", {"clip_range": [-1.0, 2.0]}) == [2.0, -1.0]
    assert scalars([3.0, 0.0], "dr_grpo", "verl", {"clip_range": [-1.0, 1.0]}) == [1.0, -1.0]


def test_openrlhf_clips_to_minus_10_10_by_default_and_other_profiles_do_not():
    assert scalars([30.0, 0.0], "rloo", "openrlhf") == [10.0, -10.0]
    assert scalars([30.0, 0.0], "rloo", "rewardd") == [30.0, -30.0]
    # group_norm of 129 rollouts, one correct: (1 - 1/129) / std = 11.27 -> 10
    got = scalars([1.0] + [0.0] * 128, "group_norm", "openrlhf")
    assert got[0] == 10.0 and scalars([1.0] + [0.0] * 128, "grpo", "rewardd")[0] > 11


def test_clip_range_on_reinforce_and_gae_clips_the_raw_outcome():
    one = [[rollout(0, 30.0, 2, values=[0.0, 0.0])]]
    assert dense(one, "reinforce", "openrlhf", {"whiten": False}) == [[10.0, 10.0]]
    assert dense(one, "gae", "openrlhf", {"whiten": False, "clip_range": [-1, 2]}) == \
        [[2.0, 2.0]]
    assert dense(one, "reinforce_pp", "verl", {"whiten": False}) == [[30.0, 30.0]]


def test_clip_range_with_lo_not_below_hi_is_a_422():
    with pytest.raises(RequestInvalid) as caught:
        scalars([1.0, 0.0], "rloo", "openrlhf", {"clip_range": [1.0, 1.0]})
    [err] = caught.value.errors
    assert err["loc"][:4] == ["body", "advantage", "params", "clip_range"]
    assert "lo < hi" in err["msg"]


# ---- item 4: no_std_norm ----------------------------------------------------------------

def test_no_std_norm_centres_without_scaling():
    # reinforce_baseline: a = [.5, -.5] on 3 and 1 tokens: token mean .25
    groups = [[rollout(0, 1.0, 3), rollout(1, 0.0, 1)]]
    assert dense(groups, "reinforce_baseline", "openrlhf", {"no_std_norm": True}) == \
        [[0.25] * 3, [-0.75]]
    var = (3 * 0.25 ** 2 + 0.75 ** 2) / 4  # biased, OpenRLHF
    assert close(dense(groups, "reinforce_baseline", "openrlhf"),
                 [[0.25 / var ** 0.5] * 3, [-0.75 / var ** 0.5]], rel=1e-12)
    assert dense(groups, "reinforce", "openrlhf", {"no_std_norm": True}) == \
        [[0.25] * 3, [-0.75]]
    values = [[rollout(0, 1.0, 2, values=[0.5, 0.0])]]
    # gae gamma 1 lam 1: A = G - V = [.5, 1]; centred on .75
    assert dense(values, "gae", "openrlhf", {"no_std_norm": True}) == [[-0.25, 0.25]]


# ---- properties -------------------------------------------------------------------------

@st.composite
def kl_batches(draw: Any) -> list[list[dict[str, Any]]]:
    size = draw(st.integers(2, 5))
    groups = []
    for g in range(draw(st.integers(1, 3))):
        rows = []
        for i in range(size):
            n = draw(st.integers(1, 5))
            inside = draw(st.lists(st.sampled_from([0, 1]), min_size=max(n - 2, 0),
                                   max_size=max(n - 2, 0)))
            mask = [1] + inside + [1] if n > 1 else [1]  # holes inside the response
            rows.append(rollout(g * 10 + i, draw(st.integers(-16, 16)) / 4, n, mask=mask,
                                kl=draw(st.lists(st.integers(-8, 8).map(lambda k: k / 16),
                                                 min_size=n, max_size=n))))
        groups.append(rows)
    return groups


@settings(max_examples=50, deadline=None)
@given(kl_batches(), st.sampled_from(["group_norm", "rloo", "dr_grpo"]), st.integers(-4, 4),
       st.data())
def test_kl_shaping_properties_shift_mask_and_group_order(groups, estimator, shift, data):
    params = {"kl_coef": 0.5, "clip_range": [-1e6, 1e6]}
    base = dense(groups, estimator, "openrlhf", params)
    # group-relative: a shift of every reward changes nothing
    moved = [[{**r, "reward": r["reward"] + shift} for r in g] for g in groups]
    assert close(dense(moved, estimator, "openrlhf", params), base, abs=1e-9)
    # mask-0 tokens are 0, and their kl does not count
    flat = [r for g in groups for r in g]
    for r, got in zip(flat, base):
        assert all(v == 0.0 for v, m in zip(got, r["mask"]) if not m)
    noisy = [[{**r, "kl": [k if m else 7.0 for k, m in zip(r["kl"], r["mask"])]} for r in g]
             for g in groups]
    assert close(dense(noisy, estimator, "openrlhf", params), base, abs=1e-12)
    # permuting a group's rollouts permutes their advantages
    order = data.draw(st.permutations(range(len(groups[0]))))
    swapped = [[groups[0][k] for k in order]] + groups[1:]
    got = dense(swapped, estimator, "openrlhf", params)
    assert close(got[:len(order)], [base[k] for k in order], abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(kl_batches(), st.sampled_from([0.5, 0.9, 1.0]))
def test_holes_rule_openrlhf_equals_carry_rule_once_holes_become_zero_reward_steps(groups,
                                                                                  gamma):
    """Under openrlhf a hole is a step with reward 0: the same numbers as the carry rule on
    the rollout where each hole is a mask-1 token with kl 0 (advantages compared on the
    original mask-1 tokens, whitening off)."""
    params = {"gamma": gamma, "kl_coef": 0.5, "whiten": False}
    holed = dense(groups, "reinforce", "openrlhf", params)
    filled = [[{**r, "mask": None, "kl": [k if m else 0.0 for k, m in zip(r["kl"], r["mask"])]}
               for r in g] for g in groups]
    carried = dense(filled, "reinforce_pp", "verl", params)
    for r, a, b in zip([r for g in groups for r in g], holed, carried):
        assert [x for x, m in zip(a, r["mask"]) if m] == pytest.approx(
            [x for x, m in zip(b, r["mask"]) if m], abs=1e-12)
