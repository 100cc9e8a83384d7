"""A verifier with a set cost, for the streaming-session tests and benchmark (issue #18).

``test_delay`` sleeps ``params.seconds`` (the cost of a real check, ~20 ms in the benchmark)
and rewards ``float(completion)``, so a test chooses each rollout's reward by its text.
Loaded like a user's plugin (REWARDD_PLUGINS / ``--plugins tests.plugins.stream``).
"""

from __future__ import annotations

import time

from rewardd.verifiers import REGISTRY, Outcome, Verifier, VerifierParams, register


class DelayParams(VerifierParams):
    seconds: float = 0.02
    """How long each check takes."""


class DelayVerifier(Verifier):
    name = "test_delay"
    description = "Sleeps params.seconds, then rewards float(completion)."
    Params = DelayParams

    def verify(self, sample, reference, params):
        time.sleep(params.seconds)
        return Outcome.success(float(sample.completion))


if DelayVerifier.name not in REGISTRY:  # imported by the API and by every worker
    register(DelayVerifier())
