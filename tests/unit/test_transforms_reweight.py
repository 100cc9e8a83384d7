"""Reward transforms (rank, overlong, prm_clip, prm_delta, rubric_keep_mask) and reweighting
(difficulty, ha_dw, uniqueness, gagar, glpo, modulate).

Golden values are worked out by hand in each test (the arithmetic is written next to the
expected numbers). Entries are checked directly on a batch built the way the service builds
it, and through ``rewardd.service.pipeline.advantages`` with the response validated against
ScoreResponse; ha_dw's run state also through the HTTP app.
"""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from typing import Any, Iterator, Sequence

import orjson
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardd.advantages import ENTRIES, AdvantageBatch, Advantages, decode_rle, pins_for
from rewardd.advantages.reweight import gagar, modulate, uniqueness
from rewardd.advantages.transforms import group_ranks, overlong, prm_clip, prm_delta, rank
from rewardd.service.app import create_app
from rewardd.advantages.inputs import build_batch
from rewardd.service.models import AdvantagesRequest, ScoreResponse
from rewardd.verifiers.dropout import rubric_keep_mask
from rewardd.service.pipeline import advantages as pipeline_advantages
from rewardd.service.runstate import MemoryRunStore, RunStore
from rewardd.service.settings import Settings
from rewardd.advantages.table import FlatBatch, combine, precomputed_columns
from rewardd.advantages.errors import RequestInvalid
from tests.support.executors import RefusingExecutor

TIGHT = 1e-12
PINS = pins_for("rewardd")

# ----------------------------------------------------------------------------- helpers


def groups_of(rewards: Sequence[Sequence[float | None]], **fields: Sequence[Sequence[Any]]
              ) -> list[dict[str, Any]]:
    """Groups of rollouts with the given rewards (None: no reward, so the rollout is
    excluded) and, per keyword, one value per rollout for that rollout field."""
    out = []
    for gi, group in enumerate(rewards):
        rollouts = []
        for ri, reward in enumerate(group):
            rollout: dict[str, Any] = {"rollout_id": f"g{gi}r{ri}"}
            if reward is not None:
                rollout["reward"] = reward
            for name, values in fields.items():
                rollout[name] = values[gi][ri]
            rollouts.append(rollout)
        out.append({"group_id": f"g{gi}", "rollouts": rollouts})
    return out


def batch_of(groups: list[dict[str, Any]]) -> AdvantageBatch:
    """The flat batch the service builds for these groups."""
    req = AdvantagesRequest.model_validate({"groups": groups})
    flat = FlatBatch.of(req.groups)
    columns = precomputed_columns(flat.rollouts, {})
    return build_batch(flat, combine(columns, len(flat.rollouts)), columns)


def assert_valid_response(resp: dict[str, Any]) -> ScoreResponse:
    wire = orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY)
    return ScoreResponse.model_validate(orjson.loads(wire))


def run(groups: list[dict[str, Any]], *, runs: RunStore | None = None,
        run_id: str | None = None, **advantage: Any) -> dict[str, Any]:
    req = AdvantagesRequest.model_validate(
        {"run_id": run_id, "groups": groups, "advantage": advantage})
    resp = pipeline_advantages(req, runs)
    assert_valid_response(resp)
    return resp


def scalars(resp: dict[str, Any]) -> list[float]:
    return [r["advantages"] for g in resp["groups"] for r in g["rollouts"]]


def dense(resp: dict[str, Any]) -> list[list[float]]:
    return [list(r["advantages"]) for g in resp["groups"] for r in g["rollouts"]]


def rejected(groups: list[dict[str, Any]], run_id: str | None = None,
             **advantage: Any) -> dict[str, Any]:
    """The single error of a request that must be a 422."""
    advantage.setdefault("output", "scalar")
    with pytest.raises(RequestInvalid) as exc:
        pipeline_advantages(AdvantagesRequest.model_validate(
            {"run_id": run_id, "groups": groups, "advantage": advantage}))
    assert len(exc.value.errors) == 1, exc.value.errors
    return exc.value.errors[0]


def close(actual: Sequence[float], expected: Sequence[float], tol: float = TIGHT) -> bool:
    return len(actual) == len(expected) and all(
        abs(a - e) <= tol * max(1.0, abs(e)) for a, e in zip(actual, expected))


def rollout_advantages(values: Sequence[float]) -> Advantages:
    return Advantages(rollout=torch.tensor(values, dtype=torch.float64))


# ============================================================================= transforms
# ----------------------------------------------------------------------------- rank


def test_rank_replaces_rewards_by_scaled_within_group_ranks_with_ties_averaged() -> None:
    # sorted 1 < 2 < 3 = 3: ranks 0, 1, (2+3)/2 = 2.5; scaled by n - 1 = 3
    batch = rank(batch_of(groups_of([[3.0, 1.0, 3.0, 2.0]])), None, PINS)
    assert batch.rewards.tolist() == [2.5 / 3, 0.0, 2.5 / 3, 1 / 3]


def test_rank_gives_a_lone_rollout_and_an_all_tied_group_the_middle_of_the_scale() -> None:
    batch = rank(batch_of(groups_of([[7.0], [4.0, 4.0, 4.0]])), None, PINS)
    assert batch.rewards.tolist() == [0.5, 0.5, 0.5, 0.5]


def test_rank_ranks_only_included_rollouts_and_gives_excluded_zero() -> None:
    # included 5 and 1 -> 1 and 0; the excluded rollout (no reward) neither ranks nor counts
    batch = rank(batch_of(groups_of([[5.0, None, 1.0]])), None, PINS)
    assert batch.valid.tolist() == [True, False, True]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0]


def test_rank_then_dr_grpo_through_the_request_path() -> None:
    # ranks [5/6, 0, 5/6, 1/3], mean 0.5 -> [1/3, -1/2, 1/3, -1/6]; group 2 ties -> 0
    resp = run(groups_of([[3.0, 1.0, 3.0, 2.0], [2.0, 2.0]]), estimator="dr_grpo",
               transforms=[{"name": "rank"}], output="scalar")
    assert close(scalars(resp), [1 / 3, -1 / 2, 1 / 3, -1 / 6, 0.0, 0.0])
    assert resp["groups"][1]["diagnostics"]["zero_spread"] is True


def naive_average_ranks(values: list[float]) -> list[float]:
    return [sum(v < x for v in values) + (sum(v == x for v in values) - 1) / 2 for x in values]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3), min_size=1, max_size=6), min_size=1, max_size=5))
def test_group_ranks_match_a_naive_count_of_smaller_and_tied_values(
        groups: list[list[int]]) -> None:
    values = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    group = torch.tensor([gi for gi, g in enumerate(groups) for _ in g])
    include = torch.ones_like(group, dtype=torch.bool)
    min_rank, mean_rank, count = group_ranks(group, values, include, len(groups))
    floats = [[float(v) for v in g] for g in groups]
    assert mean_rank.tolist() == [r for g in floats for r in naive_average_ranks(g)]
    assert min_rank.tolist() == [sum(v < x for v in g) for g in floats for x in g]
    assert count.tolist() == [len(g) for g in groups]


# ----------------------------------------------------------------------------- overlong


def test_overlong_penalises_linearly_inside_the_buffer_and_clips_at_the_limit() -> None:
    # L_max 100, buffer 20: free up to 80; 90 -> -(90-80)/20 = -0.5; 100 -> -1; 150 -> -1
    groups = groups_of([[1.0] * 5], num_tokens=[[50, 80, 90, 100, 150]])
    params = ENTRIES["overlong"].Params(max_length=100, buffer=20)
    assert overlong(batch_of(groups), params, PINS).rewards.tolist() == [1.0, 1.0, 0.5, 0.0, 0.0]
    doubled = ENTRIES["overlong"].Params(max_length=100, buffer=20, factor=2.0)
    assert overlong(batch_of(groups), doubled, PINS).rewards.tolist() == [1.0, 1.0, 0.0, -1.0,
                                                                          -1.0]


def test_overlong_through_the_request_path_changes_the_advantages() -> None:
    # rewards 1, 1 -> 1, 0.5 (L = 90 of 100, buffer 20); dr_grpo: mean 0.75 -> 0.25, -0.25
    resp = run(groups_of([[1.0, 1.0]], num_tokens=[[10, 90]]), estimator="dr_grpo",
               transforms=[{"name": "overlong", "params": {"max_length": 100, "buffer": 20}}],
               output="scalar")
    assert scalars(resp) == [0.25, -0.25]


def test_overlong_rejects_a_buffer_longer_than_max_length() -> None:
    err = rejected(groups_of([[1.0, 0.0]], num_tokens=[[1, 1]]),
                   transforms=[{"name": "overlong",
                                "params": {"max_length": 10, "buffer": 20}}])
    assert err["loc"][:4] == ["body", "advantage", "transforms", 0]
    assert "buffer 20 is larger than max_length 10" in err["msg"]


# ----------------------------------------------------------------------------- process rewards


def step(start: int, end: int, reward: float | None) -> dict[str, Any]:
    return {"start": start, "end": end, "reward": reward}


def prm_groups(token_rewards: list[float] | None = None) -> list[dict[str, Any]]:
    # rollout 0: steps [0,2) 0.5, [2,5) -0.25, [5,6) 1.0, sent out of order, plus a step
    # without a reward; rollout 1: one step [0,3) 2.0
    first: dict[str, Any] = {"rollout_id": "a", "reward": 1.0, "num_tokens": 7, "steps": [
        step(5, 6, 1.0), step(0, 2, 0.5), step(6, 7, None), step(2, 5, -0.25)]}
    if token_rewards is not None:
        first["token_rewards"] = token_rewards
    second = {"rollout_id": "b", "reward": 0.0, "num_tokens": 3, "steps": [step(0, 3, 2.0)]}
    return [{"group_id": "g", "rollouts": [first, second]}]


def test_prm_clip_writes_min_r_minus_eta_0_at_each_steps_last_token() -> None:
    # eta 0.25: 0.5 -> 0, -0.25 -> -0.5, 1.0 -> 0, 2.0 -> 0; the last tokens are 1, 4, 5 and 2
    params = ENTRIES["prm_clip"].Params(eta=0.25)
    batch = prm_clip(batch_of(prm_groups()), params, PINS)
    assert batch.token_rewards.tolist() == [0.0, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0,
                                            0.0, 0.0, 0.0]
    assert batch.rewards.tolist() == [1.0, 0.0]


def test_prm_clip_adds_to_the_token_rewards_the_trainer_sent() -> None:
    # eta 0 (default): 0.5 -> 0, -0.25 -> -0.25, 1.0 -> 0; sent 1.0 on token 6 stays
    batch = prm_clip(batch_of(prm_groups([0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0])),
                     ENTRIES["prm_clip"].Params(), PINS)
    assert batch.token_rewards.tolist() == [0.0, 0.0, 0.0, 0.0, 0.25, 0.0, 1.0,
                                            0.0, 0.0, 0.0]


def test_prm_delta_subtracts_the_next_steps_reward_and_the_last_step_keeps_its_own() -> None:
    # rollout 0 in token order 0.5, -0.25, 1.0 -> 0.75, -1.25, 1.0; rollout 1: 2.0 (last)
    batch = prm_delta(batch_of(prm_groups()), None, PINS)
    assert batch.token_rewards.tolist() == [0.0, 0.75, 0.0, 0.0, -1.25, 1.0, 0.0,
                                            0.0, 0.0, 2.0]
    # the return from the first step telescopes to its own reward
    assert sum(batch.token_rewards[:7].tolist()) == 0.5


def test_prm_transforms_need_steps_on_every_rollout() -> None:
    for name in ("prm_clip", "prm_delta"):
        err = rejected(groups_of([[1.0, 0.0]], num_tokens=[[2, 2]]),
                       transforms=[{"name": name}])
        assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "steps"]
        assert err["msg"] == f"transform {name!r} needs steps on every rollout"


def test_prm_transform_passes_through_the_request_path() -> None:
    # grpo reads scalar rewards only: rewards 1, 0 -> +-1/(std + eps), std = sqrt(0.5)
    resp = run(prm_groups(), estimator="grpo", transforms=[{"name": "prm_delta"}],
               output="scalar")
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert close(scalars(resp), [a, -a])


# ----------------------------------------------------------------------------- rubric dropout


def test_rubric_keep_mask_drops_round_p_n_criteria_and_keeps_at_least_one() -> None:
    for n, p, kept in [(10, 0.3, 7), (10, 0.5, 5), (4, 0.25, 3), (3, 0.5, 1), (3, 1.0, 1),
                       (5, 0.0, 5), (1, 0.9, 1)]:
        mask = rubric_keep_mask(n, p, seed=7, run_id="run", group_id="g", step=3)
        assert len(mask) == n and sum(mask) == kept, (n, p, mask)
    assert rubric_keep_mask(0, 0.5, seed=0, run_id=None, group_id="g") == []


def test_rubric_keep_mask_is_the_full_rubric_for_evaluation() -> None:
    assert rubric_keep_mask(6, 0.0, seed=1, run_id="r", group_id="g", step=9) == [True] * 6


def test_rubric_keep_mask_is_a_function_of_seed_run_group_and_step() -> None:
    def mask(**changes: Any) -> list[bool]:
        args: dict[str, Any] = {"seed": 1, "run_id": "run", "group_id": "g", "step": 0}
        args.update(changes)
        return rubric_keep_mask(20, 0.5, **args)

    assert mask() == mask()
    for change in ({"seed": 2}, {"run_id": "other"}, {"run_id": None}, {"group_id": "h"},
                   {"step": 1}):
        # 20 choose 10 subsets: a collision of the fixed inputs below would be a broken hash
        assert mask(**change) != mask(), change
    assert len({tuple(mask(step=s)) for s in range(20)}) == 20


def test_rubric_keep_mask_does_not_depend_on_python_hash_randomisation() -> None:
    # the function's own source, run in fresh interpreters with different hash seeds (stdlib
    # only, so no import of torch per interpreter)
    code = ("from __future__ import annotations\nimport hashlib, json, math\n"
            + inspect.getsource(rubric_keep_mask)
            + "print(rubric_keep_mask(12, 0.5, seed=3, run_id='run', group_id='g7', step=4))")
    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outputs.add(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                   capture_output=True, text=True).stdout)
    assert outputs == {str(rubric_keep_mask(12, 0.5, seed=3, run_id="run", group_id="g7",
                                            step=4)) + "\n"}


def test_rubric_keep_mask_rejects_a_fraction_outside_0_1() -> None:
    with pytest.raises(ValueError, match="must be in"):
        rubric_keep_mask(4, 1.5, seed=0, run_id=None, group_id="g")


def test_rubric_dropout_is_not_a_transform_entry() -> None:
    assert "rubric_dropout" not in ENTRIES
    err = rejected(groups_of([[1.0, 0.0]]), transforms=[{"name": "rubric_dropout"}])
    assert err["loc"] == ["body", "advantage", "transforms", 0, "name"]


# ============================================================================= reweighting
# ----------------------------------------------------------------------------- difficulty


def test_difficulty_scales_each_group_by_one_plus_alpha_times_difficulty_minus_half() -> None:
    # g0 accuracy 1/4: d = 3/4, f = 1.25; dr_grpo [.75, -.25 x3] -> [.9375, -.3125 x3]
    # g1 accuracy 3/4: d = 1/4, f = 0.75; dr_grpo [.25 x3, -.75] -> [.1875 x3, -.5625]
    resp = run(groups_of([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]), estimator="dr_grpo",
               reweight=[{"name": "difficulty"}], output="scalar")
    assert scalars(resp) == [0.9375, -0.3125, -0.3125, -0.3125, 0.1875, 0.1875, 0.1875,
                             -0.5625]


def test_difficulty_uses_the_threshold_and_alpha_zero_is_the_identity() -> None:
    groups = groups_of([[0.75, 0.25]])
    # threshold 0.5: accuracy 1/2 -> f = 1; threshold 0.2: accuracy 1 -> f = 1 - 0.5 = 0.5
    assert scalars(run(groups, estimator="dr_grpo", reweight=[{"name": "difficulty"}],
                       output="scalar")) == [0.25, -0.25]
    assert scalars(run(groups, estimator="dr_grpo", output="scalar",
                       reweight=[{"name": "difficulty", "params": {"threshold": 0.2}}])
                   ) == [0.125, -0.125]
    assert close(scalars(run(groups_of([[1.0, 0.0, 0.0]]), estimator="dr_grpo",
                             output="scalar",
                             reweight=[{"name": "difficulty", "params": {"alpha": 0.0}}])),
                 [2 / 3, -1 / 3, -1 / 3])


# ----------------------------------------------------------------------------- ha_dw


HA_DW = {"estimator": "dr_grpo", "reweight": [{"name": "ha_dw"}], "output": "scalar"}


def test_ha_dw_weights_by_the_anchor_from_before_the_batch_and_updates_it() -> None:
    runs = MemoryRunStore()
    # batch 1: accuracies 1/4 and 3/4, batch 1/2 -> anchor initialised to 1/2 and kept
    first = run(groups_of([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]), runs=runs,
                run_id="run-1", **HA_DW)
    up, down = math.exp(0.25), math.exp(-0.25)
    assert close(scalars(first), [0.75 * up, -0.25 * up, -0.25 * up, -0.25 * up,
                                  0.25 * down, 0.25 * down, 0.25 * down, -0.75 * down])
    assert first["report"]["ha_dw"] == {"anchor_before": 0.5, "anchor_after": 0.5,
                                        "batch_accuracy": 0.5, "batches": 1}
    assert runs.view("run-1") == {"ha_dw": {"anchor": 0.5, "batches": 1}}
    # batch 2: accuracies 1/2 and 1, batch 3/4; weights use the old anchor 1/2
    second = run(groups_of([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), runs=runs,
                 run_id="run-1", **HA_DW)
    assert scalars(second) == [0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    anchor = 0.9 * 0.5 + (1 - 0.9) * 0.75  # 0.525
    report = second["report"]["ha_dw"]
    assert report["anchor_before"] == 0.5 and report["batch_accuracy"] == 0.75
    assert close([report["anchor_after"]], [anchor]) and report["batches"] == 2
    assert close([runs.view("run-1")["ha_dw"]["anchor"]], [anchor])


def test_ha_dw_momentum_and_beta_parameters() -> None:
    runs = MemoryRunStore()
    spec = {**HA_DW, "reweight": [{"name": "ha_dw",
                                   "params": {"momentum": 0.5, "beta": 2.0}}]}
    run(groups_of([[1.0, 1.0, 1.0, 1.0]]), runs=runs, run_id="r", **spec)  # anchor 1
    resp = run(groups_of([[1.0, 0.0]]), runs=runs, run_id="r", **spec)
    # anchor before 1, group accuracy 1/2: w = exp(2 * 0.5) = e; anchor 0.5 + 0.25 = 0.75
    assert close(scalars(resp), [0.5 * math.e, -0.5 * math.e])
    assert resp["report"]["ha_dw"]["anchor_after"] == 0.75


def test_ha_dw_state_is_per_run_and_reset_starts_it_afresh() -> None:
    runs = MemoryRunStore()
    run(groups_of([[1.0, 1.0]]), runs=runs, run_id="a", **HA_DW)
    run(groups_of([[0.0, 0.0]]), runs=runs, run_id="b", **HA_DW)
    assert runs.view("a") == {"ha_dw": {"anchor": 1.0, "batches": 1}}
    assert runs.view("b") == {"ha_dw": {"anchor": 0.0, "batches": 1}}
    assert runs.reset("a") is True and runs.view("a") is None
    again = run(groups_of([[1.0, 0.0]]), runs=runs, run_id="a", **HA_DW)
    assert again["report"]["ha_dw"]["batches"] == 1
    assert again["report"]["ha_dw"]["anchor_before"] == 0.5
    assert scalars(again) == [0.5, -0.5]


def test_ha_dw_leaves_the_anchor_alone_when_no_rollout_is_included() -> None:
    runs = MemoryRunStore()
    run(groups_of([[1.0, 0.0]]), runs=runs, run_id="r", **HA_DW)
    # every rollout's only component is missing: all are excluded
    groups = [{"group_id": "g", "rollouts": [{"rollout_id": "x", "rewards": {"acc": None}},
                                             {"rollout_id": "y", "rewards": {"acc": None}}]}]
    resp = run(groups, runs=runs, run_id="r", **HA_DW)
    assert scalars(resp) == [0.0, 0.0]
    assert resp["report"]["ha_dw"]["anchor_after"] == 0.5
    assert runs.view("r") == {"ha_dw": {"anchor": 0.5, "batches": 1}}


def test_ha_dw_needs_a_run_id() -> None:
    err = rejected(groups_of([[1.0, 0.0]]), reweight=[{"name": "ha_dw"}])
    assert err["loc"] == ["body", "run_id"]
    assert err["msg"] == "reweight 'ha_dw' keeps per-run state: send a run_id"


def test_ha_dw_called_without_a_run_store_says_so() -> None:
    req = AdvantagesRequest.model_validate({"run_id": "r", "groups": groups_of([[1.0, 0.0]]),
                                            "advantage": HA_DW})
    with pytest.raises(RuntimeError, match="RunStore"):
        pipeline_advantages(req)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as c:
        yield c


def test_ha_dw_anchor_is_visible_and_resettable_over_http(client: TestClient) -> None:
    body = {"run_id": "http-run", "groups": groups_of([[1.0, 0.0, 0.0, 0.0]]),
            "advantage": HA_DW}
    resp = client.post("/v1/advantages", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["report"]["ha_dw"]["anchor_after"] == 0.25
    body["groups"] = groups_of([[1.0, 1.0, 1.0, 1.0]])
    assert client.post("/v1/advantages", json=body).status_code == 200
    state = client.get("/v1/runs/http-run")
    assert state.status_code == 200
    assert state.json()["state"]["ha_dw"]["batches"] == 2
    assert close([state.json()["state"]["ha_dw"]["anchor"]], [0.9 * 0.25 + (1 - 0.9) * 1.0])
    assert client.delete("/v1/runs/http-run").json() == {"run_id": "http-run", "reset": True}
    assert client.get("/v1/runs/http-run").status_code == 404


def test_ha_dw_without_run_id_is_a_422_over_http(client: TestClient) -> None:
    resp = client.post("/v1/advantages", json={"groups": groups_of([[1.0, 0.0]]),
                                               "advantage": HA_DW})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "run_id"]


# ----------------------------------------------------------------------------- uniqueness


def test_uniqueness_moves_credit_to_rare_clusters_keeping_the_correct_sum() -> None:
    # dr_grpo [.25, .25, .25, -.75]; correct clusters a, a, b: (1/m)^1 = .5, .5, 1
    # sum |A| 0.75 -> weighted 0.25 * 2 = 0.5 -> rescale 1.5: .1875, .1875, .375; -.75 stays
    resp = run(groups_of([[1.0, 1.0, 1.0, 0.0]], cluster=[["a", "a", "b", "c"]]),
               estimator="dr_grpo", output="scalar",
               reweight=[{"name": "uniqueness", "params": {"alpha": 1.0}}])
    assert scalars(resp) == [0.1875, 0.1875, 0.375, -0.75]


def test_uniqueness_counts_cluster_size_among_the_groups_correct_rollouts_only() -> None:
    # cluster a has one correct and one incorrect member: size 1, so every correct rollout
    # has weight 1 and nothing changes; the same label in another group is another cluster
    groups = groups_of([[1.0, 1.0, 0.0], [1.0, 0.0]], cluster=[["a", "b", "a"], ["a", "a"]])
    assert close(scalars(run(groups, estimator="dr_grpo", output="scalar",
                             reweight=[{"name": "uniqueness"}])),
                 [1 / 3, 1 / 3, -2 / 3, 0.5, -0.5])


def test_uniqueness_alpha_half_golden() -> None:
    # weights 1/sqrt2, 1/sqrt2, 1; scale 0.75 / (0.25 (sqrt2 + 1)) = 3 (sqrt2 - 1)
    resp = run(groups_of([[1.0, 1.0, 1.0, 0.0]], cluster=[["a", "a", "b", "c"]]),
               estimator="dr_grpo", output="scalar", reweight=[{"name": "uniqueness"}])
    s = 3 * (math.sqrt(2) - 1)
    assert close(scalars(resp), [0.25 * s / math.sqrt(2), 0.25 * s / math.sqrt(2), 0.25 * s,
                                 -0.75])


def test_uniqueness_needs_cluster() -> None:
    err = rejected(groups_of([[1.0, 0.0]]), reweight=[{"name": "uniqueness"}])
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "cluster"]
    assert err["msg"] == "reweight 'uniqueness' needs cluster on every rollout"


# ----------------------------------------------------------------------------- gagar


def test_gagar_down_weights_lower_quality_ranks_and_keeps_the_passing_sum() -> None:
    # dr_grpo [.25 x3, -.75]; qualities .9, .5, .7 -> ranks 0, 2, 1 -> w 1, .25, .5 (decay .5)
    # weighted sum .25 * 1.75 = .4375, scale .75 / .4375 = 12/7 -> 3/7, 3/28, 3/14
    resp = run(groups_of([[1.0, 1.0, 1.0, 0.0]], quality=[[0.9, 0.5, 0.7, 0.1]]),
               estimator="dr_grpo", output="scalar",
               reweight=[{"name": "gagar", "params": {"decay": 0.5}}])
    assert close(scalars(resp), [3 / 7, 3 / 28, 3 / 14, -0.75])
    assert close([sum(scalars(resp)[:3])], [0.75])


def test_gagar_leaves_groups_that_are_not_mixed_alone_and_ties_share_a_rank() -> None:
    # g0 all pass (dr_grpo 0s), g1 all fail; g2 tied qualities: both rank 0 -> weight 1
    groups = groups_of([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0, 0.0]],
                       quality=[[0.1, 0.9], [0.3, 0.2], [0.5, 0.5, 0.9]])
    resp = run(groups, estimator="dr_grpo", output="scalar", reweight=[{"name": "gagar"}])
    assert close(scalars(resp), [0.0, 0.0, 0.0, 0.0, 1 / 3, 1 / 3, -2 / 3])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 1.0)), min_size=2, max_size=8),
       st.floats(0.1, 1.0))
def test_gagar_preserves_the_sum_of_passing_advantages(rollouts: list[tuple[bool, float]],
                                                       decay: float) -> None:
    rewards = [1.0 if passed else 0.0 for passed, _ in rollouts]
    batch = batch_of(groups_of([rewards], quality=[[q for _, q in rollouts]]))
    before = rollout_advantages([r - sum(rewards) / len(rewards) for r in rewards])
    after = gagar(batch, before, ENTRIES["gagar"].Params(decay=decay), PINS).rollout
    passing = torch.tensor(rewards) >= 0.5
    assert abs(float(after[passing].sum() - before.rollout[passing].sum())) <= TIGHT
    assert torch.equal(after[~passing], before.rollout[~passing])
    assert bool(((after > 0) == (before.rollout > 0)).all())


def test_gagar_needs_quality() -> None:
    err = rejected(groups_of([[1.0, 0.0]]), reweight=[{"name": "gagar"}])
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "quality"]
    assert err["msg"] == "reweight 'gagar' needs quality on every rollout"


# ----------------------------------------------------------------------------- glpo


def test_glpo_amplifies_advantages_by_the_margin_to_the_majority_reward() -> None:
    # majority "4" (2 votes), v = 1; margins 0, 0, 1, 1; dr_grpo [.5, .5, -.5, -.5]
    resp = run(groups_of([[1.0, 1.0, 0.0, 0.0]], answer=[["4", "4", "5", "6"]]),
               estimator="dr_grpo", output="scalar", reweight=[{"name": "glpo"}])
    assert scalars(resp) == [0.5, 0.5, -1.0, -1.0]


def test_glpo_breaks_vote_ties_by_the_smallest_answer() -> None:
    # "a" and "b" 2 votes each -> "a", v = 0; margins 1, 1, 0, 0; gamma 0.5 -> x1.5
    resp = run(groups_of([[1.0, 1.0, 0.0, 0.0]], answer=[["b", "b", "a", "a"]]),
               estimator="dr_grpo", output="scalar",
               reweight=[{"name": "glpo", "params": {"gamma": 0.5}}])
    assert scalars(resp) == [0.75, 0.75, -0.5, -0.5]


def test_glpo_excluded_rollouts_do_not_vote() -> None:
    # included answers y, y, x with rewards 0, 0, 1: majority y, v = 0, margins 0, 0, 1;
    # the two excluded "a"s would tie y and win the tie if they voted
    # dr_grpo [-1/3, -1/3, 2/3] -> x gets 2/3 * (1 + 1)
    resp = run(groups_of([[None, None, 0.0, 0.0, 1.0]], answer=[["a", "a", "y", "y", "x"]]),
               estimator="dr_grpo", output="scalar", reweight=[{"name": "glpo"}])
    assert close(scalars(resp), [0.0, 0.0, -1 / 3, -1 / 3, 4 / 3])


def test_glpo_needs_answer() -> None:
    err = rejected(groups_of([[1.0, 0.0]]), reweight=[{"name": "glpo"}])
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "answer"]
    assert err["msg"] == "reweight 'glpo' needs answer on every rollout"


# ----------------------------------------------------------------------------- modulate


def test_modulate_scales_each_token_by_one_plus_beta_tanh_of_the_group_z_score() -> None:
    # signals 1, 3 | 5, 7: mean 4, population std sqrt(20/4) = sqrt5; dr_grpo +-0.5
    resp = run(groups_of([[1.0, 0.0]], num_tokens=[[2, 2]], signal=[[[1.0, 3.0], [5.0, 7.0]]]),
               estimator="dr_grpo", output="dense", reweight=[{"name": "modulate"}])
    z = [-3 / math.sqrt(5), -1 / math.sqrt(5), 1 / math.sqrt(5), 3 / math.sqrt(5)]
    f = [1 + 0.5 * math.tanh(v) for v in z]
    advantages = dense(resp)
    assert close(advantages[0], [0.5 * f[0], 0.5 * f[1]])
    assert close(advantages[1], [-0.5 * f[2], -0.5 * f[3]])


def test_modulate_leaves_masked_tokens_out_of_the_statistics_and_at_zero() -> None:
    # mask drops the 100: tokens 1, 3 | 5, 7 as above; the masked token is +0.0
    resp = run(groups_of([[1.0, 0.0]], num_tokens=[[3, 2]], mask=[[[1, 0, 1], [1, 1]]],
                         signal=[[[1.0, 100.0, 3.0], [5.0, 7.0]]]),
               estimator="dr_grpo", output="dense", reweight=[{"name": "modulate"}])
    f = [1 + 0.5 * math.tanh(v / math.sqrt(5)) for v in (-3, -1)]
    first = dense(resp)[0]
    assert close([first[0], first[2]], [0.5 * f[0], 0.5 * f[1]])
    assert first[1] == 0.0 and math.copysign(1.0, first[1]) == 1.0


def test_modulate_per_turn_signal_applies_to_the_turns_tokens() -> None:
    # turn signals 0, 2 | 4, 6 (one value per turn): mean 3, std sqrt5; token 2 of rollout 0
    # is outside both turns and keeps its advantage
    turns = [[[{"start": 0, "end": 2, "signal": 0.0}, {"start": 3, "end": 4, "signal": 2.0}],
              [{"start": 0, "end": 1, "signal": 4.0}, {"start": 1, "end": 2, "signal": 6.0}]]]
    resp = run(groups_of([[1.0, 0.0]], num_tokens=[[4, 2]], turns=turns),
               estimator="dr_grpo", output="dense",
               reweight=[{"name": "modulate", "params": {"source": "turn", "beta": 0.25}}])
    f = [1 + 0.25 * math.tanh(v / math.sqrt(5)) for v in (-3, -1, 1, 3)]
    advantages = dense(resp)
    assert close(advantages[0], [0.5 * f[0], 0.5 * f[0], 0.5, 0.5 * f[1]])
    assert close(advantages[1], [-0.5 * f[2], -0.5 * f[3]])


def test_modulate_with_a_constant_signal_is_the_identity() -> None:
    resp = run(groups_of([[1.0, 0.0]], num_tokens=[[2, 1]], signal=[[[0.3, 0.3], [0.3]]]),
               estimator="dr_grpo", output="rle", reweight=[{"name": "modulate"}])
    assert [decode_rle(r["advantages"]["rle"]) for g in resp["groups"]
            for r in g["rollouts"]] == [[0.5, 0.5], [-0.5]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(-5.0, 5.0),
                          st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=4)),
                min_size=1, max_size=5),
       st.floats(0.0, 0.999))
def test_modulate_never_flips_the_sign_and_stays_within_one_plus_minus_beta(
        rollouts: list[tuple[float, list[float]]], beta: float) -> None:
    groups = groups_of([[r for r, _ in rollouts]], num_tokens=[[len(h) for _, h in rollouts]],
                       signal=[[h for _, h in rollouts]])
    batch = batch_of(groups)
    rewards = [r for r, _ in rollouts]
    base = rollout_advantages([r - sum(rewards) / len(rewards) for r in rewards])
    params = ENTRIES["modulate"].Params(beta=beta)
    after = modulate(batch, base, params, PINS).token
    before = torch.repeat_interleave(base.rollout, batch.num_tokens)
    assert torch.equal(torch.sign(after), torch.sign(before))
    assert bool((after.abs() <= before.abs() * (1 + beta) * (1 + 1e-15)).all())
    assert bool((after.abs() >= before.abs() * (1 - beta) * (1 - 1e-15)).all())


def test_modulate_needs_the_signal_its_source_names() -> None:
    err = rejected(groups_of([[1.0, 0.0]], num_tokens=[[1, 1]]),
                   reweight=[{"name": "modulate"}])
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "signal"]
    assert err["msg"] == "reweight 'modulate' needs signal on every rollout (source 'token')"
    err = rejected(groups_of([[1.0, 0.0]], num_tokens=[[1, 1]], signal=[[[0.0], [1.0]]]),
                   reweight=[{"name": "modulate", "params": {"source": "turn"}}])
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "turns"]
    turns = [[[{"start": 0, "end": 1, "signal": 1.0}], [{"start": 0, "end": 1}]]]
    err = rejected(groups_of([[1.0, 0.0]], num_tokens=[[1, 1]], turns=turns),
                   reweight=[{"name": "modulate", "params": {"source": "turn"}}])
    assert err["loc"] == ["body", "groups", 0, "rollouts", 1, "turns", 0, "signal"]


def test_modulate_beta_must_stay_below_one() -> None:
    err = rejected(groups_of([[1.0, 0.0]], num_tokens=[[1, 1]], signal=[[[0.0], [1.0]]]),
                   reweight=[{"name": "modulate", "params": {"beta": 1.0}}])
    assert err["loc"] == ["body", "advantage", "reweight", 0, "params", "beta"]


def test_uniqueness_after_modulate_keeps_the_token_sum_of_correct_advantages() -> None:
    # token-level input: a rollout's total is the sum over its mask-1 tokens
    groups = groups_of([[1.0, 1.0, 0.0]], num_tokens=[[2, 1, 1]], cluster=[["a", "b", "c"]],
                       signal=[[[0.0, 2.0], [1.0], [5.0]]])
    batch = batch_of(groups)
    base = rollout_advantages([1 / 3, 1 / 3, -2 / 3])
    modulated = modulate(batch, base, ENTRIES["modulate"].Params(), PINS)
    after = uniqueness(batch, modulated, ENTRIES["uniqueness"].Params(alpha=1.0), PINS)
    correct = batch.token_rollout < 2
    assert close([float(after.token[correct].abs().sum())],
                 [float(modulated.token[correct].abs().sum())])
    assert torch.equal(after.token[~correct], modulated.token[~correct])


# ----------------------------------------------------------------------------- catalogue


def test_catalogue_lists_the_transforms_and_reweights_with_their_inputs(
        client: TestClient) -> None:
    listed = {e["name"]: e for e in client.get("/v1/estimators").json()}
    assert {n for n, e in listed.items() if e["kind"] == "transform"} >= {
        "rank", "overlong", "prm_clip", "prm_delta"}
    assert listed["ha_dw"]["stateful"] is True
    assert listed["uniqueness"]["inputs"] == ["cluster"]
    assert listed["prm_delta"]["inputs"] == ["steps"]
    for name in ("overlong", "difficulty", "ha_dw", "uniqueness", "gagar", "glpo", "modulate"):
        assert all(p["description"] for p in listed[name]["params"]), name


def test_modulate_treats_a_spread_whose_variance_underflows_as_constant() -> None:
    """h a few ulps apart (found by hypothesis): its variance underflows to 0; z is 0, the
    advantages are kept, never NaN."""
    groups = groups_of([[1.0, 0.0]], num_tokens=[[1, 1]], signal=[[[0.0], [5e-324]]])
    batch = batch_of(groups)
    base = rollout_advantages([0.5, -0.5])
    after = modulate(batch, base, ENTRIES["modulate"].Params(beta=0.5), PINS).token
    assert after.tolist() == [0.5, -0.5]
