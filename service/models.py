"""The v1 contract as pydantic models: validation, documentation and OpenAPI schema at once.

Core field names come from docs/architecture.md and are never renamed. Type rules live here
(pydantic reports them with their field path); rules that span fields or need a registry
(per-token lengths, segment ranges, duplicate ids, parameters of a named verifier) live in
``service/validation.py`` so each error still names its exact path.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

from rewardd.advantages.bounds import FreeForm
from rewardd.advantages.models import (MAX_TOKENS_PER_ROLLOUT, AdvantageSpec,  # noqa: F401
                                       AdvantagesRequest, Contract,
                                       FiniteFloat, Group, Identifier, Name, OutputFormat,
                                       Profile,
                                       RewardValue, Rollout, Segment, Stage, Step, Turn,
                                       Weight)
from rewardd.service.replaymodels import ReverifyResult
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


class CanarySpec(Contract):
    """A request's canaries (docs/canaries.md): probes built from the batch's references,
    run beside it, never part of its rewards."""

    enabled: bool = Field(True, description="Run canaries for this batch (false: none).")
    rate: float | None = Field(
        None, ge=0.0, le=1.0, description="Share of the batch's groups canaried per reward "
        "component (at least one group while above 0); unset: the server's "
        "REWARDD_CANARY_RATE.")


class AuditSpec(RewardSpec):
    """An audit component (docs/audit.md): a reward component in the `rewards` shape, scored
    on a share of the rollouts beside the batch, recorded and reported, never part of rewards
    or advantages (`weight` and `fallback` are not used)."""

    rate: float = Field(gt=0.0, le=1.0, description="Share of the rollouts audited: each "
                        "rollout is audited or not by a hash of its run, step, group and "
                        "rollout ids and this component's name (the same rollouts on any pod).")


AUDIT_DESCRIPTION = ("Audit components (docs/audit.md): scored on a share of the rollouts "
                     "(`rate`), recorded, reported in `summary.audit` (training-vs-audit "
                     "agreement) and per rollout in `audit`; never part of rewards or "
                     "advantages.")
MAX_AUDIT_COMPONENTS = 8


CANARIES_DESCRIPTION = ("Canaries (docs/canaries.md): true (default: the server's "
                        "REWARDD_CANARY_RATE), false (none), or {\"rate\": share of groups}. "
                        "They never change rewards or advantages; results go to "
                        "`summary.canaries`.")


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
    cache: bool = Field(True, description="Let the verdict cache answer checks it has seen "
                        "(false: every check runs).")
    canaries: bool | CanarySpec = Field(True, description=CANARIES_DESCRIPTION)
    audit: list[AuditSpec] = Field(default_factory=list, max_length=MAX_AUDIT_COMPONENTS,
                                   description=AUDIT_DESCRIPTION)


class RewardsRequest(Contract):
    """Body of POST /v1/rewards: verify every rollout, no advantages."""

    run_id: Name | None = None
    step: int | None = Field(None, ge=0, description="Training step (rubric dropout).")
    evaluation: bool = Field(False, description="An evaluation batch (no rubric dropout).")
    groups: list[Group] = Field(min_length=1, fail_fast=True)
    rewards: list[RewardSpec] = Field(min_length=1, fail_fast=True)
    cache: bool = Field(True, description="Let the verdict cache answer checks it has seen "
                        "(false: every check runs).")
    canaries: bool | CanarySpec = Field(True, description=CANARIES_DESCRIPTION)
    audit: list[AuditSpec] = Field(default_factory=list, max_length=MAX_AUDIT_COMPONENTS,
                                   description=AUDIT_DESCRIPTION)


class VerifyRequest(Contract):
    """Body of POST /v1/verify/{verifier}: one item, for debugging a verifier."""

    completion: str = Field(description="Text to verify.")
    reference: FreeForm = Field(default_factory=dict)
    params: FreeForm = Field(default_factory=dict)
    prompt: str = ""
    num_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS_PER_ROLLOUT)
    timeout_s: float | None = Field(None, gt=0)


# ---- responses -----------------------------------------------------------------------------

class JudgeReceipt(BaseModel):
    """The judge that decided a verdict, and how it sampled."""

    backend: str | None = None
    model: str | None = None
    temperature: float | None = None
    seed: int | None = None


class Receipt(BaseModel):
    """What a verdict was decided from: the same inputs give the same receipt on any pod.
    Hashes are BLAKE2b-128 (hex) of canonical JSON (the completion: of its UTF-8 text)."""

    verifier: str
    revision: str = Field(description="Changes whenever the verifier's verdicts change.")
    params_hash: str = Field(description="The verifier's effective parameters (defaults "
                             "filled in).")
    reference_hash: str
    completion_hash: str
    isolation: str | None = Field(None, description="The sandbox isolation a code verdict "
                                  "ran under.")
    judge: JudgeReceipt | None = None


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
    receipt: Receipt | None = Field(
        None, description="What the verdict was decided from (every verifier component; "
        "absent for a precomputed value).")


class AuditVerdict(CellStatus):
    """An audit component's verdict on one audited rollout."""

    reward: float | None = Field(None, description="The audit reward (null when it failed).")


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
    audit: dict[str, AuditVerdict] | None = Field(
        None, description="Verdicts of the audit components that audited this rollout "
        "(absent when none did); never part of `reward` or the advantages.")


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
    source: str | None = Field(None, description="The group's `source`, when it has one.")
    rollouts: list[RolloutResult]
    diagnostics: GroupDiagnostics


class CanaryCounts(BaseModel):
    passed: int = Field(description="Probes the verifier answered as a correct one must.")
    failed: int = Field(description="Probes it did not.")


class CanaryReport(CanaryCounts):
    """One reward component's canaries in one batch: its probes passed and failed, and:"""

    verifier: str
    problems: list[str] = Field(description="What the failed probes say is wrong, one line "
                                "per canaried group (at most 5, then a count).")
    sources: dict[str, CanaryCounts] = Field(description="Passed and failed by the groups' "
                                             "source (\"\": groups without one).")


class AuditReport(BaseModel):
    """One audit component over one batch: how its verdicts agree with the training reward."""

    verifier: str
    rate: float
    rollouts: int = Field(description="Rollouts audited.")
    failed: int = Field(description="Audited rollouts whose audit verdict failed.")
    compared: int = Field(description="Audited rollouts with both an audit reward and a "
                          "training reward (not excluded): what agreement is over.")
    agreement: float | None = Field(description="Spearman rank correlation of the training "
                                    "reward and the audit reward (null: under 3 compared, or "
                                    "one side constant).")
    mean_gap: float | None = Field(description="Mean of training reward minus audit reward.")
    training_mean: float | None
    audit_mean: float | None


class SentinelAlert(BaseModel):
    """A sign that the run's policy may be gaming its reward (docs/sentinel.md)."""

    signal: str = Field(description="audit_divergence | length_gaming | component_dominance "
                        "| repeated_answer | hedging | lenient_fallback")
    step: int = Field(description="The step at which it was raised (or, in an answer's "
                      "summary, the newest step at which it held).")
    onset: int | None = Field(None, description="Estimated first step of what it saw.")
    value: float = Field(description="The signal's value there.")
    threshold: float
    message: str = Field(description="What was seen, in numbers.")
    component: str | None = Field(None, description="The reward or audit component it is "
                                  "about (component_dominance, audit_divergence).")


class SentinelReport(BaseModel):
    alerts: list[SentinelAlert] = Field(description="The alerts that held at the run's "
                                        "newest recorded step.")
    step: int | None = Field(description="That step.")


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
    canaries: dict[str, CanaryReport] | None = Field(
        None, description="Per canaried reward component, its canaries' results "
        "(docs/canaries.md); absent when none ran. Never part of rewards or advantages.")
    audit: dict[str, AuditReport] | None = Field(
        None, description="Per audit component, its agreement with the training reward "
        "(docs/audit.md); absent without `audit`.")
    sentinel: SentinelReport | None = Field(
        None, description="The sentinel's alerts on this run as of its newest recorded step "
        "(a step behind this batch: recording is off the request path); absent without "
        "`run_id` or before the run's first recorded batch was looked at.")


class CacheCounts(BaseModel):
    hits: int = Field(description="Checks the verdict cache answered (no verifier ran).")
    misses: int = Field(description="Checks it could have answered but had not seen.")


class ResponseDiagnostics(BaseModel):
    cache: CacheCounts


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
    diagnostics: ResponseDiagnostics | None = Field(
        None, description="How the answer was made (scoring routes).")


class VerifyResponse(BaseModel):
    ok: bool
    reward: float | None
    error: FailureKind | None
    detail: dict[str, Any]
    receipt: Receipt | None = None


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
    result: ScoreResponse | ReverifyResult | None = Field(
        None, description="Once succeeded: exactly the POST /v1/score response for the body "
        "(a reverify job: its ReverifyResult).")


# ---- streaming sessions (/v1/sessions) -----------------------------------------------------

class SessionSpec(Contract):
    """Body of POST /v1/sessions: one training step's reward and advantage configuration;
    rollouts come later, as they finish (POST /v1/sessions/{id}/rollouts)."""

    rewards: list[RewardSpec] = Field(min_length=1, fail_fast=True,
                                      description="Reward components to compute.")
    advantage: AdvantageSpec = Field(default_factory=AdvantageSpec)
    run_id: Name | None = Field(None, description="Training run, for run state and metrics.")
    step: int | None = Field(None, ge=0, description="Training step of this session.")
    evaluation: bool = Field(False, description="An evaluation step (no rubric dropout).")
    group_size: int = Field(ge=1, le=4096, description="Rollouts per group: a group is "
                            "complete once this many arrived and were checked.")
    group_timeout_s: float | None = Field(
        None, gt=0, le=86_400, description="A group still incomplete this long after its "
        "first rollout is completed from what arrived (flagged in its diagnostics), or failed "
        "when `on_group_timeout` is `fail`. Unset: no timeout.")
    on_group_timeout: Literal["complete", "fail"] = Field(
        "complete", description="What a group timeout does.")
    audit: list[AuditSpec] = Field(
        default_factory=list, max_length=MAX_AUDIT_COMPONENTS,
        description=AUDIT_DESCRIPTION + " In a session they run at the close, over the "
        "groups it answers for.")


class SessionGroup(Contract):
    """A group, or part of one: more of its rollouts may come in later requests. `prompt`
    and `reference` are needed on the group's first sight only (later: omitted, or equal)."""

    group_id: Identifier = Field(description="The group's id (any 1 to 256 characters).")
    prompt: str | None = Field(None, description="The prompt (first sight of the group).")
    reference: FreeForm | None = Field(None, description="Verifier references (first sight).")
    rollouts: list[Rollout] = Field(min_length=1, fail_fast=True,
                                    description="Rollouts of this group that finished.")
    data_source: Name | None = Field(None, description="Data source, for ucb_curriculum.")
    source: Name | None = Field(None, description="The dataset of the prompt (first sight): "
                                "echoed in the group's events and kept in the run record.")


class SessionRollouts(Contract):
    """Body of POST /v1/sessions/{id}/rollouts: the /v1/score `groups` shape, partial."""

    groups: list[SessionGroup] = Field(min_length=1, fail_fast=True)


class SessionOpened(BaseModel):
    session_id: str = Field(description="Unguessable session id (32 hex digits).")


class SessionAccepted(BaseModel):
    """Answer of POST /v1/sessions/{id}/rollouts."""

    accepted: int = Field(description="New rollouts, now being verified.")
    duplicates: int = Field(description="Rollouts already received with the same content "
                            "(not scored again).")


class SessionGroupEvent(GroupResult):
    """A completed group: the /v1/score group object, plus what the session adds."""

    index: int = Field(description="Order of the group's first sight in the session.")
    final: bool = Field(description="True: its advantages are final (a group-level "
                        "estimator). False: advantages come with the session's close "
                        "(they need the whole batch); the rewards are final.")
    reason: Literal["full", "closed", "timeout"] = Field(
        description="full: group_size rollouts checked; closed: the client closed it; "
        "timeout: group_timeout_s passed.")
    failed: bool = Field(False, description="The group timed out with on_group_timeout=fail: "
                         "it has no rewards and leaves the batch.")
    arrived: int = Field(description="Rollouts it completed with (below group_size when "
                         "closed early or timed out).")


class SessionGroupWait(BaseModel):
    """GET /v1/sessions/{id}/groups/{group_id} and POST .../close."""

    group_id: str
    complete: bool = Field(description="False: not complete yet (long-poll again).")
    group: SessionGroupEvent | None = Field(
        None, description="The group once complete; after the session's close, with its "
        "final advantages.")


class SessionClosed(BaseModel):
    """POST /v1/sessions/{id}/close, and the data of the stream's `closed` event."""

    session_id: str
    state: Literal["closed", "cancelled", "expired"]
    error: str | None = None
    summary: Summary | None = None
    result: ScoreResponse | None = Field(
        None, description="The /v1/score response over the completed groups (first-sight "
        "order), batch-level estimators included.")


class SessionState(BaseModel):
    """GET /v1/sessions/{id}."""

    session_id: str
    state: Literal["open", "closing", "closed", "cancelled", "expired"]
    groups: int = Field(description="Groups seen.")
    completed_groups: int
    rollouts: int = Field(description="Rollouts received.")
    created_at: str
    error: str | None = None
