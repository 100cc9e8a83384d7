"""Issue 16, item 1: the trainers' own estimator names under their profiles.

Each alias is a registry entry with pinned params (profiles.ALIASES), never a second code
path; the golden values are the trainer's formula written out by hand in float64.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardd.advantages import compute_advantages
from rewardd.advantages.errors import RequestInvalid
from rewardd.service.api.catalogue import list_estimators


def scalar(groups: list[list[float]], estimator: str, profile: str,
           params: dict[str, Any] | None = None) -> list[float]:
    body = {"groups": [{"group_id": f"g{gi}", "rollouts": [
        {"rollout_id": f"g{gi}r{ri}", "reward": r, "num_tokens": 3} for ri, r in enumerate(g)]}
        for gi, g in enumerate(groups)],
        "advantage": {"estimator": estimator, "profile": profile, "params": params or {},
                      "output": "scalar"}}
    out = compute_advantages(body)
    return [r["advantages"] for g in out["groups"] for r in g["rollouts"]]


def errors(estimator: str, profile: str, params: dict[str, Any] | None = None) -> list[dict]:
    with pytest.raises(RequestInvalid) as caught:
        scalar([[1.0, 0.0]], estimator, profile, params)
    return caught.value.errors


def test_rloo_vectorized_gives_a_lone_rollout_zero_where_verls_rloo_keeps_r():
    # verl rloo_vectorized: (c r - sum) / max(c - 1, 1) * (c > 1)
    groups = [[1.0], [1.0, 0.0, 0.0], [2.0, 5.0]]
    assert scalar(groups, "rloo_vectorized", "verl") == [0.0, 1.0, -0.5, -0.5, -3.0, 3.0]
    # verl's rloo: a lone rollout keeps r (mean 0)
    assert scalar(groups, "rloo", "verl") == [1.0, 1.0, -0.5, -0.5, -3.0, 3.0]
    # the pin is rloo's own parameter
    assert scalar(groups, "rloo", "verl", {"singleton": "zero"}) == \
        scalar(groups, "rloo_vectorized", "verl")


def test_grpo_vectorized_floors_the_group_variance_at_verls_epsilon():
    # verl's group_mean_std: std = sqrt(clamp(var, min=1e-6)), then / (std + 1e-6).
    # [1,0,0,0]: var .25, above the floor; [0, 1e-4]: var 5e-9, floored to 1e-6 (std 1e-3);
    # a singleton keeps r / (1 + eps) as verl's grpo
    got = scalar([[1.0, 0.0, 0.0, 0.0], [3.0], [0.0, 1e-4]], "grpo_vectorized", "verl")
    assert got == pytest.approx([0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001,
                                 -0.25 / 0.500001, 3.0 / 1.000001,
                                 -0.5e-4 / (1e-3 + 1e-6), 0.5e-4 / (1e-3 + 1e-6)], rel=1e-12)
    # plain grpo has no floor (verl 0.9.1's grpo_vectorized, which passes eps=0.0)
    small_std = (2 * (0.5e-4) ** 2) ** 0.5
    plain = scalar([[0.0, 1e-4]], "grpo", "verl")
    assert plain == pytest.approx([-0.5e-4 / (small_std + 1e-6), 0.5e-4 / (small_std + 1e-6)],
                                  rel=1e-12)
    assert scalar([[0.0, 1e-4]], "grpo", "verl", {"var_floor": 1e-6}) == got[5:]


def test_grpo_vectorized_pins_its_floor():
    [err] = errors("grpo_vectorized", "verl", {"var_floor": 0.0})
    assert err["loc"][-1] == "var_floor"


@pytest.mark.parametrize("alias, entry, profile", [
    ("reinforce_plus_plus", "reinforce_pp", "verl"),
    ("reinforce_plus_plus_baseline", "reinforce_pp_baseline", "verl"),
    ("group_norm", "grpo", "openrlhf"),
    ("reinforce", "reinforce_pp", "openrlhf"),
    ("reinforce_baseline", "reinforce_pp_baseline", "openrlhf"),
])
def test_trainer_names_give_their_entrys_numbers(alias, entry, profile):
    groups = [[1.0, 0.0, 0.5], [2.0, 2.0, -1.0]]
    assert scalar(groups, alias, profile) == scalar(groups, entry, profile)


def test_group_norm_is_grpo_with_openrlhfs_epsilon():
    # OpenRLHF group_norm: (r - mean) / (std + 1e-9), unbiased std
    got = scalar([[1.0, 0.0]], "group_norm", "openrlhf")
    std = 2 ** -0.5
    assert got == pytest.approx([0.5 / (std + 1e-9), -0.5 / (std + 1e-9)], rel=1e-15)


def test_an_alias_under_another_profile_is_a_422_naming_its_profile():
    [err] = [e for e in errors("rloo_vectorized", "trl")
             if e["loc"] == ["body", "advantage", "estimator"]]
    assert "'verl'" in err["msg"] and "'trl'" in err["msg"]
    [err] = [e for e in errors("group_norm", "verl")
             if e["loc"] == ["body", "advantage", "estimator"]]
    assert "'openrlhf'" in err["msg"]


def test_an_unknown_name_lists_the_profiles_own_names():
    [err] = errors("grpo_vectorised", "verl")
    assert err["loc"] == ["body", "advantage", "estimator"]
    assert "grpo_vectorized" in err["msg"] and "rloo_vectorized" in err["msg"]


def test_a_param_the_alias_pins_to_another_value_is_a_422_at_that_param():
    [err] = errors("rloo_vectorized", "verl", {"singleton": "mean0_std1"})
    assert err["loc"] == ["body", "advantage", "params", "singleton"]
    assert "'zero'" in err["msg"] and "'rloo'" in err["msg"]
    assert scalar([[1.0]], "rloo_vectorized", "verl", {"singleton": "zero"}) == [0.0]


def test_estimators_route_lists_aliases_with_their_profile():
    by_name = {e.name: e for e in list_estimators("estimator")}
    assert by_name["rloo"].profiles["verl"]["aliases"] == {
        "rloo_vectorized": {"params": {"singleton": "zero"},
                            "note": by_name["rloo"].profiles["verl"]["aliases"][
                                "rloo_vectorized"]["note"]}}
    assert set(by_name["grpo"].profiles["verl"]["aliases"]) == {"grpo_vectorized"}
    assert set(by_name["grpo"].profiles["openrlhf"]["aliases"]) == {"group_norm"}
    assert set(by_name["reinforce_pp"].profiles["openrlhf"]["aliases"]) == {"reinforce"}
    assert set(by_name["reinforce_pp_baseline"].profiles["verl"]["aliases"]) == {
        "reinforce_plus_plus_baseline"}
    assert by_name["gae"].profiles["trl"]["aliases"] == {}
    assert "rloo_vectorized" not in by_name  # an alias is not a second entry


rewards = st.lists(st.integers(-50, 50).map(lambda k: k / 8), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.lists(rewards, min_size=1, max_size=4), st.integers(-8, 8), st.data())
def test_rloo_vectorized_properties_shift_and_group_order(groups, shift, data):
    base = scalar(groups, "rloo_vectorized", "verl")
    # a shift of every reward leaves leave-one-out advantages unchanged (also singletons: 0)
    shifted = scalar([[r + shift for r in g] for g in groups], "rloo_vectorized", "verl")
    assert shifted == pytest.approx(base, abs=1e-12)
    # permuting a group's rollouts permutes their advantages
    order = [data.draw(st.permutations(range(len(g)))) for g in groups]
    permuted = scalar([[g[k] for k in o] for g, o in zip(groups, order)], "rloo_vectorized",
                      "verl")
    start, expected = 0, []
    for g, o in zip(groups, order):
        expected += [base[start + k] for k in o]
        start += len(g)
    assert permuted == pytest.approx(expected, abs=1e-12)
    # every group sums to 0
    start = 0
    for g in groups:
        assert sum(base[start:start + len(g)]) == pytest.approx(0.0, abs=1e-9)
        start += len(g)


# ---- the route and the library entry point -------------------------------------------------

def test_the_route_resolves_aliases_and_lists_them(tmp_path):
    import orjson
    from fastapi.testclient import TestClient

    from rewardd.service.app import create_app
    from rewardd.service.settings import Settings
    from tests.support.executors import RefusingExecutor

    body = {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "reward": 1.0, "num_tokens": 2},
        {"rollout_id": "b", "reward": 0.0, "num_tokens": 2}]},
        {"group_id": "lone", "rollouts": [{"rollout_id": "c", "reward": 1.0, "num_tokens": 2}]}],
        "advantage": {"estimator": "rloo_vectorized", "profile": "verl", "output": "scalar"}}
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as client:
        answer = client.post("/v1/advantages", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.content == orjson.dumps(compute_advantages(body),
                                              option=orjson.OPT_SERIALIZE_NUMPY)
        assert [r["advantages"] for g in answer.json()["groups"] for r in g["rollouts"]] == \
            [1.0, -1.0, 0.0]
        refused = client.post("/v1/advantages", json={
            **body, "advantage": {**body["advantage"], "profile": "openrlhf"}})
        assert refused.status_code == 422
        assert ["body", "advantage", "estimator"] in [e["loc"] for e in refused.json()["detail"]]
        listed = client.get("/v1/estimators", params={"kind": "estimator"}).json()
        rloo = next(e for e in listed if e["name"] == "rloo")
        assert rloo["profiles"]["verl"]["aliases"]["rloo_vectorized"]["params"] == {
            "singleton": "zero"}


def test_library_compute_resolves_an_alias_under_its_profile():
    import torch

    from rewardd.advantages import AdvantageBatch, compute

    batch = AdvantageBatch(rewards=torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64),
                           group=torch.tensor([0, 0, 1]), valid=torch.ones(3, dtype=torch.bool),
                           num_tokens=torch.ones(3, dtype=torch.int64), num_groups=2)
    assert compute(batch, "rloo_vectorized", {}, "verl").rollout.tolist() == [1.0, -1.0, 0.0]
    assert compute(batch, "rloo", {}, "verl").rollout.tolist() == [1.0, -1.0, 1.0]
    with pytest.raises(KeyError, match="'verl'"):
        compute(batch, "rloo_vectorized", {}, "rewardd")
