"""The verl adapter driven by verl 0.9.1's own code (tests/trainers/test_verl.py runs this with
the verl environment's python; nothing of verl is stubbed). Each sub-command prints one JSON
object of what it observed; the test asserts on it.

    verl_checks.py reward-function URL   verl loads compute_score by file path and by pkg://
                                          path; its reward loop worker scores a DataProto
    verl_checks.py manager URL           reward_manager name=rewardd from verl's registry;
                                          the worker's per-sample calls and a direct batch
                                          call, counting POST /v1/rewards on the server
    verl_checks.py failures URL          a failed cell: its fallback and rewardd_failed, or
                                          RewardFailed out of verl's reward loop
    verl_checks.py estimator URL         adv_estimator=rewardd from verl's registry, through
                                          ray_trainer.compute_advantage; rewardd's verl
                                          profile against verl's compute_grpo_outcome_advantage
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import torch
import verl_data
from omegaconf import OmegaConf
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.reward import get_custom_reward_fn

from rewardd_client import RewarddClient


def posts(url: str, route: str) -> int:
    """POST requests the server has answered on ``route`` (any status), from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    pattern = re.compile(r'^rewardd_http_requests_total\{(?=[^}]*method="POST")'
                         r'(?=[^}]*route="' + re.escape(route) + r'")[^}]*\}\s+([0-9.e+]+)$')
    return int(sum(float(m.group(1)) for line in text.splitlines()
                   if (m := pattern.match(line))))


def worker_scores(config: Any, data: DataProto) -> dict[str, Any]:
    """What verl's reward loop makes of ``data``: a RewardLoopWorker (the class verl runs as
    a Ray actor, here in-process) scores each row, and the manager class assembles
    ``rm_scores`` as RewardLoopManager.compute_rm_score does."""
    worker = RewardLoopWorker(config)
    # the worker's own loop, as in a Ray actor (verl's managers bind to it when built)
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    scores = [o["reward_score"] for o in outputs]
    rm_scores = type(worker.reward_manager).assemble_rm_scores(data, scores)
    return {"manager": type(worker.reward_manager).__name__, "scores": scores,
            "extra": [o.get("reward_extra_info", {}) for o in outputs],
            "rm_scores_nonzero": rm_scores.nonzero().tolist(),
            "rm_scores_sum": rm_scores.sum(dim=-1).tolist()}


def reward_function(url: str, folder: Path) -> dict[str, Any]:
    tokenizer = verl_data.save_tokenizer(folder)
    data = verl_data.batch(tokenizer, verl_data.MATH_ROWS)
    file_path = importlib.util.find_spec("rewardd_client.verl").origin
    out: dict[str, Any] = {"response_lengths": data.batch["response_mask"].sum(-1).tolist()}
    for label, path in (("file", file_path), ("pkg", "pkg://rewardd_client.verl")):
        config = verl_data.config(folder, custom_reward_function={
            "path": path, "name": "compute_score",
            "reward_kwargs": {"base_url": url, "rewards": "math"}})
        loaded = get_custom_reward_fn(config)
        before = posts(url, "/v1/rewards")
        out[label] = {**worker_scores(config, data),
                      "is_coroutine": asyncio.iscoroutinefunction(loaded.args[0]),
                      "requests": posts(url, "/v1/rewards") - before}
    return out


def manager(url: str, folder: Path) -> dict[str, Any]:
    tokenizer = verl_data.save_tokenizer(folder)
    data = verl_data.batch(tokenizer, verl_data.MATH_ROWS)
    config = verl_data.config(folder, reward_manager={"name": "rewardd"},
                              rewardd={"base_url": url, "rewards": "math"})
    before = posts(url, "/v1/rewards")
    out: dict[str, Any] = {"registry": get_reward_manager_cls("rewardd").__name__,
                           "loop": worker_scores(config, data)}
    out["loop"]["requests"] = posts(url, "/v1/rewards") - before
    manager_obj = get_reward_manager_cls("rewardd")(config, tokenizer, None)
    before = posts(url, "/v1/rewards")
    result = manager_obj(data, return_dict=True)
    tensor = result["reward_tensor"]
    out["direct"] = {"requests": posts(url, "/v1/rewards") - before,
                     "shape": list(tensor.shape), "dtype": str(tensor.dtype),
                     "nonzero": tensor.nonzero().tolist(), "sums": tensor.sum(-1).tolist(),
                     "extra": result["reward_extra_info"]}
    # a batch whose rows of one uid are not adjacent: still one group per uid
    shuffled = data.select_idxs([0, 3, 1, 4, 2, 5])
    body_groups = _groups_sent(manager_obj, shuffled)
    out["shuffled_groups"] = body_groups
    return out


def _groups_sent(manager_obj: Any, data: DataProto) -> list[list[str]]:
    from rewardd_client.verl_plugin import rewards_request, samples_of

    body, _ = rewards_request(samples_of(data, manager_obj.tokenizer), manager_obj.settings,
                              manager_obj.tokenizer)
    return [[g["group_id"], *[r["rollout_id"] for r in g["rollouts"]]] for g in body["groups"]]


def failures(url: str, folder: Path) -> dict[str, Any]:
    """A row with no ground truth: the math cell fails (invalid_reference)."""
    from rewardd_client.verl import RewardFailed

    tokenizer = verl_data.save_tokenizer(folder)
    data = verl_data.batch(tokenizer, [("u1", "What is 1+1?", "\\boxed{2}", "2"),
                                       ("u2", "What is 1+1?", "\\boxed{2}", None)])
    math = {"name": "math", "verifier": "math"}
    with_fallback = verl_data.config(folder, reward_manager={"name": "rewardd"}, rewardd={
        "base_url": url, "rewards": [{**math, "fallback": -1.0}]})
    out: dict[str, Any] = {"fallback": worker_scores(with_fallback, data)}
    without = verl_data.config(folder, reward_manager={"name": "rewardd"},
                               rewardd={"base_url": url, "rewards": [math]})
    try:
        worker_scores(without, data)
        out["raised"] = None
    except RewardFailed as exc:
        out["raised"] = {"rollout_id": exc.rollout_id, "errors": {
            k: v.get("error") for k, v in exc.failures.items()}, "message": str(exc)}
    return out


def estimator(url: str, folder: Path) -> dict[str, Any]:
    # rows 0-3 one prompt, rows 4-5 another; row 1 has a tool-token span (mask 0) inside
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    lengths = [5, 7, 3, 6, 4, 8]
    width = 10
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    mask[1, 2:4] = 0
    token_rewards = torch.zeros(len(lengths), width)
    token_rewards[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = rewards
    index = __import__("numpy").array(["p", "p", "p", "p", "q", "q"], dtype=object)
    spec = {"estimator": "rloo", "profile": "verl"}
    algo = OmegaConf.create({"adv_estimator": "rewardd", "gamma": 1.0, "lam": 1.0,
                             "rewardd": {"base_url": url, "advantage": spec}})

    fn = core_algos.get_adv_estimator_fn("rewardd")
    advantages, returns = fn(token_level_rewards=token_rewards, response_mask=mask,
                             index=index, config=algo)

    # rewardd asked directly, dense output, the same rollouts
    with RewarddClient(url) as client:
        direct = client.advantages({"groups": [
            {"group_id": g, "rollouts": [
                {"rollout_id": str(i), "reward": float(rewards[i]), "num_tokens": lengths[i],
                 **({"mask": mask[i, :lengths[i]].tolist()} if i == 1 else {})}
                for i in range(len(lengths)) if index[i] == g]} for g in ("p", "q")],
            "advantage": {**spec, "output": "dense"}})
    expected = torch.zeros(len(lengths), width)
    for group in direct["groups"]:
        for r in group["rollouts"]:
            i = int(r["rollout_id"])
            expected[i, :lengths[i]] = torch.tensor(r["advantages"], dtype=torch.float32)
    on = mask.bool()

    data = DataProto.from_dict(tensors={"token_level_rewards": token_rewards,
                                        "response_mask": mask},
                               non_tensors={"uid": index})
    passed = compute_advantage(data, adv_estimator="rewardd", config=algo).batch

    # GRPO: rewardd's verl profile against verl's own function on the same rewards
    algo_grpo = OmegaConf.create({"rewardd": {"base_url": url, "advantage": {
        "estimator": "grpo", "profile": "verl"}}})
    ours, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=index,
                 config=algo_grpo)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards, response_mask=mask, index=index)
    return {
        "shape": list(advantages.shape), "dtype": str(advantages.dtype),
        "equal_masked": bool(torch.equal(advantages[on], expected[on])),
        "zero_off_mask": bool(torch.equal(advantages[~on], torch.zeros(int((~on).sum())))),
        "returns_equal": bool(torch.equal(returns, advantages)),
        "first_token": advantages[:, 0].tolist(),
        "tool_span": advantages[1, 2:4].tolist(),
        "compute_advantage_equal": bool(torch.equal(passed["advantages"], advantages)
                                        and torch.equal(passed["returns"], advantages)),
        "grpo_max_abs_diff": float((ours - theirs).abs().max()),
        "grpo_first_token": ours[:, 0].tolist(),
        "verl_grpo_first_token": theirs[:, 0].tolist(),
    }


def main() -> None:
    command, url = sys.argv[1], sys.argv[2]
    checks = {"reward-function": reward_function, "manager": manager, "failures": failures,
              "estimator": estimator}
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(checks[command](url, Path(folder))))


if __name__ == "__main__":
    main()
