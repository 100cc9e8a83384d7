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
from typing import Annotated, Any, ClassVar, Mapping, Sequence

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
    judge_unparseable = "judge_unparseable"
    """A judge answered, but no verdict could be read from its answer, also after the bounded
    retries; ``detail`` has the raw answer (truncated). Never a default score."""
    judge_refused = "judge_refused"
    """A judge declined to grade (a refusal, or a content filter stopped its answer)."""
    judge_unavailable = "judge_unavailable"
    """The judge backend could not be reached or kept failing (timeouts, 429s and 5xx past
    the retries, a model that would not load)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """What a verifier sees of one rollout: plain data, picklable, cheap to ship to a worker."""

    completion: str
    prompt: str = ""
    num_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class GroupContext:
    """Where a group comes from, for group-level verifiers that need it (rubric dropout
    draws its subset from the run, the group and the step; evaluation turns it off)."""

    run_id: str | None = None
    group_id: str = ""
    step: int | None = None
    evaluation: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> GroupContext:
        data = data or {}
        return cls(run_id=data.get("run_id"), group_id=str(data.get("group_id") or ""),
                   step=data.get("step"), evaluation=bool(data.get("evaluation", False)))


@dataclass(slots=True)
class Outcome:
    """One cell of the reward table: a reward, or a typed failure with the reason."""

    ok: bool
    reward: float | None = None
    error: FailureKind | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    receipt: dict[str, Any] | None = None
    """What the verdict was decided from (:mod:`rewardd.verifiers.receipts`): stamped by
    the service when the outcome comes back, never by the verifier (a worker's outcomes
    have none, so :meth:`to_dict` adds nothing to what they send)."""

    @classmethod
    def success(cls, reward: float, **detail: Any) -> Outcome:
        return cls(ok=True, reward=float(reward), error=None, detail=detail)

    @classmethod
    def failure(cls, kind: FailureKind, message: str, **detail: Any) -> Outcome:
        return cls(ok=False, reward=None, error=kind, detail={"message": message, **detail})

    def to_dict(self) -> dict[str, Any]:
        """Plain data for crossing a process boundary or a queue (a session's record)."""
        out = {
            "ok": self.ok,
            "reward": self.reward,
            "error": self.error.value if self.error else None,
            "detail": self.detail,
        }
        if self.receipt is not None:
            out["receipt"] = self.receipt
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        error = data.get("error")
        return cls(
            ok=bool(data["ok"]),
            reward=data.get("reward"),
            error=FailureKind(error) if error else None,
            detail=dict(data.get("detail") or {}),
            receipt=data.get("receipt"),
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
    code_fields: ClassVar[tuple[tuple[str, ...], ...]] = ()
    """Paths of reference fields that hold code (a string, or a list of lines): the service
    refuses one over its size limit before anything runs (REWARDD_MAX_CODE_FIELD_BYTES)."""
    Params: ClassVar[type[VerifierParams]] = VerifierParams
    revision: ClassVar[str] = "1"
    """Changes whenever the verifier's verdicts change (a fix, a new rule): receipts name it,
    the verdict cache keys on it, and ``tests/unit/test_verifier_revisions.py`` fails when a
    verifier's verdicts on its labelled corpus move while its revision stays."""
    judged: ClassVar[bool] = False
    """A judge model decides: receipts name its backend, model, temperature and seed."""

    def verify(self, sample: Sample, reference: Mapping[str, Any], params: Any) -> Outcome:
        raise NotImplementedError

    deterministic: ClassVar[bool] = False
    """The verdict depends on nothing but the sample, the reference and the params: the
    verdict cache may answer for it. Off unless a verifier says so (a plugin may call a
    service or draw random numbers); the built-in rule-based verifiers say so."""

    def cacheable(self, params: Mapping[str, Any]) -> bool:
        """True when the verdict cache may answer for a call with the effective ``params``
        (a dict, defaults filled in): a :attr:`deterministic` verifier that checks each
        sample alone. Judges and verifiers whose params bring in the clock say otherwise."""
        return self.deterministic and not self.group_level

    def repeatable(self, outcome: Outcome) -> bool:
        """True when ``outcome`` (a success of a :meth:`cacheable` call) would come out the
        same again: the cache keeps only those. A verifier whose verdict the clock can
        decide (a test that timed out) says no for such an outcome."""
        return True

    group_level: ClassVar[bool] = False
    """True for a verifier that must see a whole group at once (an arena compares the
    group's rollouts with each other) or that works much faster on a batch (a judge or a
    reward model). Its calls are never split across tasks, and a call that failed as a whole
    is never replayed one sample at a time: one rollout alone is not the same question."""

    def verify_group(self, samples: Sequence[Sample], reference: Mapping[str, Any],
                     params: Any, context: GroupContext) -> list[Outcome]:
        """One outcome per sample, in order. The default checks each sample alone; group-level
        verifiers override it. Raises :class:`InvalidReference` like :meth:`verify`."""
        return [self.verify(sample, reference, params) for sample in samples]

    def warm_up(self) -> None:
        """Pay one-time costs (grammar builds, caches) before the first real call.

        Worker processes fork from a parent that ran this, so they start warm.
        """


class GroupVerifier(Verifier):
    """Base of group-level verifiers (:attr:`Verifier.group_level`): they implement
    :meth:`verify_group`; a single sample (``POST /v1/verify``) is a group of one."""

    group_level: ClassVar[bool] = True

    def verify(self, sample: Sample, reference: Mapping[str, Any], params: Any) -> Outcome:
        return self.verify_group([sample], reference, params, GroupContext())[0]


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


def run_group_verifier(verifier: Verifier, samples: Sequence[Sample],
                       reference: Mapping[str, Any], params: Mapping[str, Any],
                       context: GroupContext | None = None) -> list[Outcome]:
    """:func:`run_verifier` for a group-level verifier: params validated once, one outcome per
    sample, and an exception (or a wrong number of outcomes) the same typed failure for every
    sample of the group."""
    try:
        parsed = verifier.Params.model_validate(params)
        outcomes = verifier.verify_group(samples, reference, parsed,
                                         context or GroupContext())
        if len(outcomes) != len(samples):
            raise RuntimeError(f"{verifier.name} returned {len(outcomes)} outcomes for "
                               f"{len(samples)} samples")
        return list(outcomes)
    except InvalidReference as exc:
        failure = (FailureKind.invalid_reference, str(exc), {})
    except Exception as exc:
        failure = (FailureKind.error, f"{type(exc).__name__}: {exc}",
                   {"exception": type(exc).__name__})
    kind, message, detail = failure
    return [Outcome.failure(kind, message, **detail) for _ in samples]
