"""rewardd_client.tensors on real server responses: the rle, dense and scalar answers to one
batch decode to bit-identical (B, T) arrays, over JSON and msgpack, and grpo's values match
the formula recomputed here."""

from __future__ import annotations

import random
import statistics
from typing import Any

import numpy as np
import pytest
import torch

from rewardd_client import RewarddClient
from rewardd_client.tensors import advantages_tensor, rewards_list

pytestmark = pytest.mark.e2e

EPS = 1e-6  # the rewardd profile's epsilon


def batch(estimator: str, output: str, masked: bool) -> dict[str, Any]:
    """3 groups x 4 rollouts of 5 to 40 tokens; tool-token masks and critic values when
    asked, so rle has runs of many lengths."""
    rng = random.Random(11)
    groups = []
    for g in range(3):
        rollouts = []
        for i in range(4):
            n = rng.randint(5, 40)
            rollout: dict[str, Any] = {"rollout_id": f"g{g}/r{i}", "num_tokens": n,
                                       "reward": float(rng.random() < 0.5) + 0.25 * i}
            if masked:
                cut = rng.randint(1, n - 2)
                rollout["mask"] = [1] * cut + [0] * 2 + [1] * (n - cut - 2)
            if estimator == "gae":
                rollout["values"] = [round(rng.uniform(-1, 1), 3) for _ in range(n)]
            rollouts.append(rollout)
        groups.append({"group_id": f"g{g}", "rollouts": rollouts})
    params = {"gamma": 0.9, "lam": 0.95} if estimator == "gae" else {}
    return {"groups": groups, "advantage": {"estimator": estimator, "params": params,
                                            "output": output}}


def bits(array: Any) -> np.ndarray:
    return np.asarray(array, dtype=np.float64).view(np.int64)


@pytest.mark.parametrize("wire", ["json", "msgpack"])
@pytest.mark.parametrize("estimator,masked", [("grpo", True), ("gae", True), ("grpo", False)])
def test_rle_decodes_bit_for_bit_to_the_dense_answer(server: str, wire: str, estimator: str,
                                                     masked: bool) -> None:
    with RewarddClient(server, wire=wire) as client:
        rle = client.advantages(batch(estimator, "rle", masked))
        dense = client.advantages(batch(estimator, "dense", masked))
    from_rle, mask = advantages_tensor(rle)
    from_dense, dense_mask = advantages_tensor(dense)
    assert (bits(from_rle) == bits(from_dense)).all()
    assert (mask == dense_mask).all()
    runs = [len(r["advantages"]["rle"]) for g in rle["groups"] for r in g["rollouts"]]
    assert (max(runs) > 1) == masked  # per-token variation went through rle when masked
    for row, item in enumerate(r for g in dense["groups"] for r in g["rollouts"]):
        n = item["num_tokens"]
        assert (bits(from_dense[row, :n]) == bits(item["advantages"])).all()
        assert mask[row].sum() == n and not from_dense[row, n:].any()
    if estimator == "gae":
        returns_rle, _ = advantages_tensor(rle, field="returns")
        returns_dense, _ = advantages_tensor(dense, field="returns")
        assert (bits(returns_rle) == bits(returns_dense)).all()


def test_scalar_answer_spreads_to_the_same_tensor_as_rle(server: str) -> None:
    with RewarddClient(server, wire="msgpack") as client:
        scalar = client.advantages(batch("grpo", "scalar", False))
        rle = client.advantages(batch("grpo", "rle", False))
    a, mask_a = advantages_tensor(scalar, backend="torch")
    b, mask_b = advantages_tensor(rle, backend="torch")
    assert torch.equal(a.view(torch.int64), b.view(torch.int64)) and torch.equal(mask_a, mask_b)


def test_grpo_tensor_equals_the_formula_on_kept_tokens_and_zero_on_tool_tokens(
        server: str) -> None:
    body = batch("grpo", "rle", True)
    with RewarddClient(server) as client:
        response = client.advantages(body)
    ids = [r["rollout_id"] for g in body["groups"] for r in g["rollouts"]][::-1]
    values, mask = advantages_tensor(response, backend="torch", rollout_ids=ids)
    sent = {r["rollout_id"]: r for g in body["groups"] for r in g["rollouts"]}
    for g in body["groups"]:
        rewards = [r["reward"] for r in g["rollouts"]]
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        for r in g["rollouts"]:
            row = ids.index(r["rollout_id"])
            expected = (r["reward"] - mean) / (std + EPS)
            want = [expected * m for m in sent[r["rollout_id"]]["mask"]]
            want += [0.0] * (values.shape[1] - len(want))
            assert values[row].tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)
            assert int(mask[row].sum()) == r["num_tokens"]
    assert rewards_list(response, ids) == [sent[i]["reward"] for i in ids]
