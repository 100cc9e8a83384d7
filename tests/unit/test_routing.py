"""Token routing estimators: segment, outcome_conditioned, turn, gigpo, bipace, tempo.

Every case runs through the pure pipeline ``rewardd.service.pipeline.advantages`` and the response is
validated against ScoreResponse. Golden values are hand computations written next to each
test; tempo is also checked against a naive prefix-tree reference (tuples of token ids).
"""

from __future__ import annotations

import math
import struct
from collections import defaultdict
from typing import Any

import orjson
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardd.advantages import AdvantageBatch, decode_rle, get_estimator
from rewardd.advantages.routing import discounted_suffix_sum
from rewardd.advantages.steps import leader_clusters
from rewardd.advantages.tree import branch_differences
from rewardd.service.models import AdvantagesRequest, ScoreResponse
from rewardd.service.pipeline import advantages as pipeline_advantages
from rewardd.advantages.errors import RequestInvalid

EPS = 1e-6
TIGHT = 1e-12
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- helpers


def request(groups: list[dict[str, Any]], **advantage: Any) -> AdvantagesRequest:
    return AdvantagesRequest.model_validate({"groups": groups, "advantage": advantage})


def run(groups: list[dict[str, Any]], **advantage: Any) -> dict[str, Any]:
    advantage.setdefault("output", "dense")
    resp = pipeline_advantages(request(groups, **advantage))
    wire = orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY)
    ScoreResponse.model_validate(orjson.loads(wire))
    return resp


def dense(resp: dict[str, Any]) -> list[list[float]]:
    return [[float(x) for x in r["advantages"]] for g in resp["groups"] for r in g["rollouts"]]


def one_group(*rollouts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"group_id": "g", "rollouts": [{"rollout_id": f"r{i}", **r}
                                           for i, r in enumerate(rollouts)]}]


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def is_plus_zero(x: float) -> bool:
    return x == 0.0 and math.copysign(1.0, x) == 1.0


def std1(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def grpo_of(xs: list[float], eps: float = EPS) -> list[float]:
    """rewardd-profile GRPO: fewer than two or all equal -> 0."""
    if len(xs) < 2 or min(xs) == max(xs):
        return [0.0] * len(xs)
    m = sum(xs) / len(xs)
    return [(x - m) / (std1(xs) + eps) for x in xs]


def approx(values: list[Any]) -> Any:
    """Tolerance 1e-12 on a list of floats or a list of rows."""
    if values and isinstance(values[0], list):
        return [pytest.approx(row, abs=TIGHT, rel=0) for row in values]
    return pytest.approx(values, abs=TIGHT, rel=0)


# ----------------------------------------------------------------------------- segment

THINK_ANSWER = [{"label": "think", "start": 0, "end": 2}, {"label": "answer", "start": 2, "end": 4}]
ROUTE = {"fmt": ["think"], "acc": ["answer"]}


def segment_group() -> list[dict[str, Any]]:
    """Four rollouts; the last has no answer segment, and token 4 is outside every segment."""
    return one_group(
        {"rewards": {"fmt": 1.0, "acc": 1.0}, "num_tokens": 5, "segments": THINK_ANSWER},
        {"rewards": {"fmt": 0.0, "acc": 0.0}, "num_tokens": 5, "segments": THINK_ANSWER},
        {"rewards": {"fmt": 0.0, "acc": 0.5}, "num_tokens": 5, "segments": THINK_ANSWER},
        {"rewards": {"fmt": 0.0, "acc": 1.0}, "num_tokens": 3, "segments": THINK_ANSWER[:1]})


def test_segment_routes_each_component_to_its_segments_and_normalises_over_carriers():
    # fmt over all four: mean 1/4 -> .75, -.25, -.25, -.25 on think tokens.
    # acc over the three rollouts with an answer: [1, 0, .5], mean .5 -> .5, -.5, 0.
    # Rollout 3's acc (1.0) takes no part. Token 4 is unrouted: 0.
    resp = run(segment_group(), estimator="segment",
               params={"bindings": ROUTE, "base": "dr_grpo"}, components=True)
    assert dense(resp) == [[0.75, 0.75, 0.5, 0.5, 0.0], [-0.25, -0.25, -0.5, -0.5, 0.0],
                           [-0.25, -0.25, 0.0, 0.0, 0.0], [-0.25, -0.25, 0.0]]
    comps = [r["component_advantages"] for r in resp["groups"][0]["rollouts"]]
    assert comps == [{"fmt": 0.75, "acc": 0.5}, {"fmt": -0.25, "acc": -0.5},
                     {"fmt": -0.25, "acc": 0.0}, {"fmt": -0.25, "acc": 0.0}]
    assert resp["report"]["segment"] == {"carriers": {"fmt": 4, "acc": 3}, "routed_tokens": 14}


def test_segment_grpo_base_divides_by_each_components_own_carrier_std():
    resp = run(segment_group(), estimator="segment", params={"bindings": ROUTE})
    fmt = grpo_of([1.0, 0.0, 0.0, 0.0])  # std .5
    acc = grpo_of([1.0, 0.0, 0.5])  # std .5
    got = dense(resp)
    assert got[0] == approx([fmt[0]] * 2 + [acc[0]] * 2 + [0.0])
    assert got[1] == approx([fmt[1]] * 2 + [acc[1]] * 2 + [0.0])
    assert got[2] == approx([fmt[2]] * 2 + [0.0, 0.0, 0.0])
    assert got[3] == approx([fmt[3]] * 2 + [0.0])
    assert fmt[0] == pytest.approx(0.75 / (0.5 + EPS), abs=TIGHT)


def test_segment_default_total_gives_unrouted_tokens_the_advantage_of_the_weighted_total():
    # Weighted total 2*fmt + acc: [3, 0, .5, 1], mean 1.125; dr_grpo on token 4 and the
    # tokens of rollout 3 outside think.
    resp = run(segment_group(), estimator="segment", weights={"fmt": 2.0},
               params={"bindings": ROUTE, "base": "dr_grpo", "default": "total"})
    assert dense(resp) == [[0.75, 0.75, 0.5, 0.5, 1.875], [-0.25, -0.25, -0.5, -0.5, -1.125],
                           [-0.25, -0.25, 0.0, 0.0, -0.625], [-0.25, -0.25, -0.125]]


def test_segment_weighted_multiplies_each_routed_advantage_by_its_component_weight():
    resp = run(segment_group(), estimator="segment", weights={"fmt": 2.0, "acc": 0.5},
               params={"bindings": ROUTE, "base": "dr_grpo", "weighted": True})
    assert dense(resp)[0] == [1.5, 1.5, 0.25, 0.25, 0.0]


def test_segment_label_bound_to_two_components_gets_the_sum_of_their_advantages():
    resp = run(segment_group(), estimator="segment",
               params={"bindings": {"fmt": ["think", "answer"], "acc": ["answer"]},
                       "base": "dr_grpo"})
    assert dense(resp)[0] == [0.75, 0.75, 1.25, 1.25, 0.0]
    assert dense(resp)[1] == [-0.25, -0.25, -0.75, -0.75, 0.0]


def test_segment_component_carried_by_fewer_than_two_rollouts_gets_zero():
    resp = run(segment_group(), estimator="segment",
               params={"bindings": {"acc": ["answer"], "fmt": ["missing_label"]}})
    only_one = one_group(
        {"rewards": {"fmt": 1.0, "acc": 1.0}, "num_tokens": 4, "segments": THINK_ANSWER},
        {"rewards": {"fmt": 0.0, "acc": 0.0}, "num_tokens": 4, "segments": THINK_ANSWER[:1]})
    single = run(only_one, estimator="segment", params={"bindings": ROUTE})
    assert dense(single)[0][2:] == [0.0, 0.0]
    assert resp["report"]["segment"]["carriers"]["fmt"] == 0
    assert all(is_plus_zero(x) for x in dense(single)[0][2:])


def test_segment_excluded_rollout_gets_zero_and_leaves_every_baseline():
    groups = segment_group()
    groups[0]["rollouts"][2]["rewards"]["acc"] = None  # missing, no fallback: excluded
    resp = run(groups, estimator="segment", params={"bindings": ROUTE, "base": "dr_grpo"})
    got = dense(resp)
    assert got[2] == [0.0] * 5
    assert got[0][:4] == approx([2 / 3, 2 / 3, 0.5, 0.5])  # fmt over [1, 0, 0]; acc over [1, 0]
    assert resp["groups"][0]["rollouts"][2]["excluded"] is True


def test_segment_binding_of_an_unknown_component_is_a_422_naming_it():
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(segment_group(), estimator="segment", output="dense",
                                    params={"bindings": {"typo": ["think"]}}))
    [err] = info.value.errors
    assert err["loc"] == ["body", "advantage", "params", "bindings", "typo"]
    assert "no reward component 'typo'" in err["msg"] and "fmt" in err["msg"]


def test_segment_with_an_aggregate_other_than_sum_is_a_422():
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(segment_group(), estimator="segment", output="dense",
                                    aggregate="gdpo", params={"bindings": {"fmt": ["answer"]}}))
    [err] = info.value.errors
    assert err["loc"] == ["body", "advantage", "aggregate"]


@st.composite
def segmented_groups(draw: Any) -> list[dict[str, Any]]:
    groups = []
    for gi in range(draw(st.integers(1, 3))):
        rollouts = []
        for ri in range(draw(st.integers(1, 4))):
            n = draw(st.integers(0, 8))
            cuts = sorted(draw(st.lists(st.integers(0, n), min_size=2, max_size=4)))
            segments = [{"label": draw(st.sampled_from(["think", "answer", "tool"])),
                         "start": a, "end": b} for a, b in zip(cuts, cuts[1:]) if b > a]
            rollouts.append({"rollout_id": f"g{gi}r{ri}", "num_tokens": n,
                             "segments": segments,
                             "rewards": {"fmt": draw(st.sampled_from([0.0, 0.5, 1.0])),
                                         "acc": draw(st.sampled_from([0.0, 1.0, 2.0]))}})
        groups.append({"group_id": f"g{gi}", "rollouts": rollouts})
    return groups


@PROPERTY
@given(segmented_groups(), st.sampled_from(["zero", "total"]))
def test_property_segment_leaves_unrouted_tokens_at_the_documented_default(groups, default):
    resp = run(groups, estimator="segment", params={"bindings": ROUTE, "default": default,
                                                     "base": "dr_grpo"}, components=True)
    totals = run(groups, estimator="dr_grpo")
    for g in resp["groups"]:  # each component's advantages sum to 0 over its carriers
        for name in ROUTE:
            total = sum(r["component_advantages"][name] for r in g["rollouts"])
            assert total == pytest.approx(0.0, abs=TIGHT)
    flat = [r for g in groups for r in g["rollouts"]]
    for rollout, got, total in zip(flat, dense(resp), dense(totals)):
        routed = {t for s in rollout["segments"] if s["label"] in ("think", "answer")
                  for t in range(s["start"], s["end"])}
        for t, x in enumerate(got):
            if t not in routed:
                assert bits(x) == (bits(total[t]) if default == "total" else bits(0.0))


# ----------------------------------------------------------------------------- outcome_conditioned


def labelled(labels: list[str], rewards: list[float], **extra: Any) -> list[dict[str, Any]]:
    return one_group(*({"reward": r, "label": lab, "num_tokens": 3, **extra}
                       for lab, r in zip(labels, rewards)))


def test_outcome_conditioned_uses_the_stratum_mean_and_falls_back_to_the_group_mean():
    # p: [1, 0] mean .5; q and r alone (< min_stratum 2): group mean .5.
    resp = run(labelled(["p", "p", "q", "r"], [1.0, 0.0, 1.0, 0.0]),
               estimator="outcome_conditioned", output="scalar")
    assert [r["advantages"] for r in resp["groups"][0]["rollouts"]] == [0.5, -0.5, 0.5, -0.5]
    assert resp["report"]["outcome_conditioned"] == {"stratum_baselines": 2,
                                                     "group_fallbacks": 2}


def test_outcome_conditioned_min_stratum_decides_between_stratum_and_group():
    groups = labelled(["p", "p", "q", "q"], [1.0, 0.5, 0.0, 0.5])
    strata = run(groups, estimator="outcome_conditioned", output="scalar")
    group = run(groups, estimator="outcome_conditioned", params={"min_stratum": 3},
                output="scalar")
    assert [r["advantages"] for r in strata["groups"][0]["rollouts"]] == [0.25, -0.25, -0.25,
                                                                          0.25]
    assert [r["advantages"] for r in group["groups"][0]["rollouts"]] == [0.5, 0.0, -0.5, 0.0]


def test_outcome_conditioned_normalize_divides_by_the_std_of_the_baseline_set():
    resp = run(labelled(["p", "p", "q", "r"], [1.0, 0.0, 1.0, 0.0]),
               estimator="outcome_conditioned", params={"normalize": True}, output="scalar")
    s_p, s_g = std1([1.0, 0.0]), std1([1.0, 0.0, 1.0, 0.0])
    got = [r["advantages"] for r in resp["groups"][0]["rollouts"]]
    assert got == approx([0.5 / (s_p + EPS), -0.5 / (s_p + EPS), 0.5 / (s_g + EPS),
                          -0.5 / (s_g + EPS)])


def test_outcome_conditioned_zero_spread_stratum_gets_exactly_zero():
    resp = run(labelled(["p", "p", "p", "q", "q"], [0.1, 0.1, 0.1, 1.0, 0.0]),
               estimator="outcome_conditioned", params={"normalize": True}, output="scalar")
    got = [r["advantages"] for r in resp["groups"][0]["rollouts"]]
    assert all(is_plus_zero(x) for x in got[:3])
    assert got[3] > 0 > got[4]


def test_outcome_conditioned_block_applies_only_to_the_tokens_of_that_block():
    seg = [{"label": "reason", "start": 0, "end": 2}, {"label": "confidence", "start": 2,
                                                        "end": 3}]
    groups = labelled(["p", "p", "q", "q"], [1.0, 0.5, 0.0, 0.5], segments=seg)
    groups[0]["rollouts"][3]["segments"] = seg[:1]
    resp = run(groups, estimator="outcome_conditioned", params={"block": "confidence"})
    assert dense(resp) == [[0.0, 0.0, 0.25], [0.0, 0.0, -0.25], [0.0, 0.0, -0.25],
                           [0.0, 0.0, 0.0]]


# ----------------------------------------------------------------------------- turn


def turns(*spans: tuple[int, int, float | None]) -> list[dict[str, Any]]:
    return [{"start": a, "end": b, **({"reward": r} if r is not None else {})}
            for a, b, r in spans]


def test_turn_golden_discounted_returns_normalised_per_turn_index():
    # gamma .5: returns r0 [1 + .5*0, 0] = [1, 0]; r1 [0 + .5*1, 1] = [.5, 1]; r2 [0].
    # Turn 0 over [1, .5, 0]: mean .5, std .5. Turn 1 over [0, 1]: mean .5, std sqrt(.5).
    # Turns are ordered by start even when sent out of order; token 5 is outside all turns.
    groups = one_group(
        {"reward": 1.0, "num_tokens": 6, "turns": turns((3, 5, 0.0), (0, 2, 1.0))},
        {"reward": 0.0, "num_tokens": 4, "turns": turns((0, 2, None), (2, 4, 1.0))},
        {"reward": 0.0, "num_tokens": 2, "turns": turns((0, 2, 0.0))})
    resp = run(groups, estimator="turn", params={"gamma": 0.5})
    t0, t1 = 0.5 / (0.5 + EPS), 0.5 / (std1([0.0, 1.0]) + EPS)
    got = dense(resp)
    assert got[0] == approx([t0, t0, 0.0, -t1, -t1, 0.0])
    assert got[1] == approx([0.0, 0.0, t1, t1])
    assert got[2] == approx([-t0, -t0])


def test_turn_dr_grpo_with_gamma_one_uses_undiscounted_returns():
    # returns r0 [1, 1]; r1 [2, 1]; turn 0 [1, 2] mean 1.5; turn 1 [1, 1] zero spread.
    groups = one_group(
        {"reward": 1.0, "num_tokens": 2, "turns": turns((0, 1, 0.0), (1, 2, 1.0))},
        {"reward": 0.0, "num_tokens": 3, "turns": turns((0, 1, 1.0), (2, 3, 1.0))})
    resp = run(groups, estimator="turn", params={"base": "dr_grpo"})
    assert dense(resp) == [[-0.5, 0.0], [0.5, 0.0, 0.0]]


def test_turn_index_reached_by_one_rollout_gets_zero():
    groups = one_group(
        {"reward": 1.0, "num_tokens": 2, "turns": turns((0, 1, 1.0), (1, 2, 5.0))},
        {"reward": 0.0, "num_tokens": 1, "turns": turns((0, 1, 0.0))})
    got = dense(run(groups, estimator="turn", params={"base": "dr_grpo"}))
    assert got == [[3.0, 0.0], [-3.0]]


# ----------------------------------------------------------------------------- gigpo / bipace


def steps(*spans: tuple[int, int, str | None], rewards: list[float] | None = None,
          embeddings: list[list[float]] | None = None) -> list[dict[str, Any]]:
    out = []
    for k, (a, b, key) in enumerate(spans):
        step: dict[str, Any] = {"start": a, "end": b, "key": key}
        if rewards is not None:
            step["reward"] = rewards[k]
        if embeddings is not None:
            step["embedding"] = embeddings[k]
        out.append(step)
    return out


def gigpo_group() -> list[dict[str, Any]]:
    return one_group(
        {"reward": 1.0, "num_tokens": 6, "steps": steps((0, 2, "A"), (2, 4, "B"))},
        {"reward": 0.0, "num_tokens": 4, "steps": steps((0, 2, "A"), (2, 4, "C"))},
        {"reward": 0.5, "num_tokens": 2, "steps": steps((0, 2, "A"))})


def test_gigpo_golden_episode_term_plus_step_term_on_the_steps_tokens():
    # Episode GRPO of [1, 0, .5]: mean .5, std .5 -> e = .5/(.5+eps), -e, 0.
    # Outcome added at each last step, gamma 1: step A returns [1, 0, .5] -> [.5, -.5, 0].
    # B and C are singleton step groups: 0. Tokens 4-5 of r0 are outside steps: episode only.
    resp = run(gigpo_group(), estimator="gigpo")
    e = 0.5 / (0.5 + EPS)
    got = dense(resp)
    assert got[0] == approx([e + 0.5, e + 0.5, e, e, e, e])
    assert got[1] == approx([-e - 0.5, -e - 0.5, -e, -e])
    assert got[2] == [0.0, 0.0]
    assert resp["report"]["gigpo"] == {"step_groups": 1, "singleton_rate": 0.4}


def test_gigpo_discount_and_omega():
    # gamma .5: step A returns [.5 * 1, .5 * 0, .5] -> mean 1/3.
    resp = run(gigpo_group(), estimator="gigpo", params={"gamma": 0.5, "omega": 2.0})
    e = 0.5 / (0.5 + EPS)
    m = (0.5 + 0.0 + 0.5) / 3
    got = dense(resp)
    assert got[0][:3] == approx([e + 2 * (0.5 - m)] * 2 + [e])
    assert got[1][:2] == approx([-e + 2 * (0.0 - m)] * 2)
    assert got[2] == approx([2 * (0.5 - m)] * 2)


def test_gigpo_step_rewards_alone_when_the_outcome_is_not_added_at_the_last_step():
    groups = one_group(
        {"reward": 1.0, "num_tokens": 2, "steps": steps((0, 1, "A"), (1, 2, "B"),
                                                        rewards=[0.0, 2.0])},
        {"reward": 0.0, "num_tokens": 1, "steps": steps((0, 1, "A"), rewards=[1.0])})
    resp = run(groups, estimator="gigpo", params={"outcome_at_last_step": False,
                                                   "omega": 1.0})
    e = 0.5 / (std1([1.0, 0.0]) + EPS)
    # step A returns: r0 0 + 2 = 2, r1 1 -> mean 1.5
    assert dense(resp) == approx([[e + 0.5, e], [-e - 0.5]])


def test_gigpo_mean_std_step_norm_divides_by_the_step_group_std():
    resp = run(gigpo_group(), estimator="gigpo", params={"step_norm": "mean_std"})
    e = 0.5 / (0.5 + EPS)
    s = 0.5 / (std1([1.0, 0.0, 0.5]) + EPS)
    assert dense(resp)[0][:2] == approx([e + s] * 2)


def test_gigpo_step_without_a_key_is_a_singleton_step_group():
    groups = gigpo_group()
    groups[0]["rollouts"][2]["steps"][0]["key"] = None
    resp = run(groups, estimator="gigpo", params={"step_norm": "mean"})
    e = 0.5 / (0.5 + EPS)
    assert dense(resp)[0][:2] == approx([e + 0.5] * 2)  # A over [1, 0] only
    assert dense(resp)[2] == [0.0, 0.0]


@st.composite
def step_groups(draw: Any, distinct_keys: bool = False) -> list[dict[str, Any]]:
    groups, counter = [], 0
    for gi in range(draw(st.integers(1, 3))):
        rollouts = []
        for ri in range(draw(st.integers(1, 4))):
            n = draw(st.integers(0, 8))
            cuts = sorted(set(draw(st.lists(st.integers(0, n), min_size=2, max_size=5))))
            spans = []
            for a, b in zip(cuts, cuts[1:]):
                counter += 1
                key = f"k{counter}" if distinct_keys else draw(st.sampled_from(["x", "y", "z"]))
                spans.append({"start": a, "end": b, "key": key,
                              "reward": draw(st.sampled_from([0.0, 0.5, 1.0])),
                              "embedding": [float(counter), 1.0] if distinct_keys else
                              draw(st.sampled_from([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]]))})
            rollout: dict[str, Any] = {
                "rollout_id": f"g{gi}r{ri}", "num_tokens": n, "steps": spans,
                "reward": draw(st.sampled_from([0.0, 0.25, 1.0, 3.0]))}
            if draw(st.booleans()):
                rollout["mask"] = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
            rollouts.append(rollout)
        groups.append({"group_id": f"g{gi}", "rollouts": rollouts})
    return groups


@PROPERTY
@given(step_groups(distinct_keys=True), st.sampled_from(["rewardd", "verl", "trl"]),
       st.sampled_from([0.5, 1.0]))
def test_property_gigpo_with_all_singleton_step_groups_equals_its_episode_term(groups, profile,
                                                                              gamma):
    episode = dense(run(groups, estimator="grpo", profile=profile))
    got = dense(run(groups, estimator="gigpo", profile=profile, params={"gamma": gamma}))
    assert [[bits(x) for x in r] for r in got] == [[bits(x) for x in r] for r in episode]


def test_bipace_groups_similar_embeddings_like_gigpo_groups_equal_keys():
    emb = {"A": [1.0, 0.0], "A'": [0.99, 0.05], "B": [0.0, 1.0], "C": [-1.0, 0.2]}
    groups = one_group(
        {"reward": 1.0, "num_tokens": 6,
         "steps": steps((0, 2, None), (2, 4, None), embeddings=[emb["A"], emb["B"]])},
        {"reward": 0.0, "num_tokens": 4,
         "steps": steps((0, 2, None), (2, 4, None), embeddings=[emb["A'"], emb["C"]])},
        {"reward": 0.5, "num_tokens": 2, "steps": steps((0, 2, None), embeddings=[emb["A"]])})
    resp = run(groups, estimator="bipace")
    assert dense(resp) == dense(run(gigpo_group(), estimator="gigpo"))
    assert resp["report"]["bipace"] == {"step_groups": 1, "singleton_rate": 0.4}
    apart = run(groups, estimator="bipace", params={"threshold": 0.9999})
    assert apart["report"]["bipace"]["singleton_rate"] == 0.6  # A' leaves A's cluster


def test_bipace_leader_clustering_does_not_chain_through_a_non_leader():
    # a ~ b and b ~ c, but a !~ c: b joins a's cluster, c becomes its own leader.
    angle = math.radians(40)
    emb = torch.tensor([[1.0, 0.0], [math.cos(angle), math.sin(angle)],
                        [math.cos(2 * angle), math.sin(2 * angle)]], dtype=torch.float64)
    ids = leader_clusters(emb, torch.zeros(3, dtype=torch.int64),
                          torch.ones(3, dtype=torch.bool), threshold=0.7)
    assert ids[0] == ids[1] != ids[2]


def test_bipace_clusters_never_cross_groups_and_skip_excluded_steps():
    emb = torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)
    ids = leader_clusters(emb, torch.tensor([0, 1, 0, 1]),
                          torch.tensor([True, True, True, False]), threshold=0.9)
    assert ids[0] == ids[2] and ids[1] != ids[0] and len({*ids.tolist()}) == 3


def test_bipace_embeddings_of_different_dimensions_are_a_422():
    groups = one_group(
        {"reward": 1.0, "num_tokens": 1, "steps": steps((0, 1, None), embeddings=[[1.0]])},
        {"reward": 0.0, "num_tokens": 1, "steps": steps((0, 1, None),
                                                        embeddings=[[1.0, 0.0]])})
    with pytest.raises(RequestInvalid, match="one dimension"):
        pipeline_advantages(request(groups, estimator="bipace", output="dense"))


# ----------------------------------------------------------------------------- tempo


def tempo_reference(tokens: list[list[int]], rewards: list[float], beta: float = 1.0
                    ) -> list[list[tuple[float, bool]]]:
    """Naive Prefix-to-Tree over tuples: (advantage, branches) per token, rewardd profile."""
    a = grpo_of(rewards)
    flat = min(rewards) == max(rewards)
    below: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for seq, r in zip(tokens, rewards):
        for t in range(len(seq) + 1):
            below[tuple(seq[:t])].append(r)
    out = []
    for seq, ai in zip(tokens, a):
        row = []
        for t in range(len(seq)):
            node, child = below[tuple(seq[:t])], below[tuple(seq[:t + 1])]
            branch = t > 0 and len(child) < len(node) and not flat
            td = sum(child) / len(child) - sum(node) / len(node) if branch else 0.0
            row.append((ai + beta * td, branch))
        out.append(row)
    return out


def token_group(tokens: list[list[int]], rewards: list[float], gid: str = "g",
                masks: list[list[int] | None] | None = None) -> dict[str, Any]:
    rollouts = []
    for i, (seq, r) in enumerate(zip(tokens, rewards)):
        rollout: dict[str, Any] = {"rollout_id": f"{gid}r{i}", "reward": r, "token_ids": seq}
        if masks is not None and masks[i] is not None:
            rollout["mask"] = masks[i]
        rollouts.append(rollout)
    return {"group_id": gid, "rollouts": rollouts}


def test_tempo_golden_adds_the_value_difference_at_the_branching_token_only():
    # Tree: [1] -> [1,2] shared by r0 and r1 (V .5), then [1,2,3] (V 1) and [1,2,4] (V 0).
    # r2 shares nothing: exactly GRPO. GRPO of [1,0,0]: mean 1/3, std sqrt(1/3).
    resp = run([token_group([[1, 2, 3], [1, 2, 4], [5, 6]], [1.0, 0.0, 0.0])], estimator="tempo")
    s = std1([1.0, 0.0, 0.0])
    hi, lo = (2 / 3) / (s + EPS), (-1 / 3) / (s + EPS)
    got = dense(resp)
    assert got == approx([[hi, hi, hi + 0.5], [lo, lo, lo - 0.5], [lo, lo]])
    assert resp["report"]["tempo"] == {"branch_tokens": 2}


def test_tempo_rollout_ending_at_a_shared_node_makes_the_continuation_branch():
    # r0 ends at [1, 2]; r1 continues with 3: V([1,2]) = .5, V([1,2,3]) = 0.
    resp = run([token_group([[1, 2], [1, 2, 3]], [1.0, 0.0])], estimator="tempo",
               params={"beta": 2.0})
    a = 0.5 / (std1([1.0, 0.0]) + EPS)
    assert dense(resp) == approx([[a, a], [-a, -a, -a + 2.0 * (0.0 - 0.5)]])


def test_tempo_excluded_rollout_takes_no_part_in_the_tree():
    groups = [token_group([[1, 2, 3], [1, 2, 4], [1, 2, 4]], [1.0, 0.0, 0.0])]
    groups[0]["rollouts"][2]["rewards"] = {"x": None}
    del groups[0]["rollouts"][2]["reward"]
    for r in groups[0]["rollouts"][:2]:
        r["rewards"] = {"x": r.pop("reward")}
    resp = run(groups, estimator="tempo")
    a = 0.5 / (std1([1.0, 0.0]) + EPS)
    assert dense(resp) == approx([[a, a, a + 0.5], [-a, -a, -a - 0.5], [0.0, 0.0, 0.0]])


def test_tempo_under_verl_profile_keeps_grpo_singleton_value_on_a_lone_rollout():
    resp = run([token_group([[1, 2]], [0.5])], estimator="tempo", profile="verl")
    assert dense(resp) == approx([[0.5 / (1 + EPS)] * 2])


def test_tree_walk_finds_deep_branches_and_never_shares_across_groups():
    # Group 0: r2 ends at [3,1,4] (V 2/3 with r0, r1); [3,1,4,1] (V .5) is a branch for r0, r1;
    # then r0 and r1 share down to [3,1,4,1,5,9] and split on the last token (V 1 and 0).
    # Group 1 holds the same tokens as r2 but shares nothing with group 0.
    seqs = [[3, 1, 4, 1, 5, 9, 2], [3, 1, 4, 1, 5, 9, 3], [3, 1, 4], [3, 1, 4]]
    batch = AdvantageBatch(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64),
                           group=torch.tensor([0, 0, 0, 1]), valid=torch.ones(4, dtype=torch.bool),
                           num_tokens=torch.tensor([len(s) for s in seqs]), num_groups=2,
                           token_ids=torch.tensor([t for s in seqs for t in s]))
    token, td = branch_differences(batch, torch.arange(4), torch.zeros(2, dtype=torch.bool))
    got = sorted(zip(token.tolist(), td.tolist()))
    assert got == [(3, pytest.approx(0.5 - 2 / 3, abs=TIGHT)), (6, 0.5),
                   (10, pytest.approx(0.5 - 2 / 3, abs=TIGHT)), (13, -0.5)]


@st.composite
def token_groups(draw: Any, shared: bool = True) -> list[dict[str, Any]]:
    groups = []
    for gi in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, 5))
        tokens = []
        for ri in range(size):
            body = draw(st.lists(st.integers(0, 2), min_size=0, max_size=9))
            # distinct first tokens leave no shared prefix at all
            tokens.append(body if shared else [100 + ri] + body)
        rewards = draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, 0.1, 2.0]), min_size=size,
                                max_size=size))
        masks = [draw(st.one_of(st.none(), st.lists(st.integers(0, 1), min_size=len(t),
                                                    max_size=len(t)))) for t in tokens]
        groups.append(token_group(tokens, rewards, f"g{gi}", masks))
    return groups


@PROPERTY
@given(token_groups(), st.sampled_from([1.0, 0.5]))
def test_property_tempo_is_exactly_grpo_at_non_branching_tokens_and_the_tree_td_elsewhere(
        groups, beta):
    got = dense(run(groups, estimator="tempo", params={"beta": beta}))
    grpo = dense(run(groups, estimator="grpo"))
    flat = [r for g in groups for r in g["rollouts"]]
    k = 0
    for g in groups:
        ref = tempo_reference([r["token_ids"] for r in g["rollouts"]],
                              [r["reward"] for r in g["rollouts"]], beta)
        for row in ref:
            mask = flat[k].get("mask") or [1] * len(row)
            for t, (value, branch) in enumerate(row):
                if not mask[t]:
                    assert is_plus_zero(got[k][t])
                elif branch:
                    assert got[k][t] == pytest.approx(value, abs=TIGHT, rel=0)
                else:
                    assert bits(got[k][t]) == bits(grpo[k][t])
            k += 1


@PROPERTY
@given(token_groups(shared=False))
def test_property_tempo_equals_grpo_on_groups_without_shared_prefixes(groups):
    got = dense(run(groups, estimator="tempo"))
    grpo = dense(run(groups, estimator="grpo"))
    assert [[bits(x) for x in r] for r in got] == [[bits(x) for x in r] for r in grpo]


# ----------------------------------------------------------------------------- shared


def test_discounted_suffix_sum_matches_the_backward_recursion_over_runs():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], dtype=torch.float64)
    remaining = torch.tensor([2, 1, 0, 3, 2, 1, 0])  # runs of 3 and 4
    got = discounted_suffix_sum(values, remaining, 0.5).tolist()
    assert got == [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0,
                   4 + 0.5 * 5 + 0.25 * 6 + 0.125 * 7, 5 + 0.5 * 6 + 0.25 * 7, 6 + 0.5 * 7, 7.0]


def full_rollout(n: int, reward: float, label: str, mask: list[int]) -> dict[str, Any]:
    half = n // 2
    spans = [(0, half), (half, n)] if half else [(0, n)]
    spans = [(a, b) for a, b in spans if b > a]
    return {"reward": reward, "num_tokens": n, "token_ids": [t % 3 for t in range(n)],
            "mask": mask, "label": label,
            "segments": [{"label": ("think", "answer")[k], "start": a, "end": b}
                         for k, (a, b) in enumerate(spans)],
            "turns": [{"start": a, "end": b, "reward": reward * k} for k, (a, b) in
                      enumerate(spans)],
            "steps": [{"start": a, "end": b, "key": "s", "embedding": [1.0, float(k)],
                       "reward": reward} for k, (a, b) in enumerate(spans)]}


@st.composite
def full_groups(draw: Any) -> list[dict[str, Any]]:
    rollouts = []
    for _ in range(draw(st.integers(2, 5))):
        n = draw(st.integers(1, 7))
        rollouts.append(full_rollout(
            n, draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])), draw(st.sampled_from("pq")),
            draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))))
    return one_group(*rollouts)


ENTRIES = {"segment": {"bindings": {"reward": ["answer"]}, "default": "total"},
           "outcome_conditioned": {"block": "answer"}, "turn": {}, "gigpo": {},
           "bipace": {"threshold": 0.5}, "tempo": {}}


@PROPERTY
@given(full_groups(), st.sampled_from(sorted(ENTRIES)))
def test_property_masked_tokens_are_exactly_plus_zero_for_every_routing_entry(groups, name):
    resp = run(groups, estimator=name, params=ENTRIES[name])
    for rollout, got in zip(groups[0]["rollouts"], dense(resp)):
        assert len(got) == rollout["num_tokens"]
        for m, x in zip(rollout["mask"], got):
            if not m:
                assert is_plus_zero(x)
            assert math.isfinite(x)


@pytest.mark.parametrize("name,field,loc_tail", [
    ("tempo", "token_ids", "token_ids"), ("segment", "segments", "segments"),
    ("gigpo", "steps", "steps"), ("turn", "turns", "turns"),
    ("outcome_conditioned", "label", "label"), ("bipace", "embedding", "steps")])
def test_missing_input_is_a_422_naming_the_field_and_the_entry(name, field, loc_tail):
    rollout = full_rollout(4, 1.0, "p", [1, 1, 1, 1])
    broken = full_rollout(4, 0.0, "q", [1, 1, 1, 1])
    if field == "embedding":
        del broken["steps"][0]["embedding"]
    else:
        del broken[field]
        if field == "token_ids":
            broken["num_tokens"] = 4
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(one_group(rollout, broken), estimator=name,
                                    output="dense"))
    [err] = info.value.errors
    assert err["loc"] == ["body", "groups", 0, "rollouts", 1, loc_tail]
    assert f"estimator {name!r}" in err["msg"] and field in err["msg"]
    assert err["type"] == "missing"


@pytest.mark.parametrize("name,inputs", [
    ("segment", ("segments", "components")), ("outcome_conditioned", ("label",)), ("turn", ("turns",)),
    ("gigpo", ("steps",)), ("bipace", ("steps", "embeddings")), ("tempo", ("token_ids",))])
def test_routing_entries_are_token_level_estimators_declaring_their_inputs(name, inputs):
    entry = get_estimator(name)
    assert entry.inputs == inputs and entry.kind == "estimator" and not entry.stateful
    assert entry.description and entry.formula and entry.source
    for field in entry.Params.model_fields.values():
        assert field.description  # attribute docstrings reach GET /v1/estimators


def test_rle_output_of_a_routed_estimator_decodes_to_its_dense_output():
    dense_resp = run(gigpo_group(), estimator="gigpo")
    rle = run(gigpo_group(), estimator="gigpo", output="rle")
    for d, r in zip(dense(dense_resp), [r["advantages"]["rle"] for r in
                                        rle["groups"][0]["rollouts"]]):
        assert [bits(x) for x in decode_rle(r)] == [bits(x) for x in d]


def test_outcome_conditioned_with_a_block_needs_segments_on_every_rollout():
    groups = [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "reward": 1.0, "num_tokens": 2, "label": "x",
         "segments": [{"label": "answer", "start": 0, "end": 2}]},
        {"rollout_id": "b", "reward": 0.0, "num_tokens": 2, "label": "x"}]}]
    with pytest.raises(RequestInvalid) as info:
        pipeline_advantages(request(groups, estimator="outcome_conditioned", output="dense",
                                    params={"block": "answer"}))
    [err] = info.value.errors
    assert err["loc"] == ["body", "groups", 0, "rollouts", 1, "segments"]
    assert "outcome_conditioned" in err["msg"]
