"""The typed bodies of replay (``POST /v1/runs/{run_id}/reverify`` and its job's result),
apart from the logic (:mod:`rewardd.service.replay`) so the API's models can name them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, JsonValue, StrictInt, field_validator

from rewardd.advantages.models import Contract

MAX_FLIPS = 10_000
"""Flips listed in the result, at most (the summary counts them all): a verifier change
that flips a whole run must not make a result of hundreds of megabytes."""


class ReverifyRequest(Contract):
    """Body of POST /v1/runs/{run_id}/reverify."""

    steps: tuple[StrictInt, StrictInt] | None = Field(
        None, description="`[first, last]`: only rollouts of these steps (inclusive); "
        "default: the whole run.")
    set: dict[str, JsonValue] = Field(
        default_factory=dict, description="Parameter overrides, `{\"<component>.<param>\": "
        "value}` (a dotted param sets a nested one: `rubric.backend.model`).")

    @field_validator("steps")
    @classmethod
    def _ordered(cls, steps: tuple[int, int] | None) -> tuple[int, int] | None:
        if steps is not None and not 0 <= steps[0] <= steps[1]:
            raise ValueError("steps must be [first, last] with 0 <= first <= last")
        return steps

    @field_validator("set")
    @classmethod
    def _dotted(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        for key in overrides:
            component, _, param = key.partition(".")
            if not component or not param:
                raise ValueError(f"{key!r}: name a component and a parameter, "
                                 "`<component>.<param>`")
        return overrides


class ReverifyJob(BaseModel):
    """What a reverify job keeps to run (and to resume on another pod)."""

    run_id: str
    request: ReverifyRequest


class VerdictPair(BaseModel):
    before: Any = None
    after: Any = None


class Flip(BaseModel):
    step: int | None
    group_id: str
    rollout_id: str
    component: str
    source: str | None = None
    before: float | None = Field(description="The recorded reward (null: the check failed).")
    after: float | None = Field(description="The reward now (null: the check failed).")
    outcomes: VerdictPair = Field(description="`ok` or the failure kind, before and after.")
    receipts: VerdictPair = Field(description="The recorded receipt and today's.")


class CountsBy(BaseModel):
    rescored: int = 0
    flipped: int = 0
    up: int = Field(0, description="Flips to a higher reward (or from a failure to one).")
    down: int = Field(0, description="Flips to a lower reward (or to a failure).")


class ReplaySummary(BaseModel):
    rollouts: int = Field(description="Recorded rollouts of the run within `steps`.")
    rescored: int = Field(description="Rollouts checked again.")
    skipped: int = Field(description="Rollouts recorded without their completion (or their "
                         "group's inputs): nothing to check again.")
    checks: int = 0
    flips: int = 0
    components: dict[str, CountsBy] = Field(default_factory=dict)
    sources: dict[str, CountsBy] = Field(default_factory=dict,
                                         description="By source (`\"\"`: none).")


class ReverifyResult(BaseModel):
    """The result of a reverify job."""

    run_id: str
    steps: tuple[int, int] | None = None
    set: dict[str, JsonValue] = Field(default_factory=dict)
    flips: list[Flip]
    flips_truncated: bool = Field(False, description="More flips than listed "
                                  f"(at most {MAX_FLIPS}); the summary counts them all.")
    summary: ReplaySummary


