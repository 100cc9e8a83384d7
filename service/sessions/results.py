"""A session's numbers, through the very functions ``/v1/score`` uses.

A completed group is a one-group batch: :class:`~rewardd.advantages.table.FlatBatch` of its
rollouts, the verifier columns from its stored outcomes plus the precomputed columns, then
:func:`~rewardd.advantages.table.combine` and
:func:`~rewardd.advantages.response.build_response` (advantages only when the spec is
group-local, :mod:`rewardd.service.sessions.locality`). The close builds the whole batch the
same way and answers through :func:`rewardd.service.respond.respond` (run state committed,
metrics), so a session's numbers are ``/v1/score``'s on the same batch. CPU-bound: callers
run these in a worker thread.
"""

from __future__ import annotations

from typing import Any, Sequence

import orjson

from rewardd.advantages.response import build_response
from rewardd.advantages.table import Column, FlatBatch, combine, precomputed_columns
from rewardd.service.models import Group, SessionSpec
from rewardd.service.respond import respond
from rewardd.service.runstate import RunStore
from rewardd.service.sessions.records import GroupPhase, GroupRecord
from rewardd.verifiers.base import Outcome


def plain(value: Any) -> Any:
    """``value`` as JSON data (numpy arrays to lists): what the stores keep. orjson writes
    the shortest text that reads back as the same float, so no number changes."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


def group_model(group: GroupRecord) -> Group:
    """The stored group as the /v1/score request would have carried it."""
    return Group.model_validate({
        "group_id": group.group_id, "prompt": group.prompt, "reference": group.reference,
        "data_source": group.data_source, "source": group.source,
        "rollouts": [r.body for r in group.rollouts]})


def _batch(spec: SessionSpec, groups: Sequence[GroupRecord]
           ) -> tuple[FlatBatch, list[Column]]:
    flat = FlatBatch.of([group_model(group) for group in groups])
    columns = [Column(s.name, s.weight, s.fallback,
                      [Outcome.from_dict(r.cells[s.name]) for group in groups
                       for r in group.rollouts]) for s in spec.rewards]
    columns += precomputed_columns(flat.rollouts, spec.advantage.weights)
    return flat, columns


def group_event(spec: SessionSpec, stored: GroupRecord, final: bool,
                runs: RunStore | None = None) -> dict[str, Any]:
    """The ``group`` event of a completed group: the /v1/score group object (advantages when
    ``final``), with the group's index, reason and size as it completed. With ``runs`` the
    group is answered through :func:`respond` (the run's state read and committed, metrics
    recorded) as a one-group /v1/score request would be."""
    if stored.failed:
        ids = [r.id for r in stored.rollouts]
        group: dict[str, Any] = {
            "group_id": stored.group_id, "rollouts": [],
            "diagnostics": {"zero_spread": False, "singleton": False, "baseline_size": 0,
                            "excluded": ids}}
    else:
        flat, columns = _batch(spec, [stored])
        combined = combine(columns, len(flat.rollouts))
        advantage = spec.advantage if final else None
        out = (respond(spec.run_id, flat, combined, columns, advantage, runs) if runs is not None
               else build_response(spec.run_id, flat, combined, columns, advantage, None))
        group = out["groups"][0]
    group.update(index=stored.index, final=final or stored.failed, reason=stored.reason,
                 failed=stored.failed, arrived=len(stored.rollouts))
    return plain(group)


def answered_groups(groups: Sequence[GroupRecord]) -> list[GroupRecord]:
    """The groups a close answers for: completed, not failed, in the order first seen."""
    return sorted((g for g in groups if g.state == GroupPhase.DONE and not g.failed),
                  key=lambda g: g.index)


def session_result(spec: SessionSpec, groups: Sequence[GroupRecord],
                   runs: RunStore | None) -> dict[str, Any]:
    """The close's /v1/score response over every completed, not failed group, in the order
    they were first seen (batch-level estimators computed now)."""
    kept = answered_groups(groups)
    if not kept:
        return {"run_id": spec.run_id, "estimator": spec.advantage.estimator,
                "profile": spec.advantage.profile.value, "groups": [], "advice": {},
                "report": {}, "summary": {
                    "rollouts": 0, "groups": 0, "failed_cells": 0, "excluded_rollouts": 0,
                    "zero_spread_groups": 0, "singleton_groups": 0,
                    "zero_advantage_fraction": None, "reward_mean": None, "reward_std": None}}
    flat, columns = _batch(spec, kept)
    return plain(respond(spec.run_id, flat, combine(columns, len(flat.rollouts)), columns,
                         spec.advantage, runs))
