"""Rewards and advantages of a TRL step in one ``POST /v1/score`` (the advantages hook's one call).

Without it, a GRPOTrainer step hooked by :func:`rewardd_client.trl.rewardd_advantages` costs
one ``POST /v1/rewards`` per process (TRL calls the reward functions on each process's slice)
and one ``POST /v1/advantages`` (the main process, once TRL has gathered the rewards): three
round trips per step on two processes. ``/v1/score`` verifies and computes advantages in one.

When the hook uses it: when every reward function of the trainer is a rewardd function made by
one call (:class:`Fusion`): then the hook can answer TRL's ``_calculate_rewards`` itself. Each
process sends its rows (prompt, completion, reference, token ids and the loss mask it predicts)
to the main process, which sends the whole batch in one ``/v1/score``, grouped as TRL groups it
(contiguous blocks of ``num_generations``), and broadcasts each function's column of rewards.
With a reward function of another kind (a Python function, a reward model) the hook keeps two
calls: TRL computes those rewards inside its own ``_calculate_rewards`` loop, on each process,
beside the rewardd ones, and a single ``/v1/score`` would have to replace that loop for
functions it does not own.

The one call must give exactly what the two calls give, so its advantages are used only when
nothing differs; otherwise the main process asks ``/v1/advantages`` as the two-call path does,
from the rewards it already has (a second round trip for that step only):

- the loss mask: TRL builds it (completion mask, tool mask, ``mask_truncated_completions``)
  after the hook predicted it; a differing mask is asked again with TRL's;
- a partly failed rollout (a failed check without ``fallback`` beside checks that passed): the
  reward functions return None for that check and TRL's convention makes it 0 (or, for a single
  weighted function, leaves the rollout out), which the server's profile rules need not match;
- blocks whose rows differ in prompt or reference (a ``reference_fn`` reading per-rollout
  fields): one ``/v1/score`` group has one reference, so such a step is scored the two-call way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rewardd_client._trl_batch import Batch

__all__ = ["Fusion", "Reading", "Row", "blocks_agree", "dense", "fusion_of", "read_score",
           "score_request"]


@dataclass(frozen=True)
class Row:
    """One completion as a process sends it to the main process (picklable)."""

    prompt: str
    completion: str
    reference: dict
    token_ids: list
    mask: list


@dataclass(frozen=True)
class Fusion:
    """The trainer's reward functions when one ``/v1/score`` can stand in for them: all made by
    one call, so they share one :class:`~rewardd_client._trl_batch.Batch` (the specs).
    ``components`` holds, per TRL reward function in order, the component it returns, or None
    for the single function returning the weighted reward."""

    batch: Batch
    components: tuple

    def weighted_specs(self, weights: Sequence[float]) -> list[dict[str, Any]]:
        """The reward specs with the weights TRL trains on (``weights``: one per function,
        ``GRPOConfig.reward_weights`` overridden by the advantage spec's ``weights``): each
        component's own weight, or for one weighted function its weight times each spec's."""
        specs = self.batch.specs
        if self.components == (None,):
            return [{**s, "weight": weights[0] * float(s.get("weight", 1.0))} for s in specs]
        by_name = dict(zip(self.components, weights))
        return [{**s, "weight": by_name[s["name"]]} for s in specs]


def fusion_of(reward_funcs: Sequence[Any]) -> Fusion | None:
    """The :class:`Fusion` of the trainer's reward functions, or None when one of them is not
    a rewardd function, they come from different calls, or they leave out a component."""
    batch = getattr(reward_funcs[0], "_batch", None) if reward_funcs else None
    if not isinstance(batch, Batch) or any(getattr(f, "_batch", None) is not batch
                                           for f in reward_funcs):
        return None
    components = tuple(getattr(f, "component", None) for f in reward_funcs)
    if components == (None,):
        return Fusion(batch, components)
    if None in components or sorted(components) != sorted(s["name"] for s in batch.specs):
        return None
    return Fusion(batch, components)


def blocks_agree(rows: Sequence[Row], size: int) -> bool:
    """Whether the gathered rows split into blocks of ``size`` sharing a prompt and reference
    (what TRL's sampler gives unless a reference reads per-rollout fields)."""
    if size < 1 or len(rows) % size:
        return False
    return all(rows[i].prompt == rows[start].prompt and rows[i].reference == rows[start].reference
               for start in range(0, len(rows), size) for i in range(start, start + size))


def score_request(rows: Sequence[Row], fusion: Fusion, weights: Sequence[float], size: int,
                  advantage: Mapping[str, Any], run_id: str | None, step: int | None
                  ) -> dict[str, Any]:
    """The ``POST /v1/score`` body of a gathered TRL batch (rows in TRL's order, rollout
    ``r<i>`` is row i, groups ``g<k>`` TRL's blocks of ``size``)."""
    groups = []
    for start in range(0, len(rows), size):
        rollouts = []
        for i in range(start, start + size):
            row = rows[i]
            rollout: dict[str, Any] = {"rollout_id": f"r{i}", "completion": row.completion,
                                       "token_ids": row.token_ids,
                                       "num_tokens": len(row.token_ids)}
            if 0 in row.mask:
                rollout["mask"] = row.mask
            rollouts.append(rollout)
        groups.append({"group_id": f"g{start // size}", "prompt": rows[start].prompt,
                       "reference": rows[start].reference, "rollouts": rollouts})
    # weights of precomputed components have none to apply to here: they went into the specs
    spec = {"profile": "trl", **{k: v for k, v in advantage.items() if k != "weights"},
            "output": "dense"}
    body: dict[str, Any] = {"groups": groups, "rewards": fusion.weighted_specs(weights),
                            "advantage": spec}
    if run_id is not None:
        body["run_id"] = run_id
    if step is not None:
        body["step"] = step
    return body


@dataclass(frozen=True)
class Reading:
    """What a ``/v1/score`` answer means to TRL, per gathered row: each reward function's
    value (NaN for None, as TRL stores it), the failed cells, and the dense advantages, or
    None when they may differ from the two-call path's (a partly failed rollout)."""

    columns: list
    failed_cells: list
    advantages: list | None


def read_score(answer: Mapping[str, Any], fusion: Fusion, rows: Sequence[Row],
               weights: Sequence[float]) -> Reading:
    """Read ``answer`` for ``rows`` as the reward functions would have returned their values
    (each component's value; for one weighted function rewardd's reward, None when a check
    failed without fallback, as ``/v1/rewards`` gives it)."""
    specs = fusion.batch.specs
    by_id = {r["rollout_id"]: r for g in answer["groups"] for r in g["rollouts"]}
    columns, failed, advantages, partial = [], [], [], False
    for i, row in enumerate(rows):
        rollout = by_id[f"r{i}"]
        values = [rollout["rewards"].get(s["name"]) for s in specs]
        missing = [v is None for v in values]
        partial = partial or (any(missing) and not all(missing))
        failed.append(sum(not status.get("ok", True) for status in rollout["status"].values()))
        if fusion.components == (None,):
            if any(missing):
                total = None
            elif weights[0] == 1.0:
                total = rollout["reward"]  # the server's sum, as /v1/rewards returns it
            else:  # the server summed with the TRL weight folded in; the function's is without
                total = sum(float(s.get("weight", 1.0)) * v for s, v in zip(specs, values))
            columns.append([math.nan if total is None else float(total)])
        else:
            value = dict(zip((s["name"] for s in specs), values))
            columns.append([math.nan if value[c] is None else float(value[c])
                            for c in fusion.components])
        advantages.append(dense(rollout.get("advantages"), len(row.token_ids)))
    return Reading(columns, failed, None if partial else advantages)


def dense(value: Any, length: int) -> list[float]:
    """A rollout's advantages in any output format as ``length`` floats."""
    if value is None:
        return [0.0] * length
    if isinstance(value, (int, float)):
        return [float(value)] * length
    if isinstance(value, Mapping):
        return [float(v) for v, n in value["rle"] for _ in range(int(n))]
    return [float(v) for v in value]
