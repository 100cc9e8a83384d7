"""The one small interface every verifier implements, and the one result type it returns.

A verifier is a pure function of (sample, reference, params) -> Outcome. It knows nothing
about HTTP, Celery or process pools: the executor in ``workers/`` runs it under a killable
wall-clock limit, and the service turns its Outcome into a response cell.

An Outcome is either a reward (``ok=True``) or a typed failure (``ok=False`` with ``error``
one of :class:`FailureKind`). A failure never carries a reward: the advantage step decides
what a failed cell means (exclusion from the baseline, or a configured fallback), so a
failure can never pass for a reward of 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Mapping

from pydantic import BaseModel, ConfigDict, Field


REWARD_BOUND = 1e12
"""Largest reward magnitude accepted anywhere (params, precomputed values, fallbacks).

Far beyond any reward scale, and small enough that weighted sums and squared deviations of a
batch stay finite and exact enough in float64."""

RewardValue = Annotated[float, Field(allow_inf_nan=False, ge=-REWARD_BOUND, le=REWARD_BOUND)]


class FailureKind(str, enum.Enum):
    """Why a cell has no reward. The documented, closed set of ``status.<name>.error`` values."""

    timeout = "timeout"
    """The verifier ran past its wall-clock limit: interrupted inside its worker (a signal),
    or, when a signal cannot stop it (C code), its worker process killed and replaced."""
    crashed = "crashed"
    """The worker process died while verifying (segfault, out of memory, os._exit)."""
    error = "error"
    """The verifier raised an unexpected exception; ``detail`` has its type and message."""
    invalid_reference = "invalid_reference"
    """The reference is missing a field this verifier needs, or cannot be parsed."""
    unavailable = "unavailable"
    """The executor could not run the call (shutting down, pool broken)."""
    missing = "missing"
    """A precomputed component had no value for this rollout (null or absent)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """What a verifier sees of one rollout: plain data, picklable, cheap to ship to a worker."""

    completion: str
    prompt: str = ""
    num_tokens: int | None = None


@dataclass(slots=True)
class Outcome:
    """One cell of the reward table: a reward, or a typed failure with the reason."""

    ok: bool
    reward: float | None = None
    error: FailureKind | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def success(cls, reward: float, **detail: Any) -> Outcome:
        return cls(ok=True, reward=float(reward), error=None, detail=detail)

    @classmethod
    def failure(cls, kind: FailureKind, message: str, **detail: Any) -> Outcome:
        return cls(ok=False, reward=None, error=kind, detail={"message": message, **detail})

    def to_dict(self) -> dict[str, Any]:
        """Plain data for crossing a process boundary or a queue."""
        return {
            "ok": self.ok,
            "reward": self.reward,
            "error": self.error.value if self.error else None,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        error = data.get("error")
        return cls(
            ok=bool(data["ok"]),
            reward=data.get("reward"),
            error=FailureKind(error) if error else None,
            detail=dict(data.get("detail") or {}),
        )


class VerifierParams(BaseModel):
    """Base of every verifier's parameter model: unknown parameters are an error, not ignored."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class InvalidReference(ValueError):
    """Raised by a verifier when the reference lacks what it needs; becomes ``invalid_reference``."""


class Verifier:
    """Base class: subclasses set ``name``, ``description``, ``Params`` and implement ``verify``.

    ``verify`` receives validated params (an instance of ``Params``) and returns an Outcome, or
    raises :class:`InvalidReference`. Any other exception is reported as ``error`` by
    :func:`run_verifier`; verifiers do not need to catch their own bugs.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    reference_fields: ClassVar[dict[str, str]] = {}
    Params: ClassVar[type[VerifierParams]] = VerifierParams

    def verify(self, sample: Sample, reference: Mapping[str, Any], params: Any) -> Outcome:
        raise NotImplementedError

    def warm_up(self) -> None:
        """Pay one-time costs (grammar builds, caches) before the first real call.

        Worker processes fork from a parent that ran this, so they start warm.
        """


def run_verifier(verifier: Verifier, sample: Sample, reference: Mapping[str, Any],
                 params: Mapping[str, Any]) -> Outcome:
    """Validate params, run the verifier and turn exceptions into typed failures."""
    try:
        parsed = verifier.Params.model_validate(params)
        return verifier.verify(sample, reference, parsed)
    except InvalidReference as exc:
        return Outcome.failure(FailureKind.invalid_reference, str(exc))
    except Exception as exc:  # a verifier bug must become a typed cell, never a lost request
        return Outcome.failure(FailureKind.error, f"{type(exc).__name__}: {exc}",
                               exception=type(exc).__name__)
