"""Verifiers: pure functions of (rollout, reference, params) -> reward or typed failure.

:mod:`~rewardd.verifiers.registry` is the single list of verifier kinds; importing this
package registers the built-ins in it. The service lists it at ``GET /v1/verifiers`` and the
executor looks names up in it.
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
from rewardd.verifiers.registry import REGISTRY, get_verifier, register
from rewardd.verifiers.structured import JsonSchemaVerifier, ToolCallVerifier
from rewardd.verifiers.text import ExactMatchVerifier, LengthVerifier, RegexVerifier

for _builtin in (MathVerifier(), CodeVerifier(), ExactMatchVerifier(), RegexVerifier(),
                 LengthVerifier(), RubricVerifier(), ArenaVerifier(), RewardModelVerifier(),
                 ToolCallVerifier(), JsonSchemaVerifier(), CritiqueVerifier(),
                 RefusalVerifier(), RefusalJudgeVerifier(), ContinuationVerifier()):
    register(_builtin)
del _builtin

__all__ = ["REGISTRY", "FailureKind", "InvalidReference", "Outcome", "Sample", "Verifier",
           "VerifierParams", "get_verifier", "register", "run_verifier"]
