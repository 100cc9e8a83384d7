"""Verifiers that misbehave on purpose, to prove the executor contains every failure mode.

Loaded through the same plugin mechanism a user's custom verifier uses (REWARDD_PLUGINS),
so the worker processes really import them from the forkserver.

Each takes ``when``: a list of completions to misbehave on. Without it every rollout
misbehaves; with it the other rollouts are rewarded ``float(completion)`` like test_echo, so
one group can mix a culprit with innocent samples whose rewards prove where each result went.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from rewardd.verifiers import REGISTRY, Outcome, Verifier, VerifierParams, register


class FaultParams(VerifierParams):
    when: list[str] | None = None
    """Misbehave only for these completions; the others are rewarded float(completion)."""


class SleepParams(FaultParams):
    seconds: float = 60.0


class FaultyVerifier(Verifier):
    """Calls ``misbehave`` for the rollouts ``params.when`` selects; echoes the others."""

    Params = FaultParams

    def verify(self, sample, reference, params):
        if params.when is not None and sample.completion not in params.when:
            return Outcome.success(float(sample.completion))
        return self.misbehave(params)

    def misbehave(self, params) -> Outcome:
        raise NotImplementedError


class SleepVerifier(FaultyVerifier):
    name = "test_sleep"
    description = ("Sleeps for params.seconds, then rewards 1.0 (exercises the soft "
                   "timeout: SIGALRM interrupts the sleep).")
    Params = SleepParams

    def misbehave(self, params):
        time.sleep(params.seconds)
        return Outcome.success(1.0)


class BlockVerifier(FaultyVerifier):
    name = "test_block"
    description = ("Sleeps for params.seconds with SIGALRM blocked, then rewards 1.0: the soft "
                   "deadline cannot interrupt it (exercises the hard limit).")
    Params = SleepParams

    def misbehave(self, params):
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            time.sleep(params.seconds)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return Outcome.success(1.0)


class SpinVerifier(FaultyVerifier):
    name = "test_spin"
    description = ("Spins in C code that never checks for signals (sum over a huge range): "
                   "neither SIGALRM nor a Python SIGTERM handler can stop it.")

    def misbehave(self, params):
        return Outcome.success(float(sum(range(10 ** 13)) > 0))  # hours of C-level work


class CrashVerifier(FaultyVerifier):
    name = "test_crash"
    description = "Kills its own worker process with SIGKILL (exercises crash recovery)."

    def misbehave(self, params):
        os.kill(os.getpid(), signal.SIGKILL)
        return Outcome.success(1.0)  # never reached


class RaiseVerifier(FaultyVerifier):
    name = "test_raise"
    description = "Raises ZeroDivisionError (exercises the 'error' failure)."

    def misbehave(self, params):
        return Outcome.success(1 / 0)


class UnpicklableVerifier(FaultyVerifier):
    name = "test_unpicklable"
    description = "Returns a reward whose detail cannot be pickled back to the service."

    def misbehave(self, params):
        return Outcome.success(1.0, lock=threading.Lock())


class SwallowParams(SleepParams):
    swallow: int = 1
    """How many CheckTimeout-s (any BaseException) to swallow before letting one through."""


class SwallowVerifier(FaultyVerifier):
    name = "test_swallow"
    description = ("Sleeps with a bare except around it that swallows the soft deadline's "
                   "exception params.swallow times, then returns 1.0 if it gets the chance.")
    Params = SwallowParams

    def misbehave(self, params):
        swallowed = 0
        deadline = time.monotonic() + params.seconds
        while time.monotonic() < deadline:
            try:
                time.sleep(max(deadline - time.monotonic(), 0.0))
            except BaseException:  # noqa: BLE001 - misbehaving on purpose
                swallowed += 1
                if swallowed > params.swallow:
                    raise
        return Outcome.success(1.0)


class EchoVerifier(Verifier):
    name = "test_echo"
    description = "Rewards float(completion): lets tests choose exact rewards per rollout."

    def verify(self, sample, reference, params):
        return Outcome.success(float(sample.completion))


for _verifier in (SleepVerifier(), BlockVerifier(), SpinVerifier(), CrashVerifier(),
                  RaiseVerifier(), UnpicklableVerifier(), SwallowVerifier(), EchoVerifier()):
    if _verifier.name not in REGISTRY:
        register(_verifier)
