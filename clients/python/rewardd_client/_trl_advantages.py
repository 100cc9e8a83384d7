"""TRL's GRPOTrainer trained on rewardd's per-token advantages (``rewardd_client.trl``).

    trainer = GRPOTrainer(model=..., reward_funcs=reward, args=..., train_dataset=...)
    rewardd_advantages(trainer, "http://127.0.0.1:8000", {"estimator": "tempo"})
    trainer.train()

How: trl 1.16's ``GRPOTrainer`` computes scalar advantages in ``_generate_and_score_completions``
and its loss (``_compute_loss``) accepts advantages of shape (B,) or (B, T): the (B, T) form is
there "to support subclasses that provide advantages with shape (B, T)". The hook wraps three
methods of the trainer *instance*:

- ``_generate`` keeps the tool masks of this process's completions (to predict the loss mask);
- ``_calculate_rewards`` answers TRL with the rewards of every reward function for the whole
  gathered batch (NaN where one returned None). When the trainer's reward functions are all
  rewardd's, made by one call, the hook computes them itself: every process's rows go to the
  main process, which sends ONE ``POST /v1/score`` (rewards and advantages together,
  :mod:`rewardd_client._trl_score`) and broadcasts the rewards. Otherwise TRL's own method runs
  (each process's rewardd functions send ``POST /v1/rewards``) and its result is kept;
- ``_generate_and_score_completions`` runs as before, then its ``advantages`` are replaced by
  a (B, T) tensor: the token ids and loss masks of every process are gathered, the main process
  takes the advantages of its ``/v1/score`` answer, or, on the two-call path (or where that
  answer cannot stand: see :mod:`rewardd_client._trl_score`), sends the whole batch to
  ``POST /v1/advantages`` (groups are TRL's contiguous blocks of ``num_generations``); the
  answer is broadcast, and each process keeps its own rows.

Round trips per step, measured by the server's request counts in ``make test-trl`` (2
processes, one async reward function): 3 before (2 ``/v1/rewards``, 1 ``/v1/advantages``),
1 now (``/v1/score``), 2 on a step with a partly failed rollout. With a reward function that
is not rewardd's the path stays at two calls: TRL computes that function's rewards in its own
loop on each process, and one ``/v1/score`` would have to take that loop over.

Why this way: it is one call on a trainer the user already built (their own GRPOTrainer
subclass included), and it touches only steps whose inputs and outputs TRL documents.
Rejected: a GRPOTrainer subclass (a user with a subclass of their own would need a second
one); advantages from a reward function (TRL normalises whatever a reward function returns,
and reward functions return one scalar per completion); patching TRL's module (global to the
process). The main process alone calls rewardd because a stateful estimator (``ha_dw``,
``ucb_curriculum``) must see each batch once; an error there is raised on every process, so
no process waits on a broadcast forever (:mod:`rewardd_client._trl_collective`).

What is sent: each completion's token ids, its loss mask (TRL's completion mask times its
tool mask) and its rewards by reward function, with ``GRPOConfig.reward_weights`` as the
weights. TRL's convention for None is kept: a completion where every function returned None
is excluded from its group (advantage 0), one where only some did counts those as 0. The
profile defaults to ``trl`` (TRL's epsilon and std), so ``{"estimator": "grpo"}`` reproduces
TRL's own advantages on every token.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Mapping, Sequence

from rewardd_client._catalogue import check_advantage
from rewardd_client._requires import require
from rewardd_client._rewards import AdvantageArg, parse_advantage
from rewardd_client._trl_batch import completion_text, prompt_text, step_of
from rewardd_client._trl_collective import on_main_process
from rewardd_client._trl_score import (Fusion, Row, blocks_agree, dense, fusion_of,
                                       read_score, score_request)
from rewardd_client.client import RewarddClient, Wire

__all__ = ["advantages_request", "component_names", "dense", "rewardd_advantages"]

_LOG = logging.getLogger("rewardd_client")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.:-]")
_HOOKED = ("_calculate_rewards", "_generate_and_score_completions")
_RESERVED = ("prompt", "completion", "completion_ids")  # TRL passes these columns apart


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
    """What the wrapped methods share within a step (the module docstring says how)."""

    def __init__(self, trainer: Any, client: RewarddClient, advantage: Mapping[str, Any],
                 run_id: str | None) -> None:
        self.trainer, self.client, self.advantage, self.run_id = trainer, client, advantage, run_id
        self.fusion = fusion_of(list(trainer.reward_funcs))
        self.ids: list[list[int]] = []
        self.rewards: Any = None
        self.tool_masks: Sequence[Any] | None = None
        # main process, one-call path: the (token ids, mask) rows sent and their advantages
        self.scored: tuple[list[tuple[list[int], list[int]]], list[list[float]]] | None = None
        self.calculate = trainer._calculate_rewards
        self.generate = trainer._generate_and_score_completions
        self.sample = getattr(trainer, "_generate", None)

    def sample_completions(self, prompts: Any) -> Any:
        result = self.sample(prompts)
        masks = result[2] if isinstance(result, tuple) and len(result) > 2 else None
        self.tool_masks = masks if isinstance(masks, (list, tuple)) else None
        return result

    def calculate_rewards(self, inputs: Any, prompts: Any, completions: Any,
                          completion_ids_list: Sequence[Sequence[int]]) -> Any:
        self.ids = [[int(t) for t in ids] for ids in completion_ids_list]
        self.scored = None
        rewards = None
        if self.fusion is not None:
            rewards = self.score(self.fusion, inputs, prompts, completions)
        if rewards is None:
            rewards = self.calculate(inputs, prompts, completions, completion_ids_list)
        self.rewards = rewards
        return rewards

    def score(self, fusion: Fusion, inputs: Any, prompts: Sequence[Any],
              completions: Sequence[Any]) -> Any:
        """The one-call path: TRL's rewards tensor from one ``/v1/score`` (None when this
        batch's blocks differ in prompt or reference: the two-call path then runs)."""
        import torch
        from accelerate.utils import gather_object

        trainer = self.trainer
        columns = {key: [row[key] for row in inputs] for key in inputs[0] if key not in _RESERVED}
        references = fusion.batch.references(prompts, columns)
        local = [Row(prompt_text(p), completion_text(c), reference, ids,
                     self.predicted_mask(i, ids))
                 for i, (p, c, reference, ids) in enumerate(zip(prompts, completions,
                                                                 references, self.ids))]
        rows = gather_object(local)
        size = self.group_size()
        if not blocks_agree(rows, size):  # every process sees the same rows: same decision
            return None
        values, failed = on_main_process(trainer.accelerator,
                                         lambda: self.ask_score(fusion, rows, size), "score")
        log_metric = getattr(trainer, "_log_metric", None)
        if callable(log_metric):  # as the reward functions log it: this process's rows
            start = trainer.accelerator.process_index * len(prompts)
            log_metric("rewardd/failed_cells", float(sum(failed[start:start + len(prompts)])))
        return torch.tensor(values, dtype=torch.float32, device=trainer.accelerator.device)

    def ask_score(self, fusion: Fusion, rows: list[Row], size: int
                  ) -> tuple[list[list[float]], list[int]]:
        weights = self.weights()
        body = score_request(rows, fusion, weights, size, self.advantage,
                             self.run_id or fusion.batch.run_id,
                             step_of(getattr(self.trainer, "state", None)))
        reading = read_score(self.client.score(body), fusion, rows, weights)
        if reading.advantages is not None:
            self.scored = ([(row.token_ids, row.mask) for row in rows], reading.advantages)
        return reading.columns, reading.failed_cells

    def predicted_mask(self, index: int, ids: Sequence[int]) -> list[int]:
        """The loss mask TRL will build for completion ``index``: its tool mask (from
        ``_generate``), all zeros for a truncated completion under
        ``mask_truncated_completions``. A wrong guess costs a second request, never a wrong
        advantage (:meth:`advantages_of` compares it with TRL's)."""
        mask = [1] * len(ids)
        tools = self.tool_masks
        if tools is not None and index < len(tools) and tools[index] is not None:
            for position, value in enumerate(list(tools[index])[:len(ids)]):
                mask[position] = int(value)
        trainer = self.trainer
        if getattr(trainer, "mask_truncated_completions", False) and ids:
            ends = {*getattr(trainer, "eos_token_ids", ()),
                    getattr(getattr(trainer, "_tokenizer", None), "pad_token_id", None)}
            if ids[-1] not in ends:
                mask = [0] * len(ids)
        return mask

    def group_size(self) -> int:
        trainer = self.trainer
        return trainer.num_generations if trainer.model.training else trainer.num_generations_eval

    def weights(self) -> list[float]:
        """Per reward function, the weight TRL trains on: ``GRPOConfig.reward_weights``,
        overridden by name by the advantage spec's ``weights``."""
        overrides = self.advantage.get("weights", {})
        names = component_names(self.trainer.reward_func_names)
        return [float(overrides.get(name, weight))
                for name, weight in zip(names, self.trainer.reward_weights.tolist())]

    def generate_and_score(self, inputs: Any) -> dict[str, Any]:
        output = self.generate(inputs)
        output["advantages"] = self.per_token(output)
        return output

    def advantages_of(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """Main process: the one call's advantages when it was sent exactly these rows,
        else ``POST /v1/advantages`` (the two-call path)."""
        if self.scored is not None:
            sent, advantages = self.scored
            if [(list(ids), list(mask)) for ids, mask in rows] == sent:
                return advantages
            _LOG.warning("rewardd_advantages: TRL's loss mask differs from the one predicted "
                         "for POST /v1/score; asking POST /v1/advantages with TRL's mask")
        return self._ask(rows)

    def _ask(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        trainer = self.trainer
        body = advantages_request(rows, self.rewards.tolist(),
                                  component_names(trainer.reward_func_names),
                                  trainer.reward_weights.tolist(), self.group_size(),
                                  self.advantage, self.run_id)
        answer = self.client.advantages(body)
        by_id = {r["rollout_id"]: r for g in answer["groups"] for r in g["rollouts"]}
        return [dense(by_id[f"r{i}"]["advantages"], len(ids)) for i, (ids, _) in enumerate(rows)]

    def per_token(self, output: Mapping[str, Any]) -> Any:
        import torch
        from accelerate.utils import gather_object

        accelerator = self.trainer.accelerator
        mask = output["completion_mask"]
        if output.get("tool_mask") is not None:
            mask = mask * output["tool_mask"]
        local = [(ids, [int(v) for v in mask[row, :len(ids)].tolist()])
                 for row, ids in enumerate(self.ids)]
        rows = gather_object(local)
        value = on_main_process(accelerator, lambda: self.advantages_of(rows), "advantages")
        start = accelerator.process_index * len(self.ids)
        advantages = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        for row, values in enumerate(value[start:start + len(self.ids)]):
            advantages[row, :len(values)] = torch.tensor(values, dtype=torch.float32)
        return advantages


def rewardd_advantages(trainer: Any, base_url: str, advantage: AdvantageArg = "grpo",
                       *, run_id: str | None = None, wire: Wire = "json",
                       api_key: str | None = None, timeout: float = 600.0,
                       client: RewarddClient | None = None, validate: bool = True) -> Any:
    """Make ``trainer`` (a trl 1.16 ``GRPOTrainer``) train on rewardd's per-token advantages.

    ``advantage``: an estimator name (``"tempo"``), or an ``advantage`` spec of ``POST
    /v1/advantages`` as a mapping or JSON text (estimator, params, transforms, reweight...;
    ``profile`` defaults to ``trl``; ``output`` is always dense): the forms
    ``REWARDD_ADVANTAGE`` takes (:func:`rewardd_client._rewards.parse_advantage`). ``run_id``
    names the run for stateful entries (default: the reward functions' ``run_id``, on the
    one-call path). ``validate`` (default True) checks the spec's names against ``GET
    /v1/estimators`` now (:class:`~rewardd_client._catalogue.NotInCatalogue`;
    :class:`~rewardd_client._catalogue.CatalogueUnavailable` when the server cannot be
    read). Needs torch and accelerate (``pip install 'rewardd-client[trl]'``; TRL has them).
    Returns the trainer.
    """
    missing = [name for name in _HOOKED if not callable(getattr(trainer, name, None))]
    if missing:
        raise TypeError(f"trainer: {type(trainer).__name__} has no {', '.join(missing)}; "
                        "rewardd_advantages hooks trl 1.16's GRPOTrainer")
    require(("torch", "accelerate"), adapter="rewardd_client.trl.rewardd_advantages",
            extra="trl")
    spec = parse_advantage(advantage, "trl")
    client = client or RewarddClient(base_url, wire=wire, api_key=api_key, timeout=timeout)
    if validate:
        check_advantage(client, spec, "trl")
    hook = _Hook(trainer, client, spec, run_id)
    trainer._calculate_rewards = hook.calculate_rewards
    trainer._generate_and_score_completions = hook.generate_and_score
    if callable(hook.sample):
        trainer._generate = hook.sample_completions
    return trainer
