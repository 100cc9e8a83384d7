"""Issue 16, item 2: the three rules for mask-0 tokens inside a response (``holes``).

``carry`` (verl 0.9.1's reinforce_plus_plus, verl's gae), ``reset`` (verl's
reinforce_plus_plus before 0.9.1, at b178a3c: ``running = running * mask[:, t]``, the rule
issue 16 measured and the verl profile's default for reinforce_pp) and ``step`` (OpenRLHF).
Golden values are worked out by hand on small inputs; the properties compare with verl's two
loops written out below in float64. tests/trainers/test_verl.py runs the installed verl.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardd.advantages import compute_advantages
from rewardd.advantages.errors import RequestInvalid
from rewardd.advantages.profiles import pins_for

PROFILES = ("rewardd", "verl", "trl", "openrlhf")


def rows_of(rollouts: list[dict[str, Any]], estimator: str, profile: str,
            params: dict[str, Any], key: str = "advantages") -> list[list[float]]:
    body = {"groups": [{"group_id": "g", "rollouts": rollouts}],
            "advantage": {"estimator": estimator, "profile": profile, "params": params,
                          "output": "dense"}}
    out = compute_advantages(body)
    return [[float(v) for v in r[key]] for g in out["groups"] for r in g["rollouts"]]


# ---- golden values ------------------------------------------------------------------------

# outcome 1 at the last token, token rewards .5 and .25 before the hole, 9 on the hole (a
# mask-0 token's reward never counts)
TOKENS = [{"rollout_id": "a", "reward": 1.0, "num_tokens": 5, "mask": [1, 1, 0, 1, 1],
           "token_rewards": [0.5, 0.25, 9.0, 0.0, 0.0]}]
REINFORCE = {
    # G4 = 1, G3 = .5 | reset: G1 = .25, G0 = .5 + .5 * .25
    "reset": [0.625, 0.25, 0.0, 0.5, 1.0],
    # carried across the hole with one step: G1 = .25 + .5 * .5, G0 = .5 + .5 * .5
    "carry": [0.75, 0.5, 0.0, 0.5, 1.0],
    # the hole a step with reward 0: G2 = .25, G1 = .25 + .125, G0 = .5 + .1875
    "step": [0.6875, 0.375, 0.0, 0.5, 1.0],
}

# values .5, .25 | 9 on the hole | .125; outcome 1; gamma .5, lambda .5
VALUED = [{"rollout_id": "a", "reward": 1.0, "num_tokens": 4, "mask": [1, 1, 0, 1],
           "values": [0.5, 0.25, 9.0, 0.125]}]
GAE = {
    # reset: V after token 1 is 0. delta1 = -.25, delta0 = .5 * .25 - .5 = -.375;
    # A1 = -.25, A0 = -.375 + .25 * -.25; A3 = 1 - .125
    "reset": [-0.4375, -0.25, 0.0, 0.875],
    # carry: delta1 = .5 * .125 - .25 = -.1875, A1 = -.1875 + .25 * .875 = .03125,
    # A0 = -.375 + .25 * .03125
    "carry": [-0.3671875, 0.03125, 0.0, 0.875],
    # step: V2 = 0, r2 = 0: delta2 = .0625, A2 = .0625 + .25 * .875 = .28125,
    # A1 = -.25 + .25 * .28125 = -.1796875, A0 = -.375 + .25 * A1
    "step": [-0.419921875, -0.1796875, 0.0, 0.875],
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("rule", ["reset", "carry", "step"])
def test_reinforce_pp_each_rule_by_hand_under_every_profile(rule, profile):
    params = {"gamma": 0.5, "whiten": False, "holes": rule}
    assert rows_of(TOKENS, "reinforce_pp", profile, params) == [REINFORCE[rule]]
    assert rows_of(TOKENS, "reinforce_pp", profile, params, "returns") == [REINFORCE[rule]]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("rule", ["reset", "carry", "step"])
def test_gae_each_rule_by_hand_under_every_profile(rule, profile):
    params = {"gamma": 0.5, "lam": 0.5, "whiten": False, "holes": rule}
    assert rows_of(VALUED, "gae", profile, params) == [GAE[rule]]
    returns = [a + v if m else 0.0 for a, v, m in zip(GAE[rule], VALUED[0]["values"],
                                                       VALUED[0]["mask"])]
    assert rows_of(VALUED, "gae", profile, params, "returns") == [returns]


@pytest.mark.parametrize("profile, estimator, rule", [
    ("verl", "reinforce_pp", "reset"), ("verl", "reinforce_plus_plus", "reset"),
    ("verl", "gae", "carry"), ("openrlhf", "reinforce", "step"), ("openrlhf", "gae", "step"),
    ("rewardd", "reinforce_pp", "carry"), ("rewardd", "gae", "carry"),
    ("trl", "reinforce_pp", "carry"), ("trl", "gae", "carry"),
])
def test_each_profile_pins_its_rule(profile, estimator, rule):
    if estimator in ("gae",):
        rollouts, params, golden = VALUED, {"gamma": 0.5, "lam": 0.5, "whiten": False}, GAE
    else:
        rollouts, params, golden = TOKENS, {"gamma": 0.5, "whiten": False}, REINFORCE
    assert rows_of(rollouts, estimator, profile, params) == [golden[rule]]


def test_the_pin_is_per_entry_and_listed():
    verl = pins_for("verl")
    assert (verl.holes_for("reinforce_pp"), verl.holes_for("gae")) == ("reset", "carry")
    assert verl.holes_for("reinforce_pp", "carry") == "carry"
    assert pins_for("rewardd").holes_for("gae") == "carry"
    assert verl.as_dict()["holes"] == {"reinforce_pp": "reset", "gae": "carry"}


def test_reset_with_gamma_1_and_whitening_by_hand():
    # verl's default: gamma 1, outcome only, whitened over mask-1 tokens (unbiased, eps 1e-8).
    # reset: [0, _, 1] and [-1, -1]: the first token sees nothing after the hole;
    # mean -1/4, var (1/16 + 25/16 + 9/16 + 9/16) / 3 = 11/12
    rollouts = [{"rollout_id": "a", "reward": 1.0, "num_tokens": 3, "mask": [1, 0, 1]},
                {"rollout_id": "b", "reward": -1.0, "num_tokens": 2}]
    s = 1 / math.sqrt(11 / 12 + 1e-8)
    got = rows_of(rollouts, "reinforce_plus_plus", "verl", {})
    expected = [[0.25 * s, 0.0, 1.25 * s], [-0.75 * s, -0.75 * s]]
    assert [v for r in got for v in r] == pytest.approx([v for r in expected for v in r],
                                                        rel=1e-12)
    assert rows_of(rollouts, "reinforce_plus_plus", "verl", {}, "returns") == \
        [[0.0, 0.0, 1.0], [-1.0, -1.0]]
    # carry (verl 0.9.1): [1, _, 1] and [-1, -1], mean 0, var 4/3
    c = 1 / math.sqrt(4 / 3 + 1e-8)
    carried = rows_of(rollouts, "reinforce_plus_plus", "verl", {"holes": "carry"})
    assert [v for r in carried for v in r] == pytest.approx([c, 0.0, c, -c, -c], rel=1e-12)


def test_trailing_mask_0_tokens_and_a_leading_hole_change_nothing_under_reset():
    rollouts = [{"rollout_id": "a", "reward": 1.0, "num_tokens": 5, "mask": [0, 1, 1, 0, 0]}]
    params = {"gamma": 0.5, "whiten": False}
    assert rows_of(rollouts, "reinforce_pp", "verl", params) == [[0.0, 0.5, 1.0, 0.0, 0.0]]
    assert rows_of(rollouts, "reinforce_pp", "rewardd", params) == [[0.0, 0.5, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("estimator", ["reinforce_pp", "gae"])
def test_another_rule_is_a_422_naming_holes(estimator):
    rollouts = [{**VALUED[0], "rollout_id": "a"}]
    with pytest.raises(RequestInvalid) as caught:
        rows_of(rollouts, estimator, "verl", {"holes": "skip"})
    [err] = caught.value.errors
    assert err["loc"] == ["body", "advantage", "params", "holes"]
    assert all(rule in err["msg"] for rule in ("carry", "reset", "step")), err


def test_holes_is_refused_where_no_rule_applies():
    with pytest.raises(RequestInvalid) as caught:
        rows_of([{"rollout_id": "a", "reward": 1.0, "num_tokens": 2}], "reinforce_pp_baseline",
                "verl", {"holes": "reset"})
    assert caught.value.errors[0]["loc"][-1] == "holes"


# ---- properties: verl's two loops written out -------------------------------------------

def verl_returns(rewards: list[float], mask: list[int], gamma: float, rule: str
                 ) -> list[float]:
    """verl's compute_reinforce_plus_plus_outcome_advantage loop on one row, float64.
    ``reset`` (b178a3c): running = r_t + gamma running; returns_t = running;
    running *= mask_t. ``carry`` (0.9.1): at a mask-0 token running passes unchanged."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        new = rewards[t] + gamma * running
        if rule == "reset":
            out[t] = new
            running = new * mask[t]
        else:
            out[t] = new * mask[t]
            running = new if mask[t] else running
    return out


def masked_whiten(rows: list[list[float]], masks: list[list[int]]) -> list[list[float]]:
    """verl_F.masked_whiten (unbiased variance, rsqrt(var + 1e-8)), times the mask."""
    xs = [v for r, m in zip(rows, masks) for v, k in zip(r, m) if k]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    scale = 1 / math.sqrt(var + 1e-8)
    return [[(v - mean) * scale if k else 0.0 for v, k in zip(r, m)]
            for r, m in zip(rows, masks)]


@st.composite
def holed_rows(draw: Any) -> list[dict[str, Any]]:
    rows = []
    for i in range(draw(st.integers(2, 5))):
        n = draw(st.integers(1, 7))
        mask = draw(st.lists(st.sampled_from([0, 1]), min_size=n - 1, max_size=n - 1)) + [1]
        pad = draw(st.integers(0, 2))  # trailing mask-0 tokens
        eighths = st.integers(-8, 8).map(lambda k: k / 8)
        rows.append({"rollout_id": f"r{i}", "reward": draw(eighths), "num_tokens": n + pad,
                     "mask": mask + [0] * pad,
                     "token_rewards": draw(st.lists(eighths, min_size=n + pad,
                                                    max_size=n + pad)),
                     "kl": draw(st.lists(eighths, min_size=n + pad, max_size=n + pad))})
    return rows


@settings(max_examples=60, deadline=None)
@given(holed_rows(), st.sampled_from([0.5, 0.9, 1.0]), st.sampled_from(["reset", "carry"]),
       st.booleans())
def test_reset_and_carry_are_verls_two_loops(rows, gamma, rule, whiten):
    """verl's token_level_rewards: token rewards, minus kl_coef * kl on mask-1 tokens, plus
    the outcome at the last mask-1 token; the rewards verl would see on a hole (its token
    reward here) must not reach any mask-1 token under either rule."""
    kl_coef = 0.25
    masks = [r["mask"] for r in rows]
    returns = []
    for r in rows:
        last = max(t for t, m in enumerate(r["mask"]) if m)
        rewards = [tr - kl_coef * k * m + (r["reward"] if t == last else 0.0)
                   for t, (tr, k, m) in enumerate(zip(r["token_rewards"], r["kl"], r["mask"]))]
        returns.append(verl_returns(rewards, r["mask"], gamma, rule))
    expected = masked_whiten(returns, masks) if whiten else \
        [[v * m for v, m in zip(g, mk)] for g, mk in zip(returns, masks)]
    params = {"gamma": gamma, "kl_coef": kl_coef, "whiten": whiten}
    if rule == "carry":
        params["holes"] = "carry"
    got = rows_of(rows, "reinforce_plus_plus", "verl", params)
    for a, b, m in zip(got, expected, masks):
        assert [x for x, k in zip(a, m) if k] == pytest.approx(
            [x for x, k in zip(b, m) if k], rel=1e-9, abs=1e-9)
        assert all(x == 0.0 for x, k in zip(a, m) if not k)
