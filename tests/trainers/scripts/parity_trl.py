"""TRL 1.16's own advantage code on the parity batches, in float64 (tests/trainers/parity.py).

    parity_trl.py BATCHES.json [native]   prints {option: {batch: [[advantage per token]]}}

``native`` runs TRL's statements in float32, as TRL does (the zero-spread noise of issue 16,
item 5).

GRPOTrainer and RLOOTrainer compute advantages inside ``_generate_and_score_completions``,
between generation and the loss, so the code cannot be called on its own. The statements
from ``unscorable_mask = ...`` through ``advantages = torch.nan_to_num(advantages, nan=0.0)``
are read from the installed trainer with ``ast`` at run time (never copied into the
repository) and run as the body of a function whose ``self`` holds the config fields they
read (scale_rewards, multi_objective_aggregation, reward_weights, normalize_advantages,
reward_clip_range None, beta 0). ``rewards_per_func`` is what ``_calculate_rewards`` returns:
one column per reward function, NaN where a function returned None; float64 here, with
float64 as torch's default dtype, so the statements compute in float64 with no edit. A row's advantage is TRL's per-completion scalar,
printed on every token position.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import textwrap
from types import SimpleNamespace
from typing import Any

import torch
from trl.trainer import grpo_trainer, rloo_trainer

import parity_args

MAX_LEN = 12
DTYPE = torch.float64
"""float64, or the trainer's own float32 with ``native`` (the zero-spread noise of item 5)."""


def advantage_block(module: Any, cls_name: str) -> Any:
    """The trainer's advantage statements as ``fn(self, rewards_per_func, num_generations,
    device) -> advantages``."""
    cls = getattr(module, cls_name)
    source = textwrap.dedent(inspect.getsource(cls._generate_and_score_completions))
    [method] = ast.parse(source).body
    body = method.body
    start = next(k for k, s in enumerate(body) if isinstance(s, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "unscorable_mask"
                         for t in s.targets))
    end = next(k for k, s in enumerate(body) if isinstance(s, ast.Assign)
               and "nan_to_num" in ast.unparse(s.value)
               and any(isinstance(t, ast.Name) and t.id == "advantages" for t in s.targets))
    assert start < end, (cls_name, start, end)
    statements = body[start:end + 1]
    fn = ast.parse("def block(self, rewards_per_func, num_generations, device):\n    pass\n")
    fn.body[0].body = statements + [ast.parse("return advantages").body[0]]
    namespace = dict(vars(module))
    exec(compile(ast.unparse(ast.fix_missing_locations(fn)), f"{cls_name}.advantages", "exec"),
         namespace)
    return namespace["block"]


def rewards_per_func(rows: list[dict[str, Any]], components: bool) -> torch.Tensor:
    if not components:
        return torch.tensor([[row["reward"]] for row in rows], dtype=DTYPE)
    return torch.tensor([[math.nan if v is None else v for v in row["components"]]
                         for row in rows], dtype=DTYPE)


def run(blocks: dict[str, Any], option: dict[str, Any], rows: list[dict[str, Any]]
        ) -> list[list[float]]:
    components = option.get("components", False)
    weights = option.get("weights", [1.0, 0.5] if components else [1.0])
    self = SimpleNamespace(
        scale_rewards=option.get("scale_rewards", "group"),
        multi_objective_aggregation=option.get("aggregation", "sum_then_normalize"),
        reward_weights=torch.tensor(weights, dtype=DTYPE),
        reward_funcs=[None] * len(weights), normalize_advantages=option.get("normalize", False),
        reward_clip_range=None, beta=0.0)
    size = sum(1 for r in rows if r["group"] == rows[0]["group"])
    advantages = blocks[option["trl"]](self, rewards_per_func(rows, components), size, "cpu")
    assert advantages.dtype == DTYPE, advantages.dtype
    return [[value] * MAX_LEN for value in advantages.tolist()]


def main() -> None:
    global DTYPE
    data, native = parity_args.parse()
    if native:
        DTYPE = torch.float32
    blocks = {"grpo": advantage_block(grpo_trainer, "GRPOTrainer"),
              "rloo": advantage_block(rloo_trainer, "RLOOTrainer")}
    out = {option["name"]: {batch: run(blocks, option, rows)
                            for batch, rows in data["batches"].items()}
           for option in data["options"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
