"""rewardd_advantages' round trips per step, on a stand-in GRPOTrainer and a recording fake server.

The hook's paths (tests/support/trl_standin.py drives them as TRL 1.16 calls them): one
``POST /v1/score`` per step when every reward function is rewardd's, made by one call; the
two-call path (``/v1/rewards``, then ``/v1/advantages``) with another function beside them
or blocks that do not share a reference; and the second ``/v1/advantages`` where the one
call's answer cannot stand (a partly failed rollout, a loss mask other than the predicted
one). The fake server marks which route computed an advantage (+1000 on ``/v1/advantages``),
so each test sees which answer TRL trains on. The numbers themselves are the real server's
business: tests/trainers/test_trl.py compares the two paths there.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

import pytest

from rewardd_client import InvalidRequest
from rewardd_client._trl_score import Row, blocks_agree, fusion_of, read_score
from rewardd_client.trl import reward_function, reward_functions, rewardd_advantages
from tests.support.trl_standin import Batch, StandInTrainer, rows_of, single_process_accelerate

SPECS = [{"name": "math", "verifier": "math", "weight": 2.0},
         {"name": "length", "verifier": "length"}]
VALUES: dict[str, dict[str, float | None]] = {
    "right": {"math": 1.0, "length": 0.5}, "wrong": {"math": 0.0, "length": 0.5},
    "broken": {"math": None, "length": 0.5}, "void": {"math": None, "length": None}}
"""What the fake server's verifiers give each completion text."""
ADVANTAGES_ROUTE = 1000.0


class FakeRewardd:
    """Answers /v1/rewards, /v1/score and /v1/advantages from VALUES; records every call.
    An advantage is the rollout's reward (0 when excluded) plus t/100 at token t, 0 where the
    mask is 0, plus ADVANTAGES_ROUTE when /v1/advantages computed it."""

    base_url = "http://fake"

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refuse = refuse

    def _verified(self, rollout: Mapping[str, Any], specs: list[dict]) -> dict[str, Any]:
        values = {s["name"]: VALUES[rollout["completion"]][s["verifier"]] for s in specs}
        missing = [v is None for v in values.values()]
        reward = None if any(missing) else sum(float(s.get("weight", 1.0)) * values[s["name"]]
                                               for s in specs)
        return {"rollout_id": rollout["rollout_id"], "reward": reward, "rewards": values,
                "status": {n: {"ok": v is not None} for n, v in values.items()}}

    def _answer(self, body: dict[str, Any], read: Any, route_offset: float | None) -> dict:
        groups, failed = [], 0
        for group in body["groups"]:
            rollouts = []
            for rollout in group["rollouts"]:
                result = read(rollout)
                failed += sum(not s["ok"] for s in result.get("status", {}).values())
                if route_offset is not None:
                    mask = rollout.get("mask") or [1] * rollout["num_tokens"]
                    base = (result["reward"] or 0.0) + route_offset
                    result["advantages"] = [(base + t / 100) * m for t, m in enumerate(mask)]
                rollouts.append(result)
            groups.append({"group_id": group["group_id"], "rollouts": rollouts})
        return {"groups": groups, "summary": {"failed_cells": failed}}

    def rewards(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("rewards", body))
        return self._answer(body, lambda r: self._verified(r, body["rewards"]), None)

    def score(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("score", body))
        if self.refuse:
            raise InvalidRequest(422, [{"loc": ["body", "advantage", "estimator"],
                                        "msg": "unknown estimator 'nope'"}])
        return self._answer(body, lambda r: self._verified(r, body["rewards"]), 0.0)

    def advantages(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("advantages", body))
        weights = body["advantage"].get("weights", {})

        def read(rollout: Mapping[str, Any]) -> dict[str, Any]:
            values = rollout["rewards"]
            reward = None if all(v is None for v in values.values()) else sum(
                weights.get(n, 1.0) * (v or 0.0) for n, v in values.items())
            return {"rollout_id": rollout["rollout_id"], "reward": reward}
        return self._answer(body, read, ADVANTAGES_ROUTE)

    @property
    def routes(self) -> list[str]:
        return [route for route, _ in self.calls]


@pytest.fixture(autouse=True)
def _accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    single_process_accelerate(monkeypatch)


def batch(*completions: str, ids: list[list[int]] | None = None, **fields: Any) -> Batch:
    """Two groups of two: prompts p0, p1 with answers a0, a1."""
    ids = ids or [[5, 0], [6, 7, 0], [8, 0], [9, 0]][:len(completions)]
    count = len(completions)
    return Batch(prompts=[f"p{i // 2}" for i in range(count)], completions=list(completions),
                 completion_ids=ids, answers=[f"a{i // 2}" for i in range(count)], **fields)


def hooked(server: FakeRewardd, functions: list[Any], advantage: Any = "grpo",
           **trainer: Any) -> StandInTrainer:
    standin = StandInTrainer(functions, num_generations=2, **trainer)
    rewardd_advantages(standin, server.base_url, advantage, client=server, validate=False)
    return standin


def component_functions(server: FakeRewardd) -> list[Any]:
    return reward_functions(server.base_url, SPECS, client=server, validate=False)


def test_rewardd_functions_made_together_cost_one_score_request_per_step() -> None:
    server = FakeRewardd()
    trainer = hooked(server, component_functions(server),
                     reward_weights=__import__("torch").tensor([2.0, 1.0]))
    steps = [trainer.step(batch("right", "wrong", "wrong", "right")) for _ in range(2)]
    assert server.routes == ["score", "score"]  # before: rewards per process + advantages
    body = server.calls[0][1]
    assert [g["group_id"] for g in body["groups"]] == ["g0", "g1"]
    assert body["groups"][0]["reference"] == {"answer": "a0"}
    assert body["groups"][0]["rollouts"][1] == {"rollout_id": "r1", "completion": "wrong",
                                                "token_ids": [6, 7, 0], "num_tokens": 3}
    assert body["rewards"] == [{**s, "weight": w} for s, w in zip(SPECS, (2.0, 1.0))]
    assert body["advantage"] == {"profile": "trl", "estimator": "grpo", "output": "dense"}
    assert [call[1]["step"] for call in server.calls] == [0, 1]
    ids = batch("x", "x", "x", "x").completion_ids
    assert rows_of(steps[0], ids)[:2] == [pytest.approx([2.5, 2.51]),  # float32, as TRL's
                                          pytest.approx([0.5, 0.51, 0.52])]
    assert trainer.metrics == [("rewardd/failed_cells", 0.0)] * 2


def test_trl_reward_weights_become_the_spec_weights_of_the_one_call() -> None:
    server = FakeRewardd()
    torch = __import__("torch")
    trainer = hooked(server, component_functions(server), {"estimator": "rloo",
                                                           "weights": {"length": 3.0}},
                     reward_weights=torch.tensor([0.5, 1.0]))
    trainer.step(batch("right", "wrong"))
    body = server.calls[0][1]
    assert [s["weight"] for s in body["rewards"]] == [0.5, 3.0]
    assert "weights" not in body["advantage"]


def test_a_single_weighted_function_returns_its_reward_and_scales_by_trl_weight() -> None:
    server = FakeRewardd()
    function = reward_function(server.base_url, SPECS, client=server, validate=False)
    torch = __import__("torch")
    trainer = hooked(server, [function], reward_weights=torch.tensor([0.5]))
    recorded: list[Any] = []
    calculate = trainer._calculate_rewards
    trainer._calculate_rewards = lambda *a: recorded.append(calculate(*a)) or recorded[-1]
    trainer.step(batch("right", "wrong"))
    assert server.routes == ["score"]
    assert [s["weight"] for s in server.calls[0][1]["rewards"]] == [1.0, 0.5]
    assert recorded[0].tolist() == [[2.5], [0.5]]  # the function's value, not TRL's weighted


def test_a_partly_failed_rollout_asks_advantages_again_as_the_two_call_path() -> None:
    server = FakeRewardd()
    trainer = hooked(server, component_functions(server))
    advantages = trainer.step(batch("right", "broken", "void", "wrong"))
    assert server.routes == ["score", "advantages"]
    sent = [r["rewards"] for g in server.calls[1][1]["groups"] for r in g["rollouts"]]
    assert sent == [{"math": 1.0, "length": 0.5}, {"math": 0.0, "length": 0.5},  # None: 0
                    {"math": None, "length": None},  # every function None: excluded
                    {"math": 0.0, "length": 0.5}]
    assert advantages[0, 0].item() == pytest.approx(ADVANTAGES_ROUTE + 1.5)
    assert trainer.metrics == [("rewardd/failed_cells", 3.0)]


def test_another_kind_of_reward_function_keeps_the_two_calls() -> None:
    server = FakeRewardd()

    def python_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        return [1.0] * len(prompts)

    trainer = hooked(server, [*component_functions(server), python_reward])
    trainer.step(batch("right", "wrong"))
    assert server.routes == ["rewards", "advantages"]


def test_blocks_with_different_references_are_scored_the_two_call_way() -> None:
    server = FakeRewardd()
    trainer = hooked(server, component_functions(server))
    step = batch("right", "wrong")
    step.answers = ["a0", "other"]
    trainer.step(step)
    assert server.routes == ["rewards", "advantages"]


def test_tool_masks_from_generate_are_sent_with_the_one_call() -> None:
    server = FakeRewardd()
    trainer = hooked(server, component_functions(server))
    advantages = trainer.step(batch("right", "wrong", tool_masks=[[1, 1], [1, 0, 1]]))
    assert server.routes == ["score"]
    rollouts = server.calls[0][1]["groups"][0]["rollouts"]
    assert "mask" not in rollouts[0] and rollouts[1]["mask"] == [1, 0, 1]
    assert advantages[1].tolist() == [0.5, 0.0, pytest.approx(0.52)]


def test_truncated_completions_are_predicted_masked() -> None:
    server = FakeRewardd()
    trainer = hooked(server, component_functions(server), mask_truncated_completions=True)
    trainer.step(batch("right", "wrong", ids=[[5, 0], [6, 7]]))  # the second does not end
    assert server.routes == ["score"]
    assert server.calls[0][1]["groups"][0]["rollouts"][1]["mask"] == [0, 0]


def test_an_unpredicted_loss_mask_is_asked_again_with_trls(caplog) -> None:
    server = FakeRewardd()
    trainer = hooked(server, component_functions(server))
    with caplog.at_level(logging.WARNING, logger="rewardd_client"):
        advantages = trainer.step(batch("right", "wrong", tool_masks=[[1, 1], [1, 1, 1]],
                                        loss_tool_masks=[[1, 1], [1, 0, 1]]))
    assert server.routes == ["score", "advantages"]
    assert server.calls[1][1]["groups"][0]["rollouts"][1]["mask"] == [1, 0, 1]
    assert advantages[1, 1].item() == 0.0
    assert "loss mask differs" in caplog.text


def test_a_refused_score_request_raises_the_servers_error() -> None:
    server = FakeRewardd(refuse=True)
    trainer = hooked(server, component_functions(server))
    with pytest.raises(InvalidRequest, match="nope"):
        trainer.step(batch("right", "wrong"))


def test_fusion_needs_every_function_of_one_call_and_every_component() -> None:
    server = FakeRewardd()
    both = component_functions(server)
    assert fusion_of(both).components == ("math", "length")
    assert fusion_of(both[::-1]).components == ("length", "math")
    assert fusion_of(both[:1]) is None  # the server would add the left-out component
    assert fusion_of([*both[:1], *component_functions(server)[1:]]) is None  # two calls
    assert fusion_of([]) is None


def test_blocks_agree_only_on_whole_blocks_of_one_prompt_and_reference() -> None:
    row = Row("p", "c", {"answer": "1"}, [1], [1])
    other = Row("p", "c", {"answer": "2"}, [1], [1])
    assert blocks_agree([row, row, other, other], 2)
    assert not blocks_agree([row, other], 2)
    assert not blocks_agree([row, row, row], 2)


def test_read_score_keeps_trls_none_as_nan() -> None:
    server = FakeRewardd()
    fusion = fusion_of(component_functions(server))
    rows = [Row("p", c, {}, [1, 2], [1, 1]) for c in ("right", "void")]
    body = {"groups": [{"group_id": "g0", "rollouts": [
        {"rollout_id": f"r{i}", "completion": row.completion, "num_tokens": 2}
        for i, row in enumerate(rows)]}], "rewards": SPECS}
    reading = read_score(server.score(body), fusion, rows, [1.0, 1.0])
    assert reading.columns[0] == [1.0, 0.5]
    assert all(math.isnan(v) for v in reading.columns[1])
    assert reading.failed_cells == [0, 2]
    assert reading.advantages == [[2.5, 2.51], [0.0, 0.01]]  # none partly failed
