"""The bodies of the run record's routes (GET /v1/runs, /v1/runs/{run_id},
/v1/runs/{run_id}/rollouts): typed, so the OpenAPI document, the Python client and the
inspector read the same shapes. Times are RFC 3339 UTC, as in jobs and sessions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rewardd.service.models import SentinelAlert


class RunInfo(BaseModel):
    run_id: str
    first_at: str = Field(description="When its first recorded rollout was scored.")
    last_at: str = Field(description="When its last recorded rollout was scored.")
    last_step: int | None = Field(description="Highest step recorded (None: no step given).")
    rollouts: int = Field(description="Rollouts recorded (after retention).")


class RunList(BaseModel):
    """GET /v1/runs: the tenant's recorded runs, the most recently scored first."""

    runs: list[RunInfo]


class ComponentStepInfo(BaseModel):
    rollouts: int
    mean: float | None = Field(description="Mean reward over the rollouts it scored.")
    std: float | None = Field(description="Population standard deviation of those rewards.")
    failures: dict[str, int] = Field(description="Failure kind -> rollouts.")


class AuditStepInfo(BaseModel):
    compared: int = Field(description="Audited rollouts with both rewards (kept per step: "
                          "at most 2,048).")
    agreement: float | None = Field(description="Spearman's rank correlation of the training "
                                    "reward and the audit reward over the step.")
    mean_gap: float | None = Field(description="Mean of training minus audit reward.")


class CanaryStepInfo(BaseModel):
    passed: int
    failed: int


class StepInfo(BaseModel):
    step: int | None
    rollouts: int
    failed_rollouts: int = Field(description="Rollouts with at least one failed component.")
    components: dict[str, ComponentStepInfo]
    sources: dict[str, int] = Field(description="Source -> rollouts ('' for none).")
    mean_length: float | None = Field(
        None, description="Mean num_tokens of the rollouts that gave one.")
    zero_advantage_fraction: float | None = Field(
        None, description="Share of the rollouts with advantages whose advantages are all 0.")
    reward_mean: float | None = Field(None, description="Mean combined reward (rollouts not "
                                      "excluded).")
    source_rewards: dict[str, float | None] = Field(
        default_factory=dict, description="Mean combined reward per source ('' for none).")
    audit: dict[str, AuditStepInfo] = Field(
        default_factory=dict, description="Per audit component, its agreement with the "
        "training reward over the step (docs/audit.md).")
    canaries: dict[str, CanaryStepInfo] = Field(
        default_factory=dict, description="Per reward component, its canaries over the step.")
    signals: dict[str, float | None] = Field(
        default_factory=dict, description="The sentinel's per-step statistics "
        "(docs/sentinel.md): hedged_share, lenient_share, repeat_share, length_correlation.")


class SignalInfo(BaseModel):
    name: str
    description: str
    threshold: float


class RunAlerts(BaseModel):
    """GET /v1/runs/{run_id}/alerts: every alert the sentinel raised over the run's recorded
    steps, oldest first, and the signals it watches (docs/sentinel.md)."""

    run_id: str
    steps: int = Field(description="Recorded steps the sentinel looked at.")
    alerts: list[SentinelAlert]
    signals: list[SignalInfo]


class RunView(BaseModel):
    """GET /v1/runs/{run_id}: the state stateful entries keep (as before) and the record."""

    run_id: str
    state: dict[str, Any] | None = Field(
        description="What stateful entries (ha_dw anchors, ucb_curriculum statistics) keep; "
        "None when the run has none.")
    record: RunInfo | None = Field(description="The run's record (None: nothing recorded).")
    steps: list[StepInfo] = Field(description="Per-step summaries of the last steps, newest "
                                  "first (`steps` query parameter: how many, default 20).")


class VerdictInfo(BaseModel):
    reward: float | None
    outcome: str = Field(description="`ok` or the failure kind.")
    status: dict[str, Any] = Field(description="The status entry the response carried.")


class RolloutInfo(BaseModel):
    id: int = Field(description="Position in the record (the order rollouts were written).")
    run_id: str
    step: int | None
    source: str | None
    group_id: str
    rollout_id: str
    recorded_at: str
    outcome: str = Field(description="`ok`, or `failed` when a component failed.")
    verdicts: dict[str, VerdictInfo] = Field(description="Per reward component.")
    summary: dict[str, Any] | None = Field(
        description="Combined reward, excluded, and with advantages their mean.")
    num_tokens: int | None = Field(description="Length in tokens, as the request gave it.")
    zero_advantage: bool | None = Field(
        description="Every advantage is 0 (None: no advantages).")
    completion: str | None = Field(description="Kept as REWARDD_RECORD_COMPLETIONS says.")


class RolloutPageBody(BaseModel):
    """GET /v1/runs/{run_id}/rollouts: one page; pass `next_cursor` as `cursor` for the
    next (None: the last page)."""

    rollouts: list[RolloutInfo]
    next_cursor: str | None
