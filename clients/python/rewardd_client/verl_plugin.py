"""What verl looks up by name: the ``rewardd`` reward manager and the ``rewardd`` estimator.

Imported by verl itself: ``rewardd-client`` declares this module under the ``verl.plugins``
entry-point group, which verl 0.9.1 loads on ``import verl`` in every process, so
``reward.reward_manager.name=rewardd`` and ``algorithm.adv_estimator=rewardd`` resolve in the
driver, the trainer actor and the reward workers alike. Needs verl, torch, numpy and aiohttp
(``pip install 'rewardd-client[verl]'``); the rest of the adapter (:mod:`rewardd_client.verl`,
where the design is explained) does not.

A failed import is logged at ERROR before it is raised: verl 0.9.1 loads plugins in
``verl/__init__.py`` inside ``try: ep.load() except Exception`` and logs the exception at
debug level, so without the log a missing package (aiohttp, which verl's reward loop imports
but verl does not declare) left only ``Unknown advantage estimator simply: rewardd`` later.

The manager's one-request batching. verl's reward loop calls ``run_single`` once per sample:
a worker turns its chunk of the batch into one task per sample and gathers them, so every
sample of the chunk reaches ``run_single`` in the same event-loop turn. Each call parks its
sample and a future; the first also starts a flush task, which asyncio runs only after the
tasks already queued, that is after the rest of the chunk has parked. The flush sends all
parked samples as one ``POST /v1/rewards`` and resolves each future with its sample's result.
Alternatives: a fixed count (the chunk size is not known to the manager), or a timer alone
(adds its delay to every batch). ``batch_window_s`` (default 0) adds a wait, for verl's
streaming mode, where the agent loop sends samples one remote call at a time as they finish.
With ``reward.num_workers`` workers a batch is ``num_workers`` requests (one per chunk); set it
to 1 for one request per batch. A chunk may hold only part of a uid's group: per-rollout
verifiers do not care; group-level ones (arena, tournament) then see part of the group.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

from rewardd_client._requires import announce, missing_dependency

try:
    import numpy as np
    import torch
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager import register
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
    from verl.trainer.ppo.core_algos import register_adv_est
except ImportError as exc:  # verl would hide it (debug log): say it at ERROR, then raise
    raise announce(missing_dependency(
        exc, adapter="rewardd_client.verl_plugin (verl's 'rewardd' reward manager and "
        "advantage estimator)", extra="verl", trainer="verl", trainer_version=">=0.9.1")) from exc

from rewardd_client._groups import runs_of_equal
from rewardd_client._rewards import reference_of, sentinel_flags
from rewardd_client.tensors import advantages_tensor
from rewardd_client.verl_settings import EXTRA_PREFIX, Settings, extra_info_of, settings_from

__all__ = ["NAME", "RewarddRewardManager", "compute_rewardd_advantage", "rewards_request",
           "advantages_request"]

NAME = "rewardd"


@dataclass(frozen=True)
class Sample:
    """One row of a DataProto as rewardd needs it."""

    uid: str | None
    prompt_ids: tuple
    completion: str
    ground_truth: Any
    num_tokens: int


def samples_of(data: DataProto, tokenizer: Any) -> list[Sample]:
    """Each row's uid, valid prompt ids, decoded response (special tokens skipped, as verl's
    own managers decode it), ground truth and response length."""
    prompts, responses = data.batch["prompts"], data.batch["responses"]
    prompt_len = prompts.shape[-1]
    attention = data.batch["attention_mask"]
    uids = data.non_tensor_batch.get("uid")
    out = []
    for i in range(len(data)):
        length = int(attention[i, prompt_len:].sum())
        prompt = prompts[i][attention[i, :prompt_len].bool()]
        out.append(Sample(
            uid=None if uids is None else str(uids[i]),
            prompt_ids=tuple(prompt.tolist()),
            completion=tokenizer.decode(responses[i][:length], skip_special_tokens=True),
            ground_truth=data.non_tensor_batch["reward_model"][i].get("ground_truth"),
            num_tokens=length))
    return out


def _groups(samples: Sequence[Sample]) -> list[list[int]]:
    """Row indexes per group: by uid (verl's grouping, wherever the rows lie) or, without
    uids, runs of equal prompt and ground truth."""
    if all(s.uid is not None for s in samples):
        by_uid: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(samples):
            by_uid[s.uid].append(i)
        return list(by_uid.values())
    keys = [(s.prompt_ids, repr(s.ground_truth)) for s in samples]
    return [list(run) for run in runs_of_equal(keys)]


def rewards_request(samples: Sequence[Sample], settings: Settings, tokenizer: Any
                    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The ``POST /v1/rewards`` body for ``samples`` and each sample's (group_id,
    rollout_id). Group ids are the uids; rollout ids the row numbers."""
    groups, keys = [], [("", "")] * len(samples)
    for number, rows in enumerate(_groups(samples)):
        first = samples[rows[0]]
        group_id = first.uid if first.uid is not None else str(number)
        groups.append({
            "group_id": group_id,
            "prompt": tokenizer.decode(list(first.prompt_ids), skip_special_tokens=True),
            "reference": reference_of(first.ground_truth, settings.reference_key),
            "rollouts": [{"rollout_id": str(i), "completion": samples[i].completion,
                          "num_tokens": samples[i].num_tokens} for i in rows]})
        for i in rows:
            keys[i] = (group_id, str(i))
    body: dict[str, Any] = {"groups": groups, "rewards": settings.rewards}
    if settings.run_id is not None:
        body["run_id"] = settings.run_id
    return body, keys


def _results(response: dict[str, Any], keys: Sequence[tuple[str, str]],
             settings: Settings) -> list[dict[str, Any]]:
    """Per sample, verl's reward-loop result: ``reward_score`` and ``reward_extra_info``
    (with a ``run_id``, also the server sentinel's signals as ``rewardd_sentinel_<signal>``,
    1.0 while one holds: docs/sentinel.md)."""
    by_key = {(g["group_id"], r["rollout_id"]): r
              for g in response["groups"] for r in g["rollouts"]}
    out = []
    flags = sentinel_flags(response["summary"], f"{EXTRA_PREFIX}sentinel_")
    for key in keys:
        rollout = by_key[key]
        info = {**extra_info_of(rollout, settings.rewards), **flags}
        out.append({"reward_score": float(rollout["reward"]), "reward_extra_info": info})
    return out


@register(NAME)
class RewarddRewardManager(RewardManagerBase):
    """verl reward manager scoring with rewardd, a batch per request (module docstring).

    Settings come from the trainer config's ``reward.rewardd`` section (``base_url``,
    ``rewards``, ``run_id``, ``reference_key``, ``batch_window_s``, client options), then the
    environment (:func:`rewardd_client.verl_settings.settings_from`). ``compute_score`` (what verl
    passes from ``custom_reward_function``) is not used: the components are rewardd's."""

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any = None,
                 reward_router_address: str | None = None, reward_model_tokenizer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(config, tokenizer, compute_score)
        section = config.get("reward", {}).get(NAME) if config is not None else None
        self.settings = settings_from(section)
        self._parked: list[tuple[Sample, asyncio.Future]] = []
        self._flushes: set[asyncio.Task] = set()

    async def run_single(self, data: DataProto) -> dict:
        """verl's per-sample call (multi-sequence outputs: the last sequence counts, as in
        verl's own managers); answered from the batch this sample's turn belongs to."""
        sample = samples_of(data[-1:], self.tokenizer)[0]  # no await before parking
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._parked.append((sample, future))
        if len(self._parked) == 1:
            task = loop.create_task(self._flush())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        return await future

    async def _flush(self) -> None:
        if self.settings.batch_window_s:
            await asyncio.sleep(self.settings.batch_window_s)
        parked, self._parked = self._parked, []
        try:
            body, keys = rewards_request([s for s, _ in parked], self.settings, self.tokenizer)
            response = await self.settings.async_client().rewards(body)
            results = _results(response, keys, self.settings)
        except BaseException as exc:  # every parked sample learns why; nothing is dropped
            for _, future in parked:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), result in zip(parked, results):
            if not future.done():
                future.set_result(result)

    def __call__(self, data: DataProto, return_dict: bool = False) -> Any:
        """A whole batch in one request (verl's pre-reward-loop manager interface): the
        (B, response_length) float32 reward tensor, reward at each response's last valid
        token, and with ``return_dict`` also ``reward_extra_info`` (lists, one entry per row)."""
        samples = samples_of(data, self.tokenizer)
        body, keys = rewards_request(samples, self.settings, self.tokenizer)
        results = _results(self.settings.client().rewards(body), keys, self.settings)
        scores = [r["reward_score"] for r in results]
        reward_tensor = self.assemble_rm_scores(data, scores)
        if not return_dict:
            return reward_tensor
        extra: dict[str, list] = defaultdict(list)
        for result in results:
            for key, value in result["reward_extra_info"].items():
                extra[key].append(value)
        return {"reward_tensor": reward_tensor, "reward_extra_info": dict(extra)}


def _length_and_mask(row: torch.Tensor) -> tuple[int, list[int] | None]:
    """A response's length (through its last mask-1 token) and its tool-token mask when it
    has zeros inside (None when every token counts)."""
    on = torch.nonzero(row, as_tuple=False)
    if on.numel() == 0:
        return 0, None
    length = int(on[-1]) + 1
    inside = row[:length]
    return length, (None if bool(inside.all()) else [int(v) for v in inside.tolist()])


def advantages_request(scores: Sequence[float], response_mask: torch.Tensor, index: Any,
                       settings: Settings) -> tuple[dict[str, Any], list[str]]:
    """The ``POST /v1/advantages`` body (groups by uid, each rollout's precomputed
    ``reward``, ``num_tokens`` and tool-token ``mask``) and the rollout ids by row."""
    if index is None:
        raise ValueError("compute_rewardd_advantage: index (verl's uid per row) is required "
                         "to form groups; verl passes it when the batch has a 'uid'")
    if len(index) != len(scores):
        raise ValueError(f"compute_rewardd_advantage: index has {len(index)} entries, "
                         f"token_level_rewards {len(scores)} rows")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row, (uid, score) in enumerate(zip(index, scores)):
        length, mask = _length_and_mask(response_mask[row])
        rollout: dict[str, Any] = {"rollout_id": str(row), "reward": score, "num_tokens": length}
        if mask is not None:
            rollout["mask"] = mask
        groups[str(uid)].append(rollout)
    advantage = {"output": "rle", **settings.advantage}
    body: dict[str, Any] = {"groups": [{"group_id": g, "rollouts": r} for g, r in groups.items()],
                            "advantage": advantage}
    if settings.run_id is not None:
        body["run_id"] = settings.run_id
    return body, [str(row) for row in range(len(scores))]


@register_adv_est(NAME)
def compute_rewardd_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                              index: np.ndarray | None = None, config: Any = None,
                              **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator ``rewardd``: rewardd's per-token advantages for verl's batch.

    Each row's reward is ``token_level_rewards`` summed over tokens (what verl's outcome
    estimators use), grouped by ``index`` (the uids); the estimator, profile and any
    reweights or filters are ``algorithm.rewardd.advantage`` (or ``REWARDD_ADVANTAGE``;
    default GRPO with verl's conventions). Returns ``(advantages, returns)``, both
    (bs, response_length) in the rewards' dtype and device, zero where ``response_mask`` is,
    returns equal to advantages (outcome estimators define no separate returns). Other
    keyword arguments verl passes (``reward_baselines``, ...) are ignored.
    """
    section = config.get(NAME) if config is not None and hasattr(config, "get") else None
    settings = settings_from(section)
    scores = token_level_rewards.sum(dim=-1).tolist()
    body, ids = advantages_request(scores, response_mask, index, settings)
    response = settings.client().advantages(body)
    values, _ = advantages_tensor(response, backend="torch", max_len=response_mask.shape[-1],
                                  rollout_ids=ids)
    mask = response_mask.to(device=token_level_rewards.device)
    advantages = values.to(dtype=token_level_rewards.dtype, device=mask.device) * mask
    return advantages, advantages
