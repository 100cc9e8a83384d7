"""Issue 16, item 3: TRL's scale_rewards, RLOO's normalize_advantages and TRL's None.

Golden values are TRL 1.16's formulas written out by hand (GRPOTrainer and RLOOTrainer
``_generate_and_score_completions``: nansum over functions, nanmean/nanstd over a group,
1e-4 added to the std); tests/trainers/test_trl.py runs TRL's own statements on random
batches.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardd.advantages import compute_advantages

EPS = 1e-4


def std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def response(groups: list[list[Any]], estimator: str = "grpo", profile: str = "trl",
             **advantage: Any) -> dict[str, Any]:
    """Rollouts from rewards (a float) or components (a dict, None for TRL's None)."""
    body = {"groups": [{"group_id": f"g{gi}", "rollouts": [
        {"rollout_id": f"g{gi}r{ri}", **({"rewards": r} if isinstance(r, dict) else {"reward": r})}
        for ri, r in enumerate(g)]} for gi, g in enumerate(groups)],
        "advantage": {"estimator": estimator, "profile": profile, "output": "scalar",
                      **advantage}}
    return compute_advantages(body)


def scalars(groups: list[list[Any]], estimator: str = "grpo", profile: str = "trl",
            **advantage: Any) -> list[float]:
    out = response(groups, estimator, profile, **advantage)
    return [r["advantages"] for g in out["groups"] for r in g["rollouts"]]


# ---- scale_rewards ----------------------------------------------------------------------

def test_scale_rewards_batch_divides_by_the_batch_std():
    # rewards [1, 0 | 3, 3]: batch mean 1.75, unbiased var 6.75 / 3 = 2.25, std 1.5
    got = scalars([[1.0, 0.0], [3.0, 3.0]], params={"scale_rewards": "batch"})
    assert got == pytest.approx([0.5 / (1.5 + EPS), -0.5 / (1.5 + EPS), 0.0, 0.0], rel=1e-15)


def test_scale_rewards_none_only_centres_and_group_is_the_default():
    assert scalars([[1.0, 0.0, 0.0]], params={"scale_rewards": "none"}) == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3], rel=1e-15)
    s = std([1.0, 0.0, 0.0])
    assert scalars([[1.0, 0.0, 0.0]]) == scalars([[1.0, 0.0, 0.0]],
                                                 params={"scale_rewards": "group"})
    assert scalars([[1.0, 0.0, 0.0]]) == pytest.approx(
        [(2 / 3) / (s + EPS), (-1 / 3) / (s + EPS), (-1 / 3) / (s + EPS)], rel=1e-15)


def test_scale_rewards_names_its_choices_in_a_422():
    from rewardd.advantages.errors import RequestInvalid

    with pytest.raises(RequestInvalid) as caught:
        scalars([[1.0, 0.0]], params={"scale_rewards": "global"})
    [err] = caught.value.errors
    assert err["loc"] == ["body", "advantage", "params", "scale_rewards"]
    assert "'group'" in err["msg"] and "'batch'" in err["msg"]


# ---- RLOO normalize_advantages ------------------------------------------------------------

def test_rloo_normalize_advantages_whitens_over_rollouts_with_a_baseline():
    # rloo: [1, -.5, -.5 | lone: NaN in TRL | 0, 0]; stats over [1, -.5, -.5, 0, 0]:
    # mean 0, unbiased var 1.5 / 4
    got = scalars([[1.0, 0.0, 0.0], [2.0], [5.0, 5.0]], "rloo",
                  params={"normalize_advantages": True})
    s = math.sqrt(1.5 / 4)
    assert got == pytest.approx([1 / (s + EPS), -0.5 / (s + EPS), -0.5 / (s + EPS), 0.0,
                                 0.0, 0.0], rel=1e-15)
    assert scalars([[1.0, 0.0, 0.0]], "rloo") == [1.0, -0.5, -0.5]


# ---- TRL's None -----------------------------------------------------------------------------

NULLS = [[{"a": 1.0, "b": None}, {"a": None, "b": None}, {"a": 0.0, "b": 0.25}]]


def test_a_null_component_counts_0_and_an_all_null_rollout_is_excluded():
    # TRL: rewards = nansum(w * r) = [1, NaN, 0 + 2 * .25]; group over [1, .5]
    out = response(NULLS, weights={"a": 1.0, "b": 2.0})
    rows = out["groups"][0]["rollouts"]
    assert [r["reward"] for r in rows] == [1.0, None, 0.5]
    assert [r["excluded"] for r in rows] == [False, True, False]
    assert rows[0]["status"]["b"]["error"] == "missing"  # still reported as missing
    s = std([1.0, 0.5])
    assert [r["advantages"] for r in rows] == pytest.approx(
        [0.25 / (s + EPS), 0.0, -0.25 / (s + EPS)], rel=1e-15)
    assert out["summary"]["failed_cells"] == 3
    # under the other profiles a failed cell without fallback excludes its rollout
    assert [r["excluded"] for r in response(NULLS, profile="verl")["groups"][0]["rollouts"]] \
        == [True, True, False]


def test_gdpo_normalises_each_component_over_the_rollouts_that_have_it():
    groups = [[{"a": 1.0, "b": None}, {"a": 0.0, "b": 0.5}, {"a": None, "b": 0.5},
               {"a": 1.0, "b": 1.0}, {"a": None, "b": None}]]
    got = scalars(groups, aggregate="gdpo")
    sa, sb = std([1.0, 0.0, 1.0]), std([0.5, 0.5, 1.0])
    za = [(1 / 3) / (sa + EPS), (-2 / 3) / (sa + EPS), None, (1 / 3) / (sa + EPS)]
    zb = [None, (-1 / 6) / (sb + EPS), (-1 / 6) / (sb + EPS), (1 / 3) / (sb + EPS)]
    summed = [sum(z for z in pair if z is not None) for pair in zip(za, zb)]  # nansum
    mean, spread = sum(summed) / 4, std(summed)
    # TRL normalize_then_sum: batch whitening over the scorable rows, (x - mean)/(std + 1e-4)
    assert got == pytest.approx([(x - mean) / (spread + EPS) for x in summed] + [0.0],
                                rel=1e-12)


def test_rloo_leave_one_out_is_over_scorable_siblings():
    # TRL RLOO: rewards [1, NaN, .25 * 1 + 0]; baselines over scorable siblings
    got = scalars(NULLS, "rloo")
    assert got == [0.75, 0.0, -0.75]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from([None, 0.0, 0.5, 1.0]),
                                   st.sampled_from([None, 0.0, 0.25, 1.0])),
                         min_size=2, max_size=5), min_size=1, max_size=3),
       st.sampled_from(["group", "batch", "none"]))
def test_nulls_count_as_0_except_in_an_all_null_rollout(groups, scale):
    """TRL's nansum: a row with some None equals the row with 0 there; an all-None row is
    excluded and every other row keeps the advantage it has without that row."""
    size = len(groups[0])
    groups = [g[:size] + [(0.0, 0.0)] * (size - len(g)) for g in groups]  # TRL: equal blocks
    as_dicts = [[{"a": a, "b": b} for a, b in g] for g in groups]
    zeroed = [[{"a": a or 0.0, "b": b or 0.0} if (a, b) != (None, None) else {"a": None,
                                                                            "b": None}
               for a, b in g] for g in groups]
    params = {"scale_rewards": scale}
    assert scalars(as_dicts, params=params) == scalars(zeroed, params=params)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-8, 8).map(lambda k: k / 4), min_size=2, max_size=5),
                min_size=1, max_size=4),
       st.sampled_from(["group", "batch", "none"]), st.integers(-5, 5), st.data())
def test_scale_rewards_shift_invariance_and_group_order(groups, scale, shift, data):
    params = {"scale_rewards": scale}
    base = scalars(groups, params=params)
    shifted = scalars([[r + shift for r in g] for g in groups], params=params)
    assert shifted == pytest.approx(base, abs=1e-9)
    order = data.draw(st.permutations(range(len(groups))))
    moved = scalars([groups[k] for k in order], params=params)
    starts = [sum(len(g) for g in groups[:k]) for k in range(len(groups))]
    expected = [v for k in order for v in base[starts[k]:starts[k] + len(groups[k])]]
    assert moved == pytest.approx(expected, abs=1e-12)


def test_the_route_answers_trls_none_convention():
    import orjson
    from fastapi.testclient import TestClient

    from rewardd.service.app import create_app
    from rewardd.service.settings import Settings
    from tests.support.executors import RefusingExecutor

    body = {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": f"r{i}", "rewards": r} for i, r in enumerate(NULLS[0])]}],
        "advantage": {"estimator": "grpo", "profile": "trl", "output": "scalar",
                      "weights": {"a": 1.0, "b": 2.0}}}
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as client:
        answer = client.post("/v1/advantages", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.content == orjson.dumps(compute_advantages(body),
                                          option=orjson.OPT_SERIALIZE_NUMPY)
    assert [r["excluded"] for r in answer.json()["groups"][0]["rollouts"]] == [False, True, False]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-8, 8).map(lambda k: k / 4), min_size=2, max_size=5),
                min_size=2, max_size=4),
       st.sampled_from([0.5, 2.0, 8.0]))
def test_scale_rewards_scale_properties(groups, factor):
    """``none`` is linear in the rewards; ``group`` and ``batch`` are scale-free up to the
    epsilon (exactly so with eps small against the std)."""
    scaled = [[r * factor for r in g] for g in groups]
    assert scalars(scaled, params={"scale_rewards": "none"}) == pytest.approx(
        [a * factor for a in scalars(groups, params={"scale_rewards": "none"})], abs=1e-12)
    for scale in ("group", "batch"):
        params = {"scale_rewards": scale, "eps": 1e-12}
        assert scalars(scaled, params=params) == pytest.approx(
            scalars(groups, params=params), rel=1e-9, abs=1e-9)
