"""verl 0.9.1's own estimators on the parity batches, in float64 (tests/trainers/parity.py).

    parity_verl.py BATCHES.json [native]   prints {option: {batch: [[advantage per token]]}}

``native`` runs verl as it is, in float32 (the zero-spread noise of issue 16, item 5).

Each option calls the function verl's registry holds under that name
(``core_algos.get_adv_estimator_fn``) with the inputs ``ray_trainer.compute_advantage`` gives
it: token_level_rewards (the outcome at the last mask-1 token, minus kl_coef * kl on mask-1
tokens as ``apply_kl_penalty`` does), response_mask (padding after the response, and the
holes), the uids as index. Tensors are float64. ``group_mean_std`` (behind grpo_vectorized)
casts to float32 inside; it is rebuilt from its installed source with float64 in place of
float32 and set on core_algos, so the comparison is with verl's formula, not its rounding.
Nothing of rewardd is imported: this environment holds verl.

``reinforce_plus_plus_b178a3c`` is verl's reinforce_plus_plus before 0.9.1 (at b178a3c, the
commit issue 16 measured), which resets the running return at mask-0 tokens: the installed
verl 0.9.1 carries it across them instead, so that loop is written out below
(:func:`reinforce_pp_reset`), whitened by the installed ``masked_whiten``.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import verl.utils.groupwise as groupwise
from verl.trainer.ppo import core_algos
from verl.utils import torch_functional as verl_F

import parity_args

MAX_LEN = 12
DTYPE = torch.float64
"""float64, or the trainer's own float32 with ``native`` (the zero-spread noise of item 5)."""
RESET = "reinforce_plus_plus_b178a3c"
"""verl's reinforce_plus_plus before 0.9.1: :func:`reinforce_pp_reset`."""


def float64_group_mean_std() -> None:
    """verl's group_mean_std, its dtype float32 replaced by float64, installed where
    core_algos looks it up."""
    source = textwrap.dedent(inspect.getsource(groupwise.group_mean_std))
    assert source.count("torch.float32") >= 3, "group_mean_std changed: review the patch"
    namespace = dict(vars(groupwise))
    exec(compile(source.replace("torch.float32", "torch.float64"), "group_mean_std", "exec"),
         namespace)
    core_algos.group_mean_std = namespace["group_mean_std"]


def tensors(rows: list[dict[str, Any]], kl_coef: float) -> dict[str, Any]:
    n = len(rows)
    mask = torch.zeros(n, MAX_LEN, dtype=DTYPE)
    rewards = torch.zeros(n, MAX_LEN, dtype=DTYPE)
    values = torch.zeros(n, MAX_LEN, dtype=DTYPE)
    for i, row in enumerate(rows):
        length = len(row["mask"])
        mask[i, :length] = torch.tensor(row["mask"], dtype=DTYPE)
        values[i, :length] = torch.tensor(row["values"], dtype=DTYPE)
        kl = torch.tensor(row["kl"], dtype=DTYPE) * mask[i, :length]
        rewards[i, :length] -= kl_coef * kl
        last = max(t for t, m in enumerate(row["mask"]) if m)
        rewards[i, last] += row["reward"]
    index = np.array([f"uid-{row['group']}" for row in rows], dtype=object)
    return {"token_level_rewards": rewards, "response_mask": mask, "values": values,
            "index": index}


def reinforce_pp_reset(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                       gamma: float) -> torch.Tensor:
    """verl's compute_reinforce_plus_plus_outcome_advantage at b178a3c (not in 0.9.1)."""
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]  # "Reset after EOS"
    return verl_F.masked_whiten(returns, response_mask) * response_mask


def run(option: dict[str, Any], rows: list[dict[str, Any]]) -> list[list[float]]:
    t = tensors(rows, option.get("kl_coef", 0.0))
    config = SimpleNamespace(gamma=option.get("gamma", 1.0), lam=option.get("lam", 1.0))
    name = option["verl"]
    fn = core_algos.get_adv_estimator_fn(name) if name != RESET else reinforce_pp_reset
    if name == RESET:
        adv = fn(t["token_level_rewards"], t["response_mask"], config.gamma)
    elif name == "gae":
        adv, _ = fn(t["token_level_rewards"], t["values"], t["response_mask"],
                    gamma=config.gamma, lam=config.lam)
    elif name == "reinforce_plus_plus":
        adv, _ = fn(t["token_level_rewards"], t["response_mask"], config=config)
    elif name in ("grpo", "grpo_vectorized"):
        adv, _ = fn(t["token_level_rewards"], t["response_mask"], t["index"], epsilon=1e-6,
                    norm_adv_by_std_in_grpo=option.get("norm_by_std", True), config=config)
    else:
        adv, _ = fn(t["token_level_rewards"], t["response_mask"], t["index"], epsilon=1e-6,
                    config=config)
    assert adv.dtype == DTYPE, (name, adv.dtype)
    return adv.tolist()


def main() -> None:
    global DTYPE
    data, native = parity_args.parse()
    if native:
        DTYPE = torch.float32
    if not native:
        float64_group_mean_std()
    out = {option["name"]: {batch: run(option, rows) for batch, rows in data["batches"].items()}
           for option in data["options"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
