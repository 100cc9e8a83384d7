"""TRL's GRPOTrainer trained on rewardd's per-token advantages (``rewardd_client.trl``).

    trainer = GRPOTrainer(model=..., reward_funcs=reward, args=..., train_dataset=...)
    rewardd_advantages(trainer, "http://127.0.0.1:8000", {"estimator": "tempo"})
    trainer.train()

How: trl 1.16's ``GRPOTrainer`` computes scalar advantages in ``_generate_and_score_completions``
and its loss (``_compute_loss``) accepts advantages of shape (B,) or (B, T): the (B, T) form is
there "to support subclasses that provide advantages with shape (B, T)". The hook wraps two
methods of the trainer *instance*:

- ``_calculate_rewards`` keeps what it returns (the rewards of every reward function for the
  whole gathered batch, NaN where one returned None) and this process's completion token ids;
- ``_generate_and_score_completions`` runs as before, then its ``advantages`` are replaced by
  a (B, T) tensor: the token ids and loss masks of every process are gathered, the main process
  sends the whole batch to ``POST /v1/advantages`` (groups are TRL's contiguous blocks of
  ``num_generations``), the answer is broadcast, and each process keeps its own rows.

Why this way: it is one call on a trainer the user already built (their own GRPOTrainer
subclass included), and it touches only the two steps whose inputs and output TRL documents.
Rejected: a GRPOTrainer subclass (a user with a subclass of their own would need a second
one); advantages from a reward function (TRL normalises whatever a reward function returns,
and reward functions return one scalar per completion); patching TRL's module (global to the
process). The main process alone calls rewardd because a stateful estimator (``ha_dw``,
``ucb_curriculum``) must see each batch once; an error there is raised on every process, so
no process waits on a broadcast forever.

What is sent: each completion's token ids, its loss mask (TRL's completion mask times its
tool mask) and its rewards by reward function, with ``GRPOConfig.reward_weights`` as the
weights. TRL's convention for None is kept: a completion where every function returned None
is excluded from its group (advantage 0), one where only some did counts those as 0. The
profile defaults to ``trl`` (TRL's epsilon and std), so ``{"estimator": "grpo"}`` reproduces
TRL's own advantages on every token.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

from rewardd_client import RewarddClient, RewarddError
from rewardd_client.client import Wire

_NOT_NAME = re.compile(r"[^A-Za-z0-9_.:-]")
_HOOKED = ("_calculate_rewards", "_generate_and_score_completions")


def component_names(names: Sequence[str]) -> list[str]:
    """TRL's reward function names made into distinct rewardd component names (a name keeps
    letters, digits and ``_.:-``; others become ``_``; a repeat gets ``.2``, ``.3``...)."""
    out: list[str] = []
    for name in names:
        base = _NOT_NAME.sub("_", name)[:120] or "reward"
        candidate, count = base, 1
        while candidate in out:
            count += 1
            candidate = f"{base}.{count}"
        out.append(candidate)
    return out


def dense(value: Any, length: int) -> list[float]:
    """A rollout's advantages in any output format as ``length`` floats."""
    if value is None:
        return [0.0] * length
    if isinstance(value, (int, float)):
        return [float(value)] * length
    if isinstance(value, Mapping):
        return [float(v) for v, n in value["rle"] for _ in range(int(n))]
    return [float(v) for v in value]


def advantages_request(rows: Sequence[tuple[list[int], list[int]]],
                       rewards: Sequence[Sequence[float]], names: Sequence[str],
                       weights: Sequence[float], group_size: int,
                       advantage: Mapping[str, Any], run_id: str | None) -> dict[str, Any]:
    """The ``POST /v1/advantages`` body of a gathered TRL batch: ``rows`` (token ids, loss
    mask) and ``rewards`` (one value per reward function, NaN for None) in TRL's order."""
    if group_size < 1 or len(rows) % group_size:
        raise ValueError(f"num_generations: {len(rows)} completions do not split into groups "
                         f"of {group_size}")
    groups = []
    for start in range(0, len(rows), group_size):
        rollouts = []
        for i in range(start, start + group_size):
            ids, mask = rows[i]
            scored = any(not math.isnan(v) for v in rewards[i])
            rollout: dict[str, Any] = {
                "rollout_id": f"r{i}", "token_ids": ids, "num_tokens": len(ids),
                "rewards": {n: (0.0 if math.isnan(v) else v) if scored else None
                            for n, v in zip(names, rewards[i])}}
            if 0 in mask:
                rollout["mask"] = mask
            rollouts.append(rollout)
        groups.append({"group_id": f"g{start // group_size}", "rollouts": rollouts})
    spec = {"profile": "trl", **advantage, "output": "dense"}
    spec["weights"] = {**dict(zip(names, weights)), **advantage.get("weights", {})}
    body: dict[str, Any] = {"groups": groups, "advantage": spec}
    if run_id is not None:
        body["run_id"] = run_id
    return body


class _Hook:
    def __init__(self, trainer: Any, client: RewarddClient, advantage: Mapping[str, Any],
                 run_id: str | None) -> None:
        self.trainer, self.client, self.advantage, self.run_id = trainer, client, advantage, run_id
        self.ids: list[list[int]] = []
        self.rewards: Any = None
        self.calculate = trainer._calculate_rewards
        self.generate = trainer._generate_and_score_completions

    def calculate_rewards(self, inputs: Any, prompts: Any, completions: Any,
                          completion_ids_list: Sequence[Sequence[int]]) -> Any:
        self.rewards = self.calculate(inputs, prompts, completions, completion_ids_list)
        self.ids = [[int(t) for t in ids] for ids in completion_ids_list]
        return self.rewards

    def generate_and_score(self, inputs: Any) -> dict[str, Any]:
        output = self.generate(inputs)
        output["advantages"] = self.per_token(output)
        return output

    def _ask(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        trainer = self.trainer
        size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        body = advantages_request(rows, self.rewards.tolist(),
                                  component_names(trainer.reward_func_names),
                                  trainer.reward_weights.tolist(), size, self.advantage,
                                  self.run_id)
        answer = self.client.advantages(body)
        by_id = {r["rollout_id"]: r for g in answer["groups"] for r in g["rollouts"]}
        return [dense(by_id[f"r{i}"]["advantages"], len(ids)) for i, (ids, _) in enumerate(rows)]

    def per_token(self, output: Mapping[str, Any]) -> Any:
        import torch
        from accelerate.utils import broadcast_object_list, gather_object

        accelerator = self.trainer.accelerator
        mask = output["completion_mask"]
        if output.get("tool_mask") is not None:
            mask = mask * output["tool_mask"]
        local = [(ids, mask[row, :len(ids)].tolist()) for row, ids in enumerate(self.ids)]
        rows = gather_object(local)
        payload: list[Any] = [None]
        failure: Exception | None = None
        if accelerator.is_main_process:
            try:
                payload = [("ok", self._ask(rows))]
            except RewarddError as exc:  # the other processes raise the same class
                failure, payload = exc, [("rewardd", (type(exc), exc.status, exc.detail))]
            except Exception as exc:
                failure, payload = exc, [("failed", f"{type(exc).__name__}: {exc}")]
        status, value = broadcast_object_list(payload)[0]
        if failure is not None:
            raise failure
        if status == "rewardd":
            kind, code, detail = value
            raise kind(code, detail)
        if status == "failed":
            raise RuntimeError(f"rewardd advantages: the main process's request failed: {value}")
        start = accelerator.process_index * len(self.ids)
        advantages = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        for row, values in enumerate(value[start:start + len(self.ids)]):
            advantages[row, :len(values)] = torch.tensor(values, dtype=torch.float32)
        return advantages


def rewardd_advantages(trainer: Any, base_url: str, advantage: str | Mapping[str, Any] = "grpo",
                       *, run_id: str | None = None, wire: Wire = "json",
                       api_key: str | None = None, timeout: float = 600.0,
                       client: RewarddClient | None = None) -> Any:
    """Make ``trainer`` (a trl 1.16 ``GRPOTrainer``) train on rewardd's per-token advantages.

    ``advantage``: an estimator name or an ``advantage`` spec of ``POST /v1/advantages``
    (estimator, params, transforms, reweight...; ``profile`` defaults to ``trl``; ``output`` is
    always dense). ``run_id`` names the run for stateful entries. Returns the trainer.
    """
    missing = [name for name in _HOOKED if not callable(getattr(trainer, name, None))]
    if missing:
        raise TypeError(f"trainer: {type(trainer).__name__} has no {', '.join(missing)}; "
                        "rewardd_advantages hooks trl 1.16's GRPOTrainer")
    spec = {"estimator": advantage} if isinstance(advantage, str) else dict(advantage)
    hook = _Hook(trainer, client or RewarddClient(base_url, wire=wire, api_key=api_key,
                                                  timeout=timeout), spec, run_id)
    trainer._calculate_rewards = hook.calculate_rewards
    trainer._generate_and_score_completions = hook.generate_and_score
    return trainer
