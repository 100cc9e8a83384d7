"""Verifiers that misbehave on purpose, to prove the executor contains every failure mode.

Loaded through the same plugin mechanism a user's custom verifier uses (REWARDD_PLUGINS),
so the worker processes really import them from the forkserver.
"""

from __future__ import annotations

import os
import signal
import time

from verifiers import REGISTRY, Outcome, Verifier, VerifierParams, register


class SleepParams(VerifierParams):
    seconds: float = 60.0


class SleepVerifier(Verifier):
    name = "test_sleep"
    description = "Sleeps for params.seconds, then rewards 1.0 (exercises the timeout)."
    Params = SleepParams

    def verify(self, sample, reference, params):
        time.sleep(params.seconds)
        return Outcome.success(1.0)


class CrashVerifier(Verifier):
    name = "test_crash"
    description = "Kills its own worker process with SIGKILL (exercises crash recovery)."

    def verify(self, sample, reference, params):
        os.kill(os.getpid(), signal.SIGKILL)
        return Outcome.success(1.0)  # never reached


class RaiseVerifier(Verifier):
    name = "test_raise"
    description = "Raises ZeroDivisionError (exercises the 'error' failure)."

    def verify(self, sample, reference, params):
        return Outcome.success(1 / 0)


class EchoVerifier(Verifier):
    name = "test_echo"
    description = "Rewards float(completion): lets tests choose exact rewards per rollout."

    def verify(self, sample, reference, params):
        return Outcome.success(float(sample.completion))


for _verifier in (SleepVerifier(), CrashVerifier(), RaiseVerifier(), EchoVerifier()):
    if _verifier.name not in REGISTRY:
        register(_verifier)
