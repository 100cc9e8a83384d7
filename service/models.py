"""The v1 contract as pydantic models: validation, documentation and OpenAPI schema at once.

Core field names come from ARCHITECTURE.md and are never renamed. Type rules live here
(pydantic reports them with their field path); rules that span fields or need a registry
(per-token lengths, segment ranges, duplicate ids, parameters of a named verifier) live in
``service/validation.py`` so each error still names its exact path.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from verifiers.base import FailureKind, RewardValue

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that must be finite: NaN or infinity is a 422, never a silent number."""

Weight = Annotated[float, Field(allow_inf_nan=False, ge=-1e6, le=1e6)]
"""A component weight; bounded so weighted sums of bounded rewards stay finite."""

MAX_TOKENS_PER_ROLLOUT = 1 << 24

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]


class Contract(BaseModel):
    """Base of request models: unknown fields are rejected so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid")


class Segment(Contract):
    """A labelled token span of one rollout (for example ``think`` or ``answer``); end exclusive."""

    label: Name = Field(description="Segment label that reward components can be routed to.")
    start: int = Field(ge=0, description="First token index of the span.")
    end: int = Field(ge=0, description="One past the last token index of the span.")


class Turn(Contract):
    """A token span of one turn of a multi-turn rollout; end exclusive."""

    start: int = Field(ge=0, description="First token index of the turn.")
    end: int = Field(ge=0, description="One past the last token index of the turn.")
    reward: RewardValue | None = Field(None, description="Per-turn reward, for turn-level credit.")
    signal: FiniteFloat | None = Field(
        None, description="Per-turn external signal h (hindsight/teacher), for modulate.")


class Step(Contract):
    """One agent step of a rollout (a token span) for step-level credit assignment."""

    start: int = Field(ge=0, description="First token index of the step.")
    end: int = Field(ge=0, description="One past the last token index of the step.")
    key: str | None = Field(None, description="Anchor-state key: steps of a group with the "
                            "same key form a step group (gigpo).")
    embedding: list[FiniteFloat] | None = Field(
        None, description="State embedding; steps are grouped by cosine similarity (bipace).")
    reward: RewardValue | None = Field(None, description="Step (process) reward.")


class Rollout(Contract):
    """One completion of a group's prompt, with what verifiers and estimators need."""

    rollout_id: Name = Field(description="Unique within the request; echoed in the response.")
    completion: str | None = Field(None, description="Text the verifiers judge.")
    num_tokens: int | None = Field(
        None, ge=0, le=MAX_TOKENS_PER_ROLLOUT, description="Response length in tokens; needed for dense and rle advantages. "
        "Defaults to len(token_ids).")
    token_ids: list[int] | None = Field(None, description="Response token ids (num_tokens entries).")
    mask: list[int] | None = Field(
        None, description="0/1 per token; advantages are exactly 0 where it is 0 "
        "(tool or observation tokens).")
    segments: list[Segment] | None = Field(
        None, description="Labelled, non-overlapping token spans inside [0, num_tokens).")
    turns: list[Turn] | None = Field(None, description="Turn spans of a multi-turn rollout.")
    steps: list[Step] | None = Field(None, description="Agent steps, for step-level credit.")
    token_rewards: list[RewardValue] | None = Field(
        None, description="Per-token rewards (num_tokens entries).")
    values: list[FiniteFloat] | None = Field(
        None, description="Per-token value estimates (num_tokens entries).")
    kl: list[FiniteFloat] | None = Field(
        None, description="Per-token KL penalty terms (num_tokens entries), for reinforce_pp.")
    signal: list[FiniteFloat] | None = Field(
        None, description="Per-token external signal h (hindsight/teacher), for modulate.")
    greedy: bool = Field(False, description="The group's greedy rollout (baseline of remax).")
    label: Name | None = Field(
        None, description="Intermediate outcome label (strata of outcome_conditioned).")
    cluster: Name | None = Field(None, description="Strategy cluster (uniqueness).")
    quality: FiniteFloat | None = Field(None, description="Quality score (gagar).")
    answer: str | None = Field(None, description="Final answer, for majority votes (glpo).")
    reward: RewardValue | None = Field(
        None, description="Precomputed scalar reward; enters the table as the component 'reward'.")
    rewards: dict[Name, RewardValue | None] | None = Field(
        None, description="Precomputed reward components by name; null means missing.")


class Group(Contract):
    """One prompt with its N rollouts and the reference the verifiers compare against."""

    group_id: Name = Field(description="Unique within the request; echoed in the response.")
    prompt: str = Field("", description="The prompt, for verifiers and judges that read it.")
    reference: dict[str, Any] = Field(
        default_factory=dict,
        description="Verifier references: math {'answer': ...}; exact_match {'answer': ...}.")
    rollouts: list[Rollout] = Field(min_length=1, description="The group's rollouts (N >= 1).")
    data_source: Name | None = Field(None, description="Data source, for ucb_curriculum.")


class RewardSpec(Contract):
    """One named reward component: which verifier computes it, its weight and parameters."""

    name: Name = Field(description="Component name; keys of `rewards` and `status` in responses.")
    verifier: str = Field(description="Verifier kind; see GET /v1/verifiers.")
    weight: Weight = Field(1.0, description="Weight in the weighted sum of components.")
    params: dict[str, Any] = Field(default_factory=dict, description="Verifier parameters.")
    segments: list[Name] | None = Field(
        None, description="Segment labels this component's advantage is routed to "
        "(token routing; not available in this release: a request using it gets 422).")
    fallback: RewardValue | None = Field(
        None, description="Reward used when this cell fails. Unset (default): a rollout with a "
        "failed cell leaves its group's baseline and gets advantage 0.")
    timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit per verifier call; defaults to the server's "
        "REWARDD_VERIFIER_TIMEOUT_S and is capped by REWARDD_MAX_VERIFIER_TIMEOUT_S.")


class Profile(str, Enum):
    """Which trainer's numerical conventions to follow (ESTIMATORS.md, conventions table)."""

    rewardd = "rewardd"
    verl = "verl"
    trl = "trl"
    openrlhf = "openrlhf"


OutputFormat = Literal["dense", "rle", "scalar", "none"]


class Stage(Contract):
    """One named entry of the advantage catalogue with its parameters."""

    name: str = Field(description="Entry name; see GET /v1/estimators.")
    params: dict[str, Any] = Field(default_factory=dict)


class AdvantageSpec(Contract):
    """How rewards become per-token advantages: transforms -> estimator (or aggregate) ->
    reweight -> filters, each entry from GET /v1/estimators."""

    estimator: str = Field("grpo", description="Estimator name; see GET /v1/estimators.")
    profile: Profile = Field(Profile.rewardd, description="Trainer conventions to reproduce.")
    params: dict[str, Any] = Field(default_factory=dict, description="Estimator parameters.")
    aggregate: str = Field(
        "sum", description="Multi-reward aggregation: 'sum' (weighted sum, then the estimator), "
        "'gdpo', 'sa_mrpo', 'dara' or 'gd2po'.")
    aggregate_params: dict[str, Any] = Field(default_factory=dict)
    transforms: list[Stage] = Field(
        default_factory=list, description="Reward transforms applied in order before the "
        "estimator (rank, overlong, prm_clip, prm_delta).")
    reweight: list[Stage] = Field(
        default_factory=list, description="Reweighting applied in order after the estimator.")
    filters: list[Stage] = Field(
        default_factory=list, description="Filters and advice, reported under `advice`; never "
        "applied to the advantages.")
    components: bool = Field(
        False, description="Also return each component's own advantages (scalar per rollout).")
    output: OutputFormat = Field(
        "rle", description="dense: floats per token; rle: [[value, length], ...]; "
        "scalar: one float per rollout; none: no advantages.")
    weights: dict[Name, Weight] = Field(
        default_factory=dict,
        description="Weights of precomputed components sent on rollouts (default 1.0 each).")


class ScoreRequest(Contract):
    """Body of POST /v1/score and POST /v1/jobs: verify every rollout, then advantages."""

    run_id: Name | None = Field(None, description="Training run, for run state and metrics.")
    step: int | None = Field(None, ge=0, description="Training step of this batch: rubric "
                             "dropout draws a new subset of criteria per step.")
    evaluation: bool = Field(False, description="An evaluation batch: judges grade the full "
                             "rubric (no rubric dropout).")
    groups: list[Group] = Field(min_length=1, description="Rollout groups, one per prompt.")
    rewards: list[RewardSpec] = Field(min_length=1, description="Reward components to compute.")
    advantage: AdvantageSpec = Field(default_factory=AdvantageSpec)


class RewardsRequest(Contract):
    """Body of POST /v1/rewards: verify every rollout, no advantages."""

    run_id: Name | None = None
    step: int | None = Field(None, ge=0, description="Training step (rubric dropout).")
    evaluation: bool = Field(False, description="An evaluation batch (no rubric dropout).")
    groups: list[Group] = Field(min_length=1)
    rewards: list[RewardSpec] = Field(min_length=1)


class AdvantagesRequest(Contract):
    """Body of POST /v1/advantages: advantages from rewards the rollouts already carry."""

    run_id: Name | None = None
    groups: list[Group] = Field(min_length=1)
    advantage: AdvantageSpec = Field(default_factory=AdvantageSpec)


class VerifyRequest(Contract):
    """Body of POST /v1/verify/{verifier}: one item, for debugging a verifier."""

    completion: str = Field(description="Text to verify.")
    reference: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
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
    singleton: bool = Field(description="Fewer than two rollouts entered the baseline.")
    baseline_size: int = Field(description="Rollouts that entered the group baseline.")
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
    singleton_groups: int
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
