"""Typed records: what the writer stores and what a query returns (no dicts cross the store's
boundary, except the JSON documents a verdict carries, which the store keeps as they came)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

OK = "ok"
FAILED = "failed"
RolloutOutcome = Literal["ok", "failed"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One reward component's verdict on one rollout."""

    component: str
    reward: float | None
    outcome: str
    """``ok``, or the failure kind (``timeout``, ``unavailable``, ...)."""
    status: Mapping[str, Any] = field(default_factory=dict)
    """The component's status entry as the response carried it (evidence, receipt)."""


@dataclass(frozen=True, slots=True)
class ComponentInput:
    """A reward component as the request named it: what replay runs again."""

    name: str
    verifier: str
    params: Mapping[str, Any]
    timeout_s: float | None = None

    def to_document(self) -> dict[str, Any]:
        return {"name": self.name, "verifier": self.verifier, "params": dict(self.params),
                "timeout_s": self.timeout_s}

    @classmethod
    def from_document(cls, data: Mapping[str, Any]) -> ComponentInput:
        return cls(data["name"], data["verifier"], data.get("params") or {},
                   data.get("timeout_s"))


@dataclass(frozen=True, slots=True)
class GroupInputs:
    """What a group was scored from, beside its completions: its prompt, reference, the
    batch's verifier components and whether it was an evaluation batch (rubric dropout).
    Stored once per distinct content (``digest``)."""

    digest: str
    prompt: str
    reference: Mapping[str, Any]
    components: tuple[ComponentInput, ...]
    evaluation: bool = False

    def to_document(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "reference": dict(self.reference),
                "components": [c.to_document() for c in self.components],
                "evaluation": self.evaluation}

    @classmethod
    def from_document(cls, digest: str, data: Mapping[str, Any]) -> GroupInputs:
        return cls(digest, data.get("prompt") or "", data.get("reference") or {},
                   tuple(ComponentInput.from_document(c) for c in data.get("components") or ()),
                   bool(data.get("evaluation")))


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """One scored rollout, as it is written."""

    tenant: str
    run_id: str
    group_id: str
    rollout_id: str
    verdicts: tuple[Verdict, ...]
    recorded_at: float
    step: int | None = None
    source: str | None = None
    summary: Mapping[str, Any] | None = None
    """The rollout's combined reward and, with advantages, their mean
    (``{"reward", "excluded", "advantage_mean"}``)."""
    completion: str | None = None
    """Kept only as REWARDD_RECORD_COMPLETIONS says (None: not kept)."""
    num_tokens: int | None = None
    """The response's length in tokens, as the request gave it."""
    zero_advantage: bool | None = None
    """Every advantage of the rollout is 0 (a group without spread under GRPO, say); None
    without advantages."""
    inputs: GroupInputs | None = None
    """What its group was scored from, kept with the completion (replay needs both)."""

    @property
    def outcome(self) -> RolloutOutcome:
        return OK if all(v.outcome == OK for v in self.verdicts) else FAILED


@dataclass(frozen=True, slots=True)
class StoredRollout:
    """A rollout read back, with the id that orders it (the cursor of a page)."""

    id: int
    record: RolloutRecord


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: str
    first_at: float
    last_at: float
    last_step: int | None
    rollouts: int


@dataclass(frozen=True, slots=True)
class RolloutQuery:
    """Filters of ``GET /v1/runs/{run_id}/rollouts``; every one optional."""

    step: int | None = None
    source: str | None = None
    component: str | None = None
    outcome: str | None = None
    """``ok``/``failed`` for the whole rollout; any other value is a failure kind, and
    with ``component`` it is that component's outcome."""
    text: str | None = None
    """A substring of the completion (rollouts recorded without one never match)."""
    after: int | None = None
    """The cursor: only rollouts with a larger id."""
    limit: int = 100


@dataclass(frozen=True, slots=True)
class RolloutPage:
    items: tuple[StoredRollout, ...]
    next_cursor: int | None
    """Pass as ``after`` for the next page; None on the last one."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of a tenant's record is kept (None: no bound)."""

    max_age_s: float | None = None
    max_rollouts: int | None = None


@dataclass(frozen=True, slots=True)
class ComponentStep:
    """One reward component over one step's rollouts."""

    rollouts: int
    mean: float | None
    """Mean reward of the rollouts it scored (None: none scored)."""
    std: float | None
    failures: Mapping[str, int]
    """Failure kind -> rollouts."""


@dataclass(frozen=True, slots=True)
class StepSummary:
    step: int | None
    rollouts: int
    failed_rollouts: int
    components: Mapping[str, ComponentStep]
    sources: Mapping[str, int]
    """Source -> rollouts (rollouts without a source under ``""``)."""
    mean_length: float | None = None
    """Mean ``num_tokens`` of the rollouts that gave one."""
    zero_advantage_fraction: float | None = None
    """Share of the rollouts with advantages whose advantages are all 0."""
