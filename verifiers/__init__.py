"""Verifiers: pure functions of (rollout, reference, params) -> reward or typed failure.

The registry below is the single list of verifier kinds; the service lists it at
``GET /v1/verifiers`` and the executor looks names up in it.
"""

from __future__ import annotations

from rewardd.verifiers.base import (FailureKind, InvalidReference, Outcome, Sample, Verifier,
                            VerifierParams, run_verifier)
from rewardd.verifiers.code import CodeVerifier
from rewardd.verifiers.critique import CritiqueVerifier
from rewardd.verifiers.judge.arena import ArenaVerifier
from rewardd.verifiers.judge.continuation import ContinuationVerifier
from rewardd.verifiers.judge.refusal_judge import RefusalJudgeVerifier
from rewardd.verifiers.judge.reward_model import RewardModelVerifier
from rewardd.verifiers.judge.rubric import RubricVerifier
from rewardd.verifiers.math import MathVerifier
from rewardd.verifiers.refusal import RefusalVerifier
from rewardd.verifiers.structured import JsonSchemaVerifier, ToolCallVerifier
from rewardd.verifiers.text import ExactMatchVerifier, LengthVerifier, RegexVerifier

REGISTRY: dict[str, Verifier] = {
    v.name: v for v in (MathVerifier(), CodeVerifier(), ExactMatchVerifier(), RegexVerifier(),
                        LengthVerifier(), RubricVerifier(), ArenaVerifier(),
                        RewardModelVerifier(), ToolCallVerifier(), JsonSchemaVerifier(),
                        CritiqueVerifier(), RefusalVerifier(), RefusalJudgeVerifier(),
                        ContinuationVerifier())
}


def register(verifier: Verifier) -> Verifier:
    """Add a verifier (for plugins named in REWARDD_PLUGINS); a name may be taken once."""
    if verifier.name in REGISTRY:
        raise ValueError(f"verifier {verifier.name!r} is already registered")
    REGISTRY[verifier.name] = verifier
    return verifier


def get_verifier(name: str) -> Verifier:
    """The verifier registered under ``name``; KeyError lists the valid names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown verifier {name!r}; valid: {', '.join(sorted(REGISTRY))}") from None


__all__ = ["REGISTRY", "FailureKind", "InvalidReference", "Outcome", "Sample", "Verifier",
           "VerifierParams", "get_verifier", "register", "run_verifier"]
