"""A stand-in for trl 1.16's GRPOTrainer as ``rewardd_advantages`` sees it, on one process.

It has the attributes the hook reads (``reward_funcs``, ``reward_func_names``,
``reward_weights``, ``accelerator``, ``num_generations``, ``state``, ``_log_metric``) and the
three methods it wraps, which call each other as TRL's do: ``_generate_and_score_completions``
calls ``_generate``, then ``_calculate_rewards`` (TRL's loop over the reward functions, None
as NaN), and returns the loss masks. accelerate's collectives are the identity on one process
(:func:`single_process_accelerate`), so the hook runs without TRL or accelerate installed; the
real trainer is ``make test-trl``'s business. Used to count the hook's requests per step and to
compare its one-call and two-call paths.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Sequence

import pytest
import torch


def single_process_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    """``accelerate.utils`` with the single-process behaviour of ``gather_object`` and
    ``broadcast_object_list`` (both return what they are given)."""
    utils = types.ModuleType("accelerate.utils")
    utils.gather_object = lambda objects: list(objects)
    utils.broadcast_object_list = lambda objects: objects
    package = types.ModuleType("accelerate")
    package.utils = utils
    monkeypatch.setitem(sys.modules, "accelerate", package)
    monkeypatch.setitem(sys.modules, "accelerate.utils", utils)


@dataclass
class Batch:
    """One step's generation: what ``_generate`` returns and the loss masks TRL then builds."""

    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]]
    answers: list[Any]
    tool_masks: list[list[int]] | None = None
    loss_tool_masks: list[list[int]] | None = None
    """The tool masks TRL's output carries (default: ``tool_masks``); differing ones stand for
    a loss mask the hook could not predict."""


@dataclass
class StandInTrainer:
    reward_funcs: list[Any]
    num_generations: int
    reward_weights: torch.Tensor | None = None
    accelerator: Any = field(default_factory=lambda: SimpleNamespace(
        is_main_process=True, process_index=0, num_processes=1, device="cpu"))
    mask_truncated_completions: bool = False
    eos_token_ids: list[int] = field(default_factory=lambda: [0])
    metrics: list[tuple[str, float]] = field(default_factory=list)
    batch: Batch | None = None

    def __post_init__(self) -> None:
        self.reward_func_names = [f.__name__ for f in self.reward_funcs]
        if self.reward_weights is None:
            self.reward_weights = torch.ones(len(self.reward_funcs))
        self.num_generations_eval = self.num_generations
        self.model = SimpleNamespace(training=True)
        self.state = SimpleNamespace(global_step=0)
        self._tokenizer = SimpleNamespace(pad_token_id=-1)

    def _log_metric(self, name: str, value: float) -> None:
        self.metrics.append((name, value))

    def _generate(self, prompts: list[Any]) -> tuple:
        batch = self.batch
        return (None, batch.completion_ids, batch.tool_masks, batch.completions, None, None,
                None, None)

    def _calculate_rewards(self, inputs: list[dict], prompts: list[Any], completions: list[Any],
                           completion_ids_list: list[list[int]]) -> torch.Tensor:
        keys = [k for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")]
        kwargs = {k: [row[k] for row in inputs] for k in keys}
        kwargs.update(trainer_state=self.state, log_extra=lambda *a: None,
                      log_metric=self._log_metric)
        columns = []
        for function in self.reward_funcs:
            values = function(prompts=prompts, completions=completions,
                              completion_ids=completion_ids_list, **kwargs)
            if inspect.isawaitable(values):
                values = asyncio.run(values)
            columns.append([math.nan if v is None else v for v in values])
        return torch.tensor(list(zip(*columns)), dtype=torch.float32)

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        prompts = [row["prompt"] for row in inputs]
        _, ids, _, completions, *_ = self._generate(prompts)
        self._calculate_rewards(inputs, prompts, completions, ids)
        width = max(len(row) for row in ids)
        ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        completion_mask = torch.tensor([
            [int(not (self.mask_truncated_completions and row[-1] not in ends))] * len(row)
            + [0] * (width - len(row)) for row in ids])  # TRL's mask_truncated_completions
        tools = self.batch.loss_tool_masks or self.batch.tool_masks
        tool_mask = None if tools is None else torch.tensor(
            [list(mask) + [1] * (width - len(mask)) for mask in tools])
        return {"completion_mask": completion_mask, "tool_mask": tool_mask,
                "advantages": torch.zeros(len(ids))}

    def step(self, batch: Batch) -> torch.Tensor:
        """One generation batch through the (hooked) trainer: the advantages TRL trains on."""
        self.batch = batch
        inputs = [{"prompt": p, "answer": a} for p, a in zip(batch.prompts, batch.answers)]
        advantages = self._generate_and_score_completions(inputs)["advantages"]
        self.state.global_step += 1
        return advantages


def rows_of(advantages: torch.Tensor, ids: Sequence[Sequence[int]]) -> list[list[float]]:
    """The advantages of each completion, without padding."""
    return [advantages[i, :len(row)].tolist() for i, row in enumerate(ids)]
