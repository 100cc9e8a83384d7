"""The advantage library's inputs as pydantic models: rollout groups and the advantage spec.

They are the v1 contract's own models (``rewardd.service.models`` re-exports them), defined
here, below the service, so that a trainer computing advantages in process validates exactly
what the server validates. Field rules that span fields (per-token lengths, span ranges)
live in :mod:`rewardd.advantages.checks`.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field

from rewardd.advantages.bounds import BoundedContract, FreeForm

REWARD_BOUND = 1e12
"""Largest reward magnitude accepted (precomputed values, fallbacks); the verifiers' own
``REWARD_BOUND`` is the same number (a test keeps them equal: the two pure libraries import
nothing of each other)."""

RewardValue = Annotated[float, Field(allow_inf_nan=False, ge=-REWARD_BOUND, le=REWARD_BOUND)]

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that must be finite: NaN or infinity is a 422, never a silent number."""

Weight = Annotated[float, Field(allow_inf_nan=False, ge=-1e6, le=1e6)]
"""A component weight; bounded so weighted sums of bounded rewards stay finite."""

MAX_TOKENS_PER_ROLLOUT = 1 << 24

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
"""Component names, labels, data sources and run ids: strict, since some become keys (a run
id is part of its run-state key, ``tenant/run``)."""

MAX_ID_LENGTH = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Unicode category Cc: C0 controls, DEL and C1 controls."""


def _no_control_characters(value: str) -> str:
    found = _CONTROL.search(value)
    if found is not None:
        raise ValueError(f"control character U+{ord(found.group()):04X} at index "
                         f"{found.start()} is not allowed in an id")
    return value


Identifier = Annotated[
    str, Field(min_length=1, max_length=MAX_ID_LENGTH,
               json_schema_extra={"pattern": r"^[^\x00-\x1f\x7f-\x9f]+$"}),
    AfterValidator(_no_control_characters)]
"""A group or rollout id as datasets write them (``HumanEval/0``, ``gsm8k/train/17``, spaces,
any script): 1 to 256 characters, none of them a control character, echoed verbatim.

Why not :data:`Name`: ids come from datasets, and forcing trainers to re-encode them (and map
them back) is glue every user would write. Ids are never made into keys, labels or paths;
they travel only as values inside JSON and msgpack (responses, job events, the judges'
hashed seeds), so no character can collide with a separator. Control characters stay out:
they break log lines and the text/event-stream framing of a job's events."""


class Contract(BoundedContract):
    """Base of request models: unknown fields are rejected so typos do not pass silently.
    Every list and map of a request model is ``FAIL_FAST`` (it stops at its first bad
    element) and free-form objects are ``FreeForm`` (bounded depth): see
    :mod:`rewardd.advantages.bounds`."""


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
        None, fail_fast=True,
        description="State embedding; steps are grouped by cosine similarity (bipace).")
    reward: RewardValue | None = Field(None, description="Step (process) reward.")


class Rollout(Contract):
    """One completion of a group's prompt, with what verifiers and estimators need."""

    rollout_id: Identifier = Field(
        description="Unique within the request; echoed verbatim in the response. Any string of "
        "1 to 256 characters without control characters (e.g. 'HumanEval/0#3').")
    completion: str | None = Field(None, description="Text the verifiers judge.")
    num_tokens: int | None = Field(
        None, ge=0, le=MAX_TOKENS_PER_ROLLOUT, description="Response length in tokens; needed for dense and rle advantages. "
        "Defaults to len(token_ids).")
    token_ids: list[int] | None = Field(None, fail_fast=True,
                                        description="Response token ids (num_tokens entries).")
    mask: list[int] | None = Field(
        None, fail_fast=True,
        description="0/1 per token; advantages are exactly 0 where it is 0 "
        "(tool or observation tokens).")
    segments: list[Segment] | None = Field(
        None, fail_fast=True,
        description="Labelled, non-overlapping token spans inside [0, num_tokens).")
    turns: list[Turn] | None = Field(None, fail_fast=True,
                                     description="Turn spans of a multi-turn rollout.")
    steps: list[Step] | None = Field(None, fail_fast=True,
                                     description="Agent steps, for step-level credit.")
    token_rewards: list[RewardValue] | None = Field(
        None, fail_fast=True,
        description="Per-token rewards (num_tokens entries).")
    values: list[FiniteFloat] | None = Field(
        None, fail_fast=True,
        description="Per-token value estimates (num_tokens entries).")
    kl: list[FiniteFloat] | None = Field(
        None, fail_fast=True,
        description="Per-token KL penalty terms (num_tokens entries), for reinforce_pp.")
    signal: list[FiniteFloat] | None = Field(
        None, fail_fast=True,
        description="Per-token external signal h (hindsight/teacher), for modulate.")
    greedy: bool = Field(False, description="The group's greedy rollout (baseline of remax).")
    label: Name | None = Field(
        None, description="Intermediate outcome label (strata of outcome_conditioned).")
    cluster: Name | None = Field(None, description="Strategy cluster (uniqueness).")
    quality: FiniteFloat | None = Field(None, description="Quality score (gagar).")
    answer: str | None = Field(None, description="Final answer, for majority votes (glpo).")
    reward: RewardValue | None = Field(
        None, description="Precomputed scalar reward; enters the table as the component 'reward'.")
    rewards: dict[Name, RewardValue | None] | None = Field(
        None, fail_fast=True,
        description="Precomputed reward components by name; null means missing.")


class Group(Contract):
    """One prompt with its N rollouts and the reference the verifiers compare against."""

    group_id: Identifier = Field(
        description="Unique within the request; echoed verbatim in the response. Any string of "
        "1 to 256 characters without control characters (e.g. 'gsm8k/train/17').")
    prompt: str = Field("", description="The prompt, for verifiers and judges that read it.")
    reference: FreeForm = Field(
        default_factory=dict,
        description="Verifier references: math {'answer': ...}; exact_match {'answer': ...}.")
    rollouts: list[Rollout] = Field(min_length=1, fail_fast=True,
                                    description="The group's rollouts (N >= 1).")
    data_source: Name | None = Field(None, description="Data source, for ucb_curriculum.")
    source: Name | None = Field(
        None, description="The dataset this prompt comes from (e.g. 'gsm8k'): echoed in the "
        "response's group and kept in the run record, whose summaries and filters go by it "
        "(without it, the record uses data_source).")


class Profile(str, Enum):
    """Which trainer's numerical conventions to follow (docs/estimators.md, conventions table)."""

    rewardd = "rewardd"
    verl = "verl"
    trl = "trl"
    openrlhf = "openrlhf"


OutputFormat = Literal["dense", "rle", "scalar", "none"]


class Stage(Contract):
    """One named entry of the advantage catalogue with its parameters."""

    name: str = Field(description="Entry name; see GET /v1/estimators.")
    params: FreeForm = Field(default_factory=dict)


class AdvantageSpec(Contract):
    """How rewards become per-token advantages: transforms -> estimator (or aggregate) ->
    reweight -> filters, each entry from GET /v1/estimators."""

    estimator: str = Field("grpo", description="Estimator name; see GET /v1/estimators.")
    profile: Profile = Field(Profile.rewardd, description="Trainer conventions to reproduce.")
    params: FreeForm = Field(default_factory=dict, description="Estimator parameters.")
    aggregate: str = Field(
        "sum", description="Multi-reward aggregation: 'sum' (weighted sum, then the estimator), "
        "'gdpo', 'sa_mrpo', 'dara' or 'gd2po'.")
    aggregate_params: FreeForm = Field(default_factory=dict)
    transforms: list[Stage] = Field(
        default_factory=list, fail_fast=True,
        description="Reward transforms applied in order before the "
        "estimator (rank, overlong, prm_clip, prm_delta).")
    reweight: list[Stage] = Field(
        default_factory=list, fail_fast=True,
        description="Reweighting applied in order after the estimator.")
    filters: list[Stage] = Field(
        default_factory=list, fail_fast=True,
        description="Filters and advice, reported under `advice`; never "
        "applied to the advantages.")
    components: bool = Field(
        False, description="Also return each component's own advantages (scalar per rollout).")
    output: OutputFormat = Field(
        "rle", description="dense: floats per token; rle: [[value, length], ...]; "
        "scalar: one float per rollout; none: no advantages.")
    weights: dict[Name, Weight] = Field(
        default_factory=dict, fail_fast=True,
        description="Weights of precomputed components sent on rollouts (default 1.0 each).")


class AdvantagesRequest(Contract):
    """Body of POST /v1/advantages: advantages from rewards the rollouts already carry."""

    run_id: Name | None = None
    groups: list[Group] = Field(min_length=1, fail_fast=True)
    advantage: AdvantageSpec = Field(default_factory=AdvantageSpec)
