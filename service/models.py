"""The v1 contract as pydantic models: validation, documentation and OpenAPI schema at once.

Core field names come from ARCHITECTURE.md and are never renamed. Type rules live here
(pydantic reports them with their field path); rules that span fields or need a registry
(per-token lengths, segment ranges, duplicate ids, parameters of a named verifier) live in
``service/validation.py`` so each error still names its exact path.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from rewardd.advantages.bounds import FreeForm
from rewardd.advantages.models import (MAX_TOKENS_PER_ROLLOUT, AdvantageSpec,  # noqa: F401
                                       AdvantagesRequest, Contract,
                                       FiniteFloat, Group, Name, OutputFormat, Profile,
                                       RewardValue, Rollout, Segment, Stage, Step, Turn,
                                       Weight)
from rewardd.verifiers.base import FailureKind


class RewardSpec(Contract):
    """One named reward component: which verifier computes it, its weight and parameters."""

    name: Name = Field(description="Component name; keys of `rewards` and `status` in responses.")
    verifier: str = Field(description="Verifier kind; see GET /v1/verifiers.")
    weight: Weight = Field(1.0, description="Weight in the weighted sum of components.")
    params: FreeForm = Field(default_factory=dict, description="Verifier parameters.")
    segments: list[Name] | None = Field(
        None, fail_fast=True,
        description="Segment labels this component's advantage is routed to "
        "(token routing; not available in this release: a request using it gets 422).")
    fallback: RewardValue | None = Field(
        None, description="Reward used when this cell fails. Unset (default): a rollout with a "
        "failed cell leaves its group's baseline and gets advantage 0.")
    timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit per verifier call; defaults to the server's "
        "REWARDD_VERIFIER_TIMEOUT_S and is capped by REWARDD_MAX_VERIFIER_TIMEOUT_S.")


class ScoreRequest(Contract):
    """Body of POST /v1/score and POST /v1/jobs: verify every rollout, then advantages."""

    run_id: Name | None = Field(None, description="Training run, for run state and metrics.")
    step: int | None = Field(None, ge=0, description="Training step of this batch: rubric "
                             "dropout draws a new subset of criteria per step.")
    evaluation: bool = Field(False, description="An evaluation batch: judges grade the full "
                             "rubric (no rubric dropout).")
    groups: list[Group] = Field(min_length=1, fail_fast=True,
                                description="Rollout groups, one per prompt.")
    rewards: list[RewardSpec] = Field(min_length=1, fail_fast=True,
                                      description="Reward components to compute.")
    advantage: AdvantageSpec = Field(default_factory=AdvantageSpec)


class RewardsRequest(Contract):
    """Body of POST /v1/rewards: verify every rollout, no advantages."""

    run_id: Name | None = None
    step: int | None = Field(None, ge=0, description="Training step (rubric dropout).")
    evaluation: bool = Field(False, description="An evaluation batch (no rubric dropout).")
    groups: list[Group] = Field(min_length=1, fail_fast=True)
    rewards: list[RewardSpec] = Field(min_length=1, fail_fast=True)


class VerifyRequest(Contract):
    """Body of POST /v1/verify/{verifier}: one item, for debugging a verifier."""

    completion: str = Field(description="Text to verify.")
    reference: FreeForm = Field(default_factory=dict)
    params: FreeForm = Field(default_factory=dict)
    prompt: str = ""
    num_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS_PER_ROLLOUT)
    timeout_s: float | None = Field(None, gt=0)


# ---- responses -----------------------------------------------------------------------------

class CellStatus(BaseModel):
    """Outcome of one (rollout, component) cell."""

    ok: bool
    error: FailureKind | None = Field(
        None, description="timeout | crashed | error | invalid_reference | unavailable | "
        "missing (no precomputed value) | judge_unparseable | judge_refused | judge_unavailable; "
        "null when ok.")
    detail: dict[str, Any] = Field(default_factory=dict)
    fallback_used: bool = Field(
        False, description="The component's fallback reward was used (present only when true).")


class RunLength(BaseModel):
    """Run-length encoded advantages: decodes bit-for-bit to the dense array."""

    rle: list[tuple[float, int]]


class RolloutResult(BaseModel):
    rollout_id: str
    reward: float | None = Field(
        description="Weighted sum of components; null when the rollout was excluded.")
    rewards: dict[str, float | None] = Field(
        description="Value of each verifier component (null when failed without fallback). "
        "Precomputed values the rollout carried are not echoed; a missing one appears as null.")
    status: dict[str, CellStatus] = Field(
        description="Outcome of each verifier component, and of each precomputed value that "
        "was missing.")
    advantages: list[float] | RunLength | float | None = None
    returns: list[float] | RunLength | float | None = Field(
        None, description="Returns, where the estimator defines them (gae), in the output format.")
    component_advantages: dict[str, float] | None = Field(
        None, description="Per-component advantages, when `advantage.components` is true.")
    num_tokens: int | None = None
    excluded: bool = Field(
        False, description="A cell failed without fallback: the rollout left its group's "
        "baseline and its advantages are 0.")


class GroupDiagnostics(BaseModel):
    zero_spread: bool = Field(description="All included rollouts have the same reward.")
    filtered: bool = Field(
        False, description="A requested filter (dynamic_sampling) marked this group; advice "
        "only: its advantages are unchanged.")
    singleton: bool = Field(description="Exactly one rollout entered the baseline (a group "
                            "whose every rollout was excluded is not a singleton).")
    baseline_size: int = Field(description="Rollouts that entered the group baseline; 0 when "
                               "every rollout was excluded (no baseline, all advantages 0).")
    excluded: list[str] = Field(default_factory=list, description="Excluded rollout ids.")
    reward_mean: float | None = None
    reward_std: float | None = None


class GroupResult(BaseModel):
    group_id: str
    rollouts: list[RolloutResult]
    diagnostics: GroupDiagnostics


class Summary(BaseModel):
    rollouts: int
    groups: int
    failed_cells: int
    excluded_rollouts: int
    zero_spread_groups: int
    singleton_groups: int = Field(description="Groups with exactly one rollout in the "
                                  "baseline (groups with none are not counted).")
    zero_advantage_fraction: float | None = Field(
        description="Fraction of rollouts whose advantages are all zero; null without advantages.")
    reward_mean: float | None
    reward_std: float | None
    advantage_mean: float | None = None
    advantage_std: float | None = None
    silent_group_fraction: float | None = Field(
        None, description="Fraction of groups whose advantages are all zero (no signal).")
    component_energy: dict[str, float] | None = Field(
        None, description="Mean squared advantage of each component (multi-reward batches).")


class ScoreResponse(BaseModel):
    run_id: str | None = None
    estimator: str | None = None
    profile: Profile | None = None
    groups: list[GroupResult]
    summary: Summary
    advice: dict[str, Any] = Field(
        default_factory=dict, description="Output of each requested filter, by name.")
    report: dict[str, Any] = Field(
        default_factory=dict, description="What entries report beside the advantages (for "
        "example gd2po's conflict mask and consensus weights), by entry name.")


class VerifyResponse(BaseModel):
    ok: bool
    reward: float | None
    error: FailureKind | None
    detail: dict[str, Any]


class ParamInfo(BaseModel):
    name: str
    type: str
    required: bool
    default: Any = None
    description: str | None = None


class VerifierInfo(BaseModel):
    name: str
    description: str
    reference_fields: dict[str, str]
    params: list[ParamInfo]


class EstimatorInfo(BaseModel):
    name: str
    kind: str = Field(description="transform | estimator | aggregate | reweight | filter")
    stateful: bool = Field(False, description="Keeps per-run state; needs run_id.")
    formula: str
    description: str
    source: str
    inputs: list[str]
    params: list[ParamInfo]
    profiles: dict[str, dict[str, Any]]


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    detail: list[ErrorItem] | str


# ---- jobs ----------------------------------------------------------------------------------

class JobState(str, Enum):
    """queued -> running -> succeeded | failed | cancelled (the last three are final)."""

    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class JobProgress(BaseModel):
    done: int = Field(description="Checks (rollout x reward component) finished. Restarts "
                      "from 0 when the job is resumed on another API pod (attempts > 1).")
    total: int = Field(description="Checks to run: rollouts x reward components.")


class JobLinks(BaseModel):
    status: str = Field(description="GET for state and result; DELETE to cancel.")
    events: str = Field(description="Server-sent events: progress, finished groups, the end.")


class JobSubmitted(BaseModel):
    """Answer of POST /v1/jobs: 202 for a new job, 200 when an `Idempotency-Key` of this
    tenant already named a job with the same body (that job is returned)."""

    id: str = Field(description="Unguessable job id (32 hex digits).")
    state: JobState
    links: JobLinks


class JobStatus(BaseModel):
    """GET /v1/jobs/{id} (DELETE answers the same, without `result`)."""

    id: str
    state: JobState
    progress: JobProgress
    created_at: str = Field(description="RFC 3339, UTC.")
    started_at: str | None = Field(None, description="First start (RFC 3339, UTC).")
    finished_at: str | None = Field(None, description="When it reached a final state.")
    error: str | None = Field(None, description="Why it failed (state failed).")
    attempts: int = Field(0, description="Times it was started; more than 1 when an API pod "
                          "died and another resumed it.")
    result: ScoreResponse | None = Field(
        None, description="Once succeeded: exactly the POST /v1/score response for the body.")
