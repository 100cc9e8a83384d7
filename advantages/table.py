"""The reward table: group x rollout x component, each cell a value or a typed failure.

It lives in the advantage library (not the service) so a trainer computing advantages in
process applies the same failure policy the server does; cells are read through the small
:class:`Cell` protocol, which the verifiers' ``Outcome`` satisfies, so nothing here imports
the verifiers.

It is filled from verifier outcomes and from precomputed rewards the rollouts carry, then
collapsed to one scalar per rollout by the weighted sum. A failed cell never becomes a
number here: with a component ``fallback`` it takes that value (and says so); without one the
rollout is excluded, leaving its group's baseline with advantage 0 (documented default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, Sequence

from rewardd.advantages.models import Group, Rollout

MISSING = "missing"
"""The failure kind of a precomputed component a rollout did not send (the verifiers'
``FailureKind.missing``: one closed set of ``status.<name>.error`` values)."""


class Cell(Protocol):
    """One cell as the table reads it: a verifier's ``Outcome`` or a precomputed :class:`Value`."""

    @property
    def ok(self) -> bool: ...

    @property
    def reward(self) -> float | None: ...

    @property
    def error(self) -> Enum | str | None: ...

    @property
    def detail(self) -> dict[str, Any]: ...

    @property
    def receipt(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class Value:
    """A precomputed cell: a value the trainer sent, or its absence (a ``missing`` failure)."""

    reward: float | None
    detail: dict[str, Any] = field(default_factory=dict)
    receipt: None = None
    """A value the trainer sent was decided by nothing rewardd ran: no receipt."""

    @property
    def ok(self) -> bool:
        return self.reward is not None

    @property
    def error(self) -> str | None:
        return None if self.reward is not None else MISSING


def failure_kind(cell: Cell) -> str:
    error = cell.error
    return error.value if isinstance(error, Enum) else str(error)


@dataclass(slots=True)
class Column:
    """One reward component across every rollout of the batch."""

    name: str
    weight: float
    fallback: float | None
    cells: Sequence[Cell]
    echo: bool = True
    """Report ok cells in ``rewards``/``status``. False for values the trainer sent: echoing
    them back adds bytes and no information, so only their failures (missing) are reported."""


@dataclass(slots=True)
class FlatBatch:
    """The request's rollouts in one list, with each rollout's group index."""

    groups: Sequence[Group]
    rollouts: list[Rollout] = field(default_factory=list)
    group_of: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, groups: Sequence[Group]) -> FlatBatch:
        flat = cls(groups)
        for gi, group in enumerate(groups):
            flat.rollouts.extend(group.rollouts)
            flat.group_of.extend([gi] * len(group.rollouts))
        return flat


@dataclass(slots=True)
class Combined:
    """Per-rollout scalar rewards after the weighted sum and the failure policy."""

    reward: list[float | None]  # None: excluded
    rewards: list[dict[str, float | None]]
    status: list[dict[str, dict[str, Any]]]
    failed_cells: int


_OK_STATUS = {"ok": True, "error": None, "detail": {}}


def precomputed_columns(rollouts: Sequence[Rollout], weights: dict[str, float]) -> list[Column]:
    """Columns from ``reward`` / ``rewards`` sent on rollouts; a value absent on some rollouts
    (or null) is a ``missing`` failure in that cell."""
    names: dict[str, None] = {}
    for r in rollouts:
        if r.reward is not None:
            names["reward"] = None
        for name in r.rewards or ():
            names[name] = None
    columns = []
    for name in names:
        cells = []
        for r in rollouts:
            value = r.reward if name == "reward" else (r.rewards or {}).get(name)
            cells.append(Value(value) if value is not None else Value(None, {
                "message": f"no value for precomputed component {name!r}"}))
        columns.append(Column(name, weights.get(name, 1.0), None, cells, echo=False))
    return columns


def combine(columns: Sequence[Column], num_rollouts: int) -> Combined:
    """Weighted sum per rollout, applying each component's failure policy."""
    out = Combined([], [], [], 0)
    for i in range(num_rollouts):
        total: float | None = 0.0
        values: dict[str, float | None] = {}
        status: dict[str, dict[str, Any]] = {}
        for col in columns:
            cell = col.cells[i]
            receipt = cell.receipt
            if cell.ok:
                if col.echo:
                    values[col.name] = cell.reward
                    status[col.name] = _OK_STATUS if not (cell.detail or receipt) else {
                        "ok": True, "error": None, "detail": cell.detail}
                    if receipt is not None:
                        status[col.name]["receipt"] = receipt
                if total is not None:
                    total += col.weight * cell.reward
                continue
            out.failed_cells += 1
            used = col.fallback is not None
            status[col.name] = {"ok": False, "error": failure_kind(cell), "detail": cell.detail}
            if used:
                status[col.name]["fallback_used"] = True
            if receipt is not None:
                status[col.name]["receipt"] = receipt
            values[col.name] = col.fallback if used else None
            if used and total is not None:
                total += col.weight * col.fallback
            elif not used:
                total = None
        out.reward.append(total)
        out.rewards.append(values)
        out.status.append(status)
    return out


def component_matrix(columns: Sequence[Column]) -> tuple[list[list[float]], list[list[bool]]]:
    """Per rollout, each component's value (its fallback when failed) and whether it has one."""
    values: list[list[float]] = []
    present: list[list[bool]] = []
    for i in range(len(columns[0].cells) if columns else 0):
        row, ok = [], []
        for col in columns:
            cell = col.cells[i]
            value = cell.reward if cell.ok else col.fallback
            row.append(value if value is not None else 0.0)
            ok.append(value is not None)
        values.append(row)
        present.append(ok)
    return values, present


def nansum_missing(combined: Combined, columns: Sequence[Column]) -> Combined:
    """TRL's convention for a reward function returning None (``Pins.missing`` nansum): a
    rollout with some failed cells and no fallback keeps the weighted sum of the components
    it has (the failed ones count 0, TRL's nansum over functions); only a rollout where no
    component has a value stays excluded. Statuses and ``failed_cells`` are unchanged."""
    reward = list(combined.reward)
    for i, total in enumerate(reward):
        if total is not None:
            continue
        values = [(col.weight, cell.reward if cell.ok else col.fallback)
                  for col in columns for cell in (col.cells[i],)]
        present = [w * v for w, v in values if v is not None]
        if present:
            reward[i] = sum(present, 0.0)
    return Combined(reward, combined.rewards, combined.status, combined.failed_cells)
