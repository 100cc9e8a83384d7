"""Multi-reward aggregation: gdpo, sa_mrpo, dara and gd2po.

Golden values are computed by hand in each test from one small batch, two components (acc,
fmt) over two groups:

    g0: acc [1, 0, 0], fmt [1, 1, 0]        g1: acc [0, 1], fmt [1, 1]   weights acc 2, fmt 1

Group z-scores (grpo, unbiased std, eps): g0 acc and fmt both have std 1/sqrt(3); g1 acc has
std 1/sqrt(2); g1 fmt has zero spread, so its z-scores are exactly 0.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardd import advantages as adv
from rewardd.advantages import AdvantageBatch, Advantages, compute, pins_for
from rewardd.advantages.aggregate import gdpo
from rewardd.advantages.groups import batch_whiten
from rewardd.service.models import AdvantageSpec, AdvantagesRequest, ScoreResponse
from rewardd.service.pipeline import advantages as pipeline_advantages
from rewardd.advantages.errors import RequestInvalid

TIGHT = 1e-12
EPS = 1e-6  # grpo's epsilon under the rewardd and verl profiles
S0 = 1 / math.sqrt(3) + EPS  # std + eps of g0's acc and of g0's fmt
S1 = 1 / math.sqrt(2) + EPS  # std + eps of g1's acc

ACC = [[1.0, 0.0, 0.0], [0.0, 1.0]]
FMT = [[1.0, 1.0, 0.0], [1.0, 1.0]]
W_ACC, W_FMT = 2.0, 1.0

# A^k by hand: deviations from the group mean over std + eps.
Z_ACC = [(2 / 3) / S0, (-1 / 3) / S0, (-1 / 3) / S0, -0.5 / S1, 0.5 / S1]
Z_FMT = [(1 / 3) / S0, (1 / 3) / S0, (-2 / 3) / S0, 0.0, 0.0]


# ----------------------------------------------------------------------------- helpers


def batch_of(acc: list[list[float]], fmt: list[list[float]], weights=(W_ACC, W_FMT),
             num_tokens: list[int] | None = None, mask: list[int] | None = None,
             component_valid: list[tuple[bool, bool]] | None = None) -> AdvantageBatch:
    a = [x for g in acc for x in g]
    f = [x for g in fmt for x in g]
    r = len(a)
    cv = torch.tensor(component_valid if component_valid else [(True, True)] * r)
    w = torch.tensor(weights, dtype=torch.float64)
    comps = torch.tensor([a, f], dtype=torch.float64).T
    return AdvantageBatch(
        rewards=(comps * w).sum(1), group=torch.tensor([gi for gi, g in enumerate(acc) for _ in g]),
        valid=cv.all(1), num_tokens=torch.tensor(num_tokens or [1] * r),
        num_groups=len(acc), components=comps, component_valid=cv,
        component_names=("acc", "fmt"), weights=w,
        mask=torch.tensor(mask, dtype=torch.bool) if mask is not None else None)


def aggregate(batch: AdvantageBatch, name: str, profile: str = "rewardd",
              estimator: str = "grpo", **params: Any) -> tuple[Advantages, dict[str, Any]]:
    spec = AdvantageSpec(aggregate=name, aggregate_params=params, profile=profile,
                         estimator=estimator)
    composed = adv.run_stages(batch, spec)
    return composed.advantages, composed.report.get(name, {})


def golden(name: str, **params: Any) -> tuple[list[float], dict[str, Any]]:
    a, report = aggregate(batch_of(ACC, FMT), name, whiten=False, **params)
    return a.rollout.tolist(), report


def whiten_by_hand(xs: list[float], counts: list[int], ddof: int, eps: float,
                   eps_in_sqrt: bool) -> list[float]:
    """Whitening where value i counts counts[i] times (its unmasked tokens)."""
    n = sum(counts)
    mean = sum(c * x for c, x in zip(counts, xs)) / n
    var = sum(c * (x - mean) ** 2 for c, x in zip(counts, xs)) / (n - ddof)
    scale = 1 / math.sqrt(var + eps) if eps_in_sqrt else 1 / (math.sqrt(var) + eps)
    return [(x - mean) * scale for x in xs]


def rollouts_with_rewards(acc: list[list[float | None]], fmt: list[list[float | None]],
                          **extra: Any) -> list[dict[str, Any]]:
    return [{"group_id": f"g{gi}", "rollouts": [
        {"rollout_id": f"g{gi}r{ri}", "rewards": {"acc": a, "fmt": f}, **extra}
        for ri, (a, f) in enumerate(zip(ga, gf))]}
        for gi, (ga, gf) in enumerate(zip(acc, fmt))]


def run(groups: list[dict[str, Any]], **advantage: Any) -> dict[str, Any]:
    advantage.setdefault("weights", {"acc": W_ACC, "fmt": W_FMT})
    resp = pipeline_advantages(AdvantagesRequest.model_validate(
        {"groups": groups, "advantage": advantage}))
    wire = orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY)
    ScoreResponse.model_validate(orjson.loads(wire))
    return resp


def flat(resp: dict[str, Any], key: str = "advantages") -> list[Any]:
    return [r[key] for g in resp["groups"] for r in g["rollouts"]]


def is_plus_zero(x: float) -> bool:
    return x == 0.0 and math.copysign(1.0, x) == 1.0


# ----------------------------------------------------------------------------- gdpo


def test_gdpo_golden_is_the_weighted_sum_of_group_z_scores_before_whitening():
    # a: 2 (2/3) + 1/3 = 5/3; b: 2 (-1/3) + 1/3 = -1/3; c: 2 (-1/3) - 2/3 = -4/3 (over S0)
    # d, e: 2 (-+0.5) / S1 + 0 (fmt has zero spread in g1)
    expected = [(5 / 3) / S0, (-1 / 3) / S0, (-4 / 3) / S0, -1 / S1, 1 / S1]
    got, report = golden("gdpo")
    assert got == pytest.approx(expected, abs=TIGHT, rel=0)
    assert report == {"whitening": None}
    assert sum(got[:3]) == pytest.approx(0.0, abs=TIGHT) and got[3] == -got[4]


def test_gdpo_reports_each_components_own_advantages_before_weights():
    a, _ = aggregate(batch_of(ACC, FMT), "gdpo")
    assert list(a.components) == ["acc", "fmt"]
    assert a.components["acc"].tolist() == pytest.approx(Z_ACC, abs=TIGHT, rel=0)
    assert a.components["fmt"].tolist() == pytest.approx(Z_FMT, abs=TIGHT, rel=0)
    assert all(is_plus_zero(x) for x in a.components["fmt"].tolist()[3:])


@pytest.mark.parametrize("profile", ["rewardd", "verl", "trl"])
def test_gdpo_is_whitened_with_the_profiles_whitening_pins(profile):
    pins = pins_for(profile)
    assert "gdpo" in pins.whitened  # docs/estimators.md: verl and trl whiten GDPO; rewardd too
    eps = pins.eps  # the group z-scores use the profile's grpo epsilon
    s0, s1 = 1 / math.sqrt(3) + eps, 1 / math.sqrt(2) + eps
    raw = [(5 / 3) / s0, (-1 / 3) / s0, (-4 / 3) / s0, -1 / s1, 1 / s1]
    how = pins.whitening_for("gdpo")
    expected = whiten_by_hand(raw, [1] * 5, how.ddof, how.eps, how.mode == "var_plus")
    a, report = aggregate(batch_of(ACC, FMT), "gdpo", profile=profile)
    assert a.rollout.tolist() == pytest.approx(expected, abs=TIGHT, rel=0)
    assert report == {"whitening": pins.whitening_for("gdpo").level}


def test_gdpo_under_verl_whitens_as_masked_whiten_unbiased_var_eps_1e_8_in_the_sqrt():
    pins = pins_for("verl")
    how = pins.whitening_for("gdpo")
    assert (how.ddof, how.eps, how.mode) == (1, 1e-8, "var_plus")
    raw = [(5 / 3) / S0, (-1 / 3) / S0, (-4 / 3) / S0, -1 / S1, 1 / S1]
    mean = sum(raw) / 5
    var = sum((x - mean) ** 2 for x in raw) / 4
    expected = [(x - mean) / math.sqrt(var + 1e-8) for x in raw]
    a, _ = aggregate(batch_of(ACC, FMT), "gdpo", profile="verl")
    assert a.rollout.tolist() == pytest.approx(expected, abs=TIGHT, rel=0)


def test_gdpo_is_not_whitened_under_openrlhf_which_does_not_pin_it():
    assert "gdpo" not in pins_for("openrlhf").whitened
    s0 = 1 / math.sqrt(3) + 1e-9  # openrlhf's grpo epsilon
    a, report = aggregate(batch_of([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]],
                                   [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), "gdpo",
                          profile="openrlhf")
    sg1 = math.sqrt(1 / 3) + 1e-9  # g1 acc [0, 1, 1]: mean 2/3, std 1/sqrt(3)
    expected = [(5 / 3) / s0, (-1 / 3) / s0, (-4 / 3) / s0, 2 * (-2 / 3) / sg1,
                2 * (1 / 3) / sg1, 2 * (1 / 3) / sg1]
    assert a.rollout.tolist() == pytest.approx(expected, abs=TIGHT, rel=0)
    assert report == {"whitening": None}


@pytest.mark.parametrize("whiten,level", [(True, "token"), (False, None)])
def test_gdpo_whiten_param_overrides_the_profile(whiten, level):
    _, report = aggregate(batch_of(ACC, FMT), "gdpo", profile="openrlhf" if whiten else "verl",
                          whiten=whiten)
    assert report == {"whitening": level}


def test_gdpo_token_whitening_weighs_rollouts_by_unmasked_tokens_and_rollout_level_does_not():
    num_tokens = [3, 1, 2, 2, 0]
    mask = [1, 1, 0] + [1] + [1, 1] + [0, 1]  # counted tokens per rollout: 2, 1, 2, 1, 0
    batch = batch_of(ACC, FMT, num_tokens=num_tokens, mask=mask)
    raw = [(5 / 3) / S0, (-1 / 3) / S0, (-4 / 3) / S0, -1 / S1, 1 / S1]
    token = whiten_by_hand(raw, [2, 1, 2, 1, 0], 1, 1e-8, True)
    token[4] = 0.0  # e has no unmasked token: no advantage to carry
    a, report = aggregate(batch, "gdpo", profile="verl")
    assert report == {"whitening": "token"}
    assert a.rollout.tolist() == pytest.approx(token, abs=TIGHT, rel=0)
    assert is_plus_zero(a.rollout[4].item())
    per_token = a.per_token(batch).tolist()
    assert per_token[2] == 0.0 and per_token[6] == 0.0 and per_token[0] == a.rollout[0].item()

    a, report = aggregate(batch, "gdpo", profile="verl", whiten_level="rollout")
    assert report == {"whitening": "rollout"}
    assert a.rollout.tolist() == pytest.approx(whiten_by_hand(raw, [1] * 5, 1, 1e-8, True),
                                               abs=TIGHT, rel=0)


def test_gdpo_token_whitening_falls_back_to_rollout_level_when_no_tokens_were_sent():
    batch = batch_of(ACC, FMT, num_tokens=[0] * 5)
    a, report = aggregate(batch, "gdpo", profile="verl")
    raw = [(5 / 3) / S0, (-1 / 3) / S0, (-4 / 3) / S0, -1 / S1, 1 / S1]
    assert report == {"whitening": "rollout"}
    assert a.rollout.tolist() == pytest.approx(whiten_by_hand(raw, [1] * 5, 1, 1e-8, True),
                                               abs=TIGHT, rel=0)


def test_gdpo_excluded_rollout_gets_plus_zero_and_leaves_every_statistic():
    # g0 gets a fourth rollout whose fmt cell failed: it must change nothing for the others.
    with_excluded = batch_of([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0]],
                             [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0]],
                             component_valid=[(True, True)] * 3 + [(True, False)]
                             + [(True, True)] * 2)
    for whiten in (False, True):
        a, _ = aggregate(with_excluded, "gdpo", whiten=whiten)
        b, _ = aggregate(batch_of(ACC, FMT), "gdpo", whiten=whiten)
        got = a.rollout.tolist()
        assert is_plus_zero(got[3])
        assert got[:3] + got[4:] == pytest.approx(b.rollout.tolist(), abs=TIGHT, rel=0)
        assert is_plus_zero(a.components["acc"][3].item())


def test_gdpo_with_a_token_level_estimator_is_a_422_naming_the_estimator():
    batch = batch_of(ACC, FMT)

    def token_level(b: AdvantageBatch) -> Advantages:
        return Advantages(token=torch.zeros(b.total_tokens, dtype=torch.float64))

    with pytest.raises(RequestInvalid) as info:
        gdpo(batch, adv.get_entry("gdpo", "aggregate").Params(), pins_for("rewardd"),
             token_level)
    [err] = info.value.errors
    assert err["loc"] == ["body", "advantage", "estimator"]
    assert "'gdpo'" in err["msg"] and "rollout-level estimator" in err["msg"]


@pytest.mark.parametrize("name", ["gdpo", "sa_mrpo", "dara", "gd2po"])
def test_aggregate_follows_the_requests_estimator(name):
    # dr_grpo: A^k = r^k - mean_g r^k; with saturation/density weights at their reported values.
    a, report = aggregate(batch_of(ACC, FMT), name, estimator="dr_grpo", whiten=False)
    assert a.components["acc"].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -0.5, 0.5],
                                                         abs=TIGHT, rel=0)
    assert a.components["fmt"].tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3, 0, 0],
                                                         abs=TIGHT, rel=0)
    if name in ("sa_mrpo", "dara"):
        w = report["weights"]
        expected = [w["acc"] * x + w["fmt"] * y for x, y in
                    zip(a.components["acc"].tolist(), a.components["fmt"].tolist())]
        assert a.rollout.tolist() == pytest.approx(expected, abs=TIGHT, rel=0)


# ----------------------------------------------------------------------------- sa_mrpo


def test_sa_mrpo_golden_saturation_from_observed_range_discounts_the_weights():
    # acc values 1,0,0,0,1: mean 2/5 on range [0, 1] -> s = 0.4; fmt 1,1,0,1,1: s = 0.8
    # gamma 1: w' = (2 * 0.6, 1 * 0.2) = (1.2, 0.2)
    got, report = golden("sa_mrpo")
    assert report["saturation"] == pytest.approx({"acc": 0.4, "fmt": 0.8}, abs=TIGHT)
    assert report["weights"] == pytest.approx({"acc": 1.2, "fmt": 0.2}, abs=TIGHT)
    expected = [1.2 * x + 0.2 * y for x, y in zip(Z_ACC, Z_FMT)]
    assert got == pytest.approx(expected, abs=TIGHT, rel=0)


def test_sa_mrpo_gamma_is_the_exponent_of_the_discount():
    # gamma 2: w' = (2 * 0.6^2, 1 * 0.2^2) = (0.72, 0.04)
    got, report = golden("sa_mrpo", gamma=2.0)
    assert report["weights"] == pytest.approx({"acc": 0.72, "fmt": 0.04}, abs=TIGHT)
    expected = [0.72 * x + 0.04 * y for x, y in zip(Z_ACC, Z_FMT)]
    assert got == pytest.approx(expected, abs=TIGHT, rel=0)


def test_sa_mrpo_with_gamma_zero_is_gdpo():
    for whiten in (False, True):
        a, report = aggregate(batch_of(ACC, FMT), "sa_mrpo", gamma=0.0, whiten=whiten)
        b, _ = aggregate(batch_of(ACC, FMT), "gdpo", whiten=whiten)
        assert report["weights"] == {"acc": W_ACC, "fmt": W_FMT}
        assert torch.equal(a.rollout, b.rollout)


def test_sa_mrpo_declared_ranges_replace_the_observed_min_and_max():
    # acc mean 0.4 on [-1, 1] -> s = 1.4 / 2 = 0.7; fmt mean 0.8 on [0, 2] -> s = 0.4
    got, report = golden("sa_mrpo", ranges={"acc": [-1.0, 1.0], "fmt": [0.0, 2.0]})
    assert report["saturation"] == pytest.approx({"acc": 0.7, "fmt": 0.4}, abs=TIGHT)
    assert report["weights"] == pytest.approx({"acc": 0.6, "fmt": 0.6}, abs=TIGHT)
    assert got == pytest.approx([0.6 * x + 0.6 * y for x, y in zip(Z_ACC, Z_FMT)],
                                abs=TIGHT, rel=0)


def test_sa_mrpo_saturation_is_clipped_to_the_unit_interval():
    # fmt mean 0.8 above a declared range [0, 0.5] -> s = 1 -> w' = 0; acc below [0.5, 1] -> 0
    _, report = golden("sa_mrpo", ranges={"fmt": [0.0, 0.5], "acc": [0.5, 1.0]})
    assert report["saturation"] == {"acc": 0.0, "fmt": 1.0}
    assert report["weights"] == {"acc": W_ACC, "fmt": 0.0}


def test_sa_mrpo_component_without_spread_has_saturation_zero():
    _, report = aggregate(batch_of(ACC, [[1.0, 1.0, 1.0], [1.0, 1.0]]), "sa_mrpo")
    assert report["saturation"]["fmt"] == 0.0 and report["weights"]["fmt"] == W_FMT


def test_sa_mrpo_range_of_an_unknown_component_is_a_422_naming_it():
    with pytest.raises(RequestInvalid) as info:
        run(rollouts_with_rewards(ACC, FMT), aggregate="sa_mrpo", output="scalar",
            aggregate_params={"ranges": {"len": [0, 1]}})
    [err] = info.value.errors
    assert err["loc"] == ["body", "advantage", "aggregate_params", "ranges", "len"]
    assert "'sa_mrpo'" in err["msg"] and "acc, fmt" in err["msg"]


@pytest.mark.parametrize("bad", [[1.0, 1.0], [2.0, 0.0]])
def test_sa_mrpo_range_with_lo_not_below_hi_is_a_422(bad):
    with pytest.raises(RequestInvalid) as info:
        run(rollouts_with_rewards(ACC, FMT), aggregate="sa_mrpo", output="scalar",
            aggregate_params={"ranges": {"acc": bad}})
    assert info.value.errors[0]["loc"][:4] == ["body", "advantage", "aggregate_params",
                                               "ranges"]
    assert "lo < hi" in info.value.errors[0]["msg"]


# ----------------------------------------------------------------------------- dara


def test_dara_golden_inverse_sqrt_density_weights_renormalised_to_the_same_total():
    # acc has spread in g0 and g1: rho 1; fmt only in g0: rho 1/2.
    # raw: 2 / sqrt(1) = 2, 1 / sqrt(1/2) = sqrt(2); c = (2 + 1) / (2 + sqrt(2))
    c = 3 / (2 + math.sqrt(2))
    w_acc, w_fmt = 2 * c, math.sqrt(2) * c
    got, report = golden("dara")
    assert report["density"] == {"acc": 1.0, "fmt": 0.5}
    assert report["weights"] == pytest.approx({"acc": w_acc, "fmt": w_fmt}, abs=TIGHT)
    assert w_acc + w_fmt == pytest.approx(W_ACC + W_FMT, abs=TIGHT)
    assert got == pytest.approx([w_acc * x + w_fmt * y for x, y in zip(Z_ACC, Z_FMT)],
                                abs=TIGHT, rel=0)


def test_dara_component_with_no_active_group_gets_weight_zero():
    # fmt is 1 everywhere: rho 0 -> w' 0, all the weight (sum |w| = 3) goes to acc
    _, report = aggregate(batch_of(ACC, [[1.0, 1.0, 1.0], [1.0, 1.0]]), "dara")
    assert report["density"] == {"acc": 1.0, "fmt": 0.0}
    assert report["weights"] == {"acc": 3.0, "fmt": 0.0}


def test_dara_density_counts_only_groups_with_an_included_rollout_and_included_values():
    # g1's fmt spread comes only from an excluded rollout; g2 is entirely excluded.
    batch = batch_of([[1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0]],
                     [[1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0]],
                     component_valid=[(True, True)] * 4 + [(True, False)]
                     + [(False, True), (True, False)])
    _, report = aggregate(batch, "dara")
    assert report["density"] == {"acc": 1.0, "fmt": 0.5}


def test_dara_reports_density_and_weights_through_the_request():
    resp = run(rollouts_with_rewards(ACC, FMT), aggregate="dara", output="scalar")
    report = resp["report"]["dara"]
    assert report["density"] == {"acc": 1.0, "fmt": 0.5}
    assert set(report["weights"]) == {"acc", "fmt"} and report["whitening"] == "rollout"


# ----------------------------------------------------------------------------- gd2po


def test_gd2po_golden_masks_the_conflicting_rollout_and_weights_groups_by_agreement():
    # weighted parts w_k A^k (over S0): a (4/3, 1/3) agree; b (-2/3, 1/3) conflict; c agree.
    # b: agreement |(-2/3 + 1/3)| / (2/3 + 1/3) = 1/3, conflict 2/3 > tau 0.5 -> masked
    # g1: fmt parts are 0, so d and e agree fully (1).
    # consensus g0 = (1 + 1/3 + 1) / 3 = 7/9 (masked b included), g1 = 1.
    got, report = golden("gd2po", tau=0.5)
    expected = [7 / 9 * (5 / 3) / S0, 0.0, 7 / 9 * (-4 / 3) / S0, -1 / S1, 1 / S1]
    assert got == pytest.approx(expected, abs=TIGHT, rel=0)
    assert is_plus_zero(got[1])
    assert report["masked"] == ["1"]  # positions: a batch built without request rollouts
    assert report["consensus"] == pytest.approx({"0": 7 / 9, "1": 1.0}, abs=TIGHT)
    assert report["tau"] == 0.5


def test_gd2po_default_tau_0_8_keeps_a_rollout_with_conflict_two_thirds():
    got, report = golden("gd2po")
    assert report["masked"] == [] and report["tau"] == 0.8
    assert got == pytest.approx([7 / 9 * (5 / 3) / S0, 7 / 9 * (-1 / 3) / S0,
                                 7 / 9 * (-4 / 3) / S0, -1 / S1, 1 / S1], abs=TIGHT, rel=0)


def test_gd2po_keep_ratio_consensus_is_the_fraction_of_unmasked_rollouts():
    got, report = golden("gd2po", tau=0.5, consensus="keep_ratio")
    assert report["consensus"] == pytest.approx({"0": 2 / 3, "1": 1.0}, abs=TIGHT)
    assert got == pytest.approx([2 / 3 * (5 / 3) / S0, 0.0, 2 / 3 * (-4 / 3) / S0,
                                 -1 / S1, 1 / S1], abs=TIGHT, rel=0)


def test_gd2po_tau_zero_masks_every_mixed_sign_rollout_and_tau_one_masks_none():
    # opposite components of equal size: conflict exactly 1
    acc, fmt = [[1.0, 0.0]], [[0.0, 1.0]]
    a, report = aggregate(batch_of(acc, fmt, weights=(1.0, 1.0)), "gd2po", tau=0.0,
                          whiten=False)
    assert report["masked"] == ["0", "1"] and a.rollout.tolist() == [0.0, 0.0]
    assert report["consensus"] == {"0": 0.0}
    _, report = aggregate(batch_of(acc, fmt, weights=(1.0, 1.0)), "gd2po", tau=1.0,
                          whiten=False)
    assert report["masked"] == []
    _, report = aggregate(batch_of(ACC, FMT), "gd2po", tau=0.0, whiten=False)
    assert report["masked"] == ["1"]  # agreeing and all-zero rollouts have conflict exactly 0


def test_gd2po_whitening_runs_over_unmasked_rollouts_only():
    a, report = aggregate(batch_of(ACC, FMT), "gd2po", profile="verl", tau=0.5)
    kept = [7 / 9 * (5 / 3) / S0, 7 / 9 * (-4 / 3) / S0, -1 / S1, 1 / S1]
    w = whiten_by_hand(kept, [1] * 4, 1, 1e-8, True)
    assert report["whitening"] == "token"
    assert a.rollout.tolist() == pytest.approx([w[0], 0.0, w[1], w[2], w[3]], abs=TIGHT, rel=0)
    assert is_plus_zero(a.rollout[1].item())


def test_gd2po_conflict_uses_absolute_weights_so_negative_weights_stay_in_range():
    # w = (1, -1): parts (A_acc, -A_fmt); acc [1, 0], fmt [1, 0] give parts (+z, -z): conflict 1
    _, report = aggregate(batch_of([[1.0, 0.0]], [[1.0, 0.0]], weights=(1.0, -1.0)), "gd2po",
                          tau=0.99, whiten=False)
    assert report["masked"] == ["0", "1"] and report["consensus"] == {"0": 0.0}


def test_gd2po_through_the_request_reports_masked_rollout_ids_and_consensus_by_group():
    resp = run(rollouts_with_rewards(ACC, FMT, num_tokens=2), aggregate="gd2po",
               aggregate_params={"tau": 0.5}, output="dense", components=True)
    report = resp["report"]["gd2po"]
    assert report["masked"] == ["g0r1"]
    assert report["consensus"] == pytest.approx({"g0": 7 / 9, "g1": 1.0}, abs=TIGHT)
    assert report["whitening"] == "token"
    masked = resp["groups"][0]["rollouts"][1]
    assert all(is_plus_zero(float(x)) for x in masked["advantages"])
    assert masked["component_advantages"]["acc"] == pytest.approx(Z_ACC[1], abs=TIGHT)


def test_gd2po_consensus_of_a_group_with_no_included_rollout_is_null():
    batch = batch_of([[1.0, 0.0], [0.0]], [[0.0, 1.0], [1.0]],
                     component_valid=[(True, True), (True, True), (False, True)])
    a, report = aggregate(batch, "gd2po", whiten=False)
    assert report["consensus"]["1"] is None and is_plus_zero(a.rollout[2].item())


# ----------------------------------------------------------------------------- full request


def test_gdpo_through_the_request_with_precomputed_reward_components():
    groups = rollouts_with_rewards(ACC, FMT, num_tokens=3)
    resp = run(groups, aggregate="gdpo", output="dense", components=True, profile="verl")
    raw = [(5 / 3) / S0, (-1 / 3) / S0, (-4 / 3) / S0, -1 / S1, 1 / S1]
    expected = whiten_by_hand(raw, [3] * 5, 1, 1e-8, True)
    for dense, a in zip(flat(resp), expected):
        assert [float(x) for x in dense] == pytest.approx([a] * 3, abs=TIGHT, rel=0)
    comps = flat(resp, "component_advantages")
    assert [c["acc"] for c in comps] == pytest.approx(Z_ACC, abs=TIGHT, rel=0)
    assert [c["fmt"] for c in comps] == pytest.approx(Z_FMT, abs=TIGHT, rel=0)
    energy = resp["summary"]["component_energy"]
    assert energy == pytest.approx({"acc": sum(z * z for z in Z_ACC) / 5,
                                    "fmt": sum(z * z for z in Z_FMT) / 5}, abs=TIGHT)
    assert resp["report"] == {"gdpo": {"whitening": "token"}}


def test_gdpo_through_the_request_excludes_a_rollout_with_a_missing_component():
    groups = rollouts_with_rewards([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0]],
                                   [[1.0, 1.0, 0.0, None], [1.0, 1.0]])
    resp = run(groups, aggregate="gdpo", output="scalar", aggregate_params={"whiten": False})
    got = flat(resp)
    assert is_plus_zero(got[3]) and resp["groups"][0]["diagnostics"]["excluded"] == ["g0r3"]
    expected = [(5 / 3) / S0, (-1 / 3) / S0, (-4 / 3) / S0, -1 / S1, 1 / S1]
    assert got[:3] + got[4:] == pytest.approx(expected, abs=TIGHT, rel=0)


@pytest.mark.parametrize("name", ["sa_mrpo", "dara", "gd2po"])
def test_every_aggregate_answers_a_valid_response_with_component_energy(name):
    resp = run(rollouts_with_rewards(ACC, FMT, num_tokens=2), aggregate=name, output="rle",
               components=True)
    assert set(resp["summary"]["component_energy"]) == {"acc", "fmt"}
    assert name in resp["report"]


def test_aggregate_params_are_documented_for_the_catalogue():
    for name in ("gdpo", "sa_mrpo", "dara", "gd2po"):
        entry = adv.get_entry(name, "aggregate")
        schema = entry.Params.model_json_schema()
        assert schema["properties"] and all(p.get("description")
                                            for p in schema["properties"].values())
        assert entry.formula and entry.source and entry.description


def test_unknown_aggregate_param_is_a_422():
    with pytest.raises(RequestInvalid) as info:
        run(rollouts_with_rewards(ACC, FMT), aggregate="gd2po", output="scalar",
            aggregate_params={"threshold": 0.5})
    assert info.value.errors[0]["loc"] == ["body", "advantage", "aggregate_params",
                                           "threshold"]


# ----------------------------------------------------------------------------- properties


PROPERTY = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
reward_values = st.sampled_from([0.0, 1.0, 0.5, -1.0, 2.0, 0.1, 3.25])


@st.composite
def one_component_batches(draw: Any) -> tuple[AdvantageBatch, str]:
    n_groups = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 5)) for _ in range(n_groups)]
    r = sum(sizes)
    rewards = torch.tensor([draw(reward_values) for _ in range(r)], dtype=torch.float64)
    valid = torch.tensor([draw(st.booleans()) or i == 0 for i in range(r)])
    num_tokens = torch.tensor([draw(st.integers(0, 5)) for _ in range(r)])
    n = int(num_tokens.sum())
    mask = torch.tensor([draw(st.booleans()) for _ in range(n)], dtype=torch.bool)
    batch = AdvantageBatch(
        rewards=rewards, group=torch.repeat_interleave(torch.arange(n_groups),
                                                       torch.tensor(sizes)),
        valid=valid, num_tokens=num_tokens, num_groups=n_groups,
        components=rewards[:, None], component_valid=torch.ones(r, 1, dtype=torch.bool),
        component_names=("reward",), weights=torch.ones(1, dtype=torch.float64),
        mask=mask if draw(st.booleans()) else None)
    return batch, draw(st.sampled_from(["rewardd", "verl", "trl", "openrlhf"]))


@PROPERTY
@given(one_component_batches())
def test_property_single_component_gdpo_is_grpo_then_whitening(case):
    batch, profile = case
    pins = pins_for(profile)
    grpo = compute(batch, "grpo", {}, profile).rollout
    tokens = batch.token_mask & batch.valid[batch.token_rollout]
    if bool(tokens.any()) and pins.whitening_for("gdpo").level == "token":
        expected = batch_whiten(grpo[batch.token_rollout], tokens, pins, "gdpo")
    else:
        expected = Advantages(rollout=batch_whiten(grpo, batch.valid, pins, "gdpo")).per_token(batch)
    a, _ = aggregate(batch, "gdpo", profile=profile, whiten=True)
    assert a.per_token(batch).tolist() == pytest.approx(expected.tolist(), abs=TIGHT, rel=0)
    if not bool(tokens.any()) or pins.whitening_for("gdpo").level == "rollout":
        assert a.rollout.tolist() == pytest.approx(batch_whiten(grpo, batch.valid, pins, "gdpo").tolist(),
                                                   abs=TIGHT, rel=0)
    assert all(x == 0.0 for x in a.rollout[~batch.valid].tolist())


@st.composite
def dense_two_component_batches(draw: Any) -> AdvantageBatch:
    """Every group has spread in both components: its first two rollouts differ in each."""
    acc, fmt = [], []
    for _ in range(draw(st.integers(1, 4))):
        size = draw(st.integers(2, 5))
        ga = [draw(reward_values) for _ in range(size)]
        gf = [draw(reward_values) for _ in range(size)]
        ga[1] = ga[0] + draw(st.sampled_from([1.0, -0.5, 2.0]))
        gf[1] = gf[0] + draw(st.sampled_from([1.0, -0.25, 3.0]))
        acc.append(ga)
        fmt.append(gf)
    weights = (draw(st.sampled_from([1.0, 2.0, 0.5, -1.0])),
               draw(st.sampled_from([1.0, 3.0, 0.25])))
    return batch_of(acc, fmt, weights=weights)


@PROPERTY
@given(dense_two_component_batches(), st.sampled_from(["rewardd", "verl", "openrlhf"]))
def test_property_dara_with_every_component_dense_is_the_weighted_gdpo(batch, profile):
    a, report = aggregate(batch, "dara", profile=profile)
    b, _ = aggregate(batch, "gdpo", profile=profile)
    assert report["density"] == {"acc": 1.0, "fmt": 1.0}
    assert report["weights"] == dict(zip(("acc", "fmt"), batch.weights.tolist()))
    assert torch.equal(a.rollout, b.rollout)


@PROPERTY
@given(dense_two_component_batches(), st.floats(0.0, 1.0))
def test_property_gd2po_masked_rollouts_get_plus_zero_and_consensus_lies_in_unit_interval(
        batch, tau):
    a, report = aggregate(batch, "gd2po", tau=tau)
    masked = {int(i) for i in report["masked"]}
    for i, x in enumerate(a.rollout.tolist()):
        if i in masked:
            assert is_plus_zero(x)
    assert all(0.0 <= c <= 1.0 + 1e-15 for c in report["consensus"].values())


def test_gdpo_under_trl_whitens_one_value_per_rollout_with_std_plus_1e_4():
    pins = pins_for("trl")
    how = pins.whitening_for("gdpo")
    assert (how.ddof, how.eps, how.mode, how.level) == (1, 1e-4, "std_plus", "rollout")
    s0, s1 = 1 / math.sqrt(3) + 1e-4, 1 / math.sqrt(2) + 1e-4
    raw = [(5 / 3) / s0, (-1 / 3) / s0, (-4 / 3) / s0, -1 / s1, 1 / s1]
    mean = sum(raw) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 4)
    expected = [(x - mean) / (std + 1e-4) for x in raw]
    a, report = aggregate(batch_of(ACC, FMT), "gdpo", profile="trl")
    assert a.rollout.tolist() == pytest.approx(expected, abs=TIGHT, rel=0)
    assert report == {"whitening": "rollout"}
