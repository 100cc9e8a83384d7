"""The executor interface the service plans against.

The service turns a request into a list of :class:`VerifyCall` (one per group and reward
component) and awaits a list of :class:`CallResult` in the same order, each with one
:class:`ItemResult` per sample. Whether the calls run in local process pools or on
Celery workers is the executor's business; every failure mode (timeout, crash, broken pool)
comes back as a typed :class:`~rewardd.verifiers.base.Outcome`, never as an exception or a 0.
"""

from __future__ import annotations

import abc
import pickle
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import FailureKind, Outcome, Sample

ProgressCallback = Callable[[int], None]
"""Called with the number of checks (samples) that just finished, for progress bars."""

CallDoneCallback = Callable[[int, "CallResult"], None]
"""Called once per call, in the event loop, with the call's index in ``calls`` and its
settled result, as soon as that call (every chunk of it) is settled: lets a job report
finished groups early. Optional in :meth:`Executor.run`; callers pass it only when set."""

HARD_MARGIN_S = 0.1
"""Slack of a call's hard limit over the soft limits it backs up: time for the worker to
send the result of a check its soft deadline interrupted (milliseconds) before it is killed.
At most 0.1 s, so a one-sample call that even signals cannot interrupt is killed at its
limit plus 100 ms (pebble notices the overrun on a 0.1 s poll, so up to 0.1 s later)."""

HARD_SLACK_PER_EXTRA_SAMPLE_S = 0.02
"""Extra slack per sample after the first: each interrupted check overruns its soft deadline
by the alarm's latency (microseconds to milliseconds), which adds up over a long group."""


def keeps_group_whole(verifier: str) -> bool:
    """True when ``verifier``'s calls must stay whole: never split across tasks, never
    replayed one sample at a time (:attr:`rewardd.verifiers.base.Verifier.group_level`)."""
    impl = REGISTRY.get(verifier)
    return impl is not None and impl.group_level


def hard_limit_for(samples: int, timeout_s: float) -> float:
    """Wall-clock limit of a call (or task) of ``samples`` checks at ``timeout_s`` each: all
    of them at their full limit, plus :data:`HARD_MARGIN_S` and a little per extra sample."""
    return (timeout_s * samples + HARD_MARGIN_S
            + HARD_SLACK_PER_EXTRA_SAMPLE_S * max(samples - 1, 0))


@dataclass(frozen=True, slots=True)
class VerifyCall:
    """One verifier over the samples of one group: plain data, so it can cross a process
    boundary or a queue.

    One call per group, not per rollout, so a worker pays the broker and IPC round trip once
    per group and parses the group's shared reference once (verifiers cache per process).
    ``timeout_s`` is the limit of each sample's check, not of the whole call.
    """

    verifier: str
    samples: tuple[Sample, ...]
    reference: Mapping[str, Any]
    params: Mapping[str, Any]
    timeout_s: float
    context: Mapping[str, Any] | None = None
    """The group's :class:`~rewardd.verifiers.base.GroupContext` as plain data, for group-level
    verifiers (None for the others: it would only add bytes to every task)."""

    def task_args(self) -> tuple[Any, ...]:
        """Arguments of :func:`rewardd.workers.tasks.verify_group_task`: names, dicts and floats."""
        samples = [{"completion": s.completion, "prompt": s.prompt, "num_tokens": s.num_tokens}
                   for s in self.samples]
        return (self.verifier, samples, dict(self.reference), dict(self.params), self.timeout_s,
                dict(self.context) if self.context is not None else None)

    def hard_limit_s(self) -> float:
        """Wall-clock limit of the whole call, after which its worker process is killed.

        A backstop for hangs the in-worker soft deadline cannot interrupt: every sample may
        use its full limit, plus :data:`HARD_MARGIN_S` and a little per extra sample. For one
        sample it is ``timeout_s + 0.1``.
        """
        return hard_limit_for(len(self.samples), self.timeout_s)

    def one(self, index: int) -> VerifyCall:
        """The call for sample ``index`` alone (to replay a group that was killed)."""
        return replace(self, samples=(self.samples[index],))


def pickles(value: Any) -> bool:
    """True when ``value`` pickles, as every task's arguments must on their way to a worker
    process (pebble's pool; Celery's prefork pool re-pickles what the broker delivered)."""
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # RecursionError, PicklingError, MemoryError: anything
        return False
    return True


def unsendable(call: VerifyCall, exc: BaseException) -> Outcome:
    """The typed failure of ``call`` when its arguments would not pickle (``exc``): the part
    to blame (reference, params, samples or context), why, and what to do about it;
    ``invalid_reference`` when it is the reference, else ``error``. Never retried: the same
    payload fails the same way."""
    parts = (("reference", call.reference), ("params", call.params),
             ("samples", call.samples), ("context", call.context))
    part = next((name for name, value in parts if not pickles(value)), "arguments")
    fix = ("it nests too deeply; flatten it (a few hundred levels at most) or send the "
           "nested part as a JSON string" if isinstance(exc, RecursionError)
           else "send plain JSON values")
    kind = FailureKind.invalid_reference if part == "reference" else FailureKind.error
    return Outcome.failure(kind, f"the group's {part} could not be sent to a worker of "
                           f"verifier {call.verifier!r} ({type(exc).__name__}: {exc}): {fix}",
                           unsendable=part)


@dataclass(frozen=True, slots=True)
class ItemResult:
    """The result of one sample's check."""

    outcome: Outcome
    elapsed_s: float
    """Time inside the verifier (the limit, for a timeout); excludes queueing."""

    @classmethod
    def from_task(cls, data: Mapping[str, Any]) -> ItemResult:
        """From one entry of :func:`rewardd.workers.tasks.verify_group_task`'s plain-data result."""
        return cls(Outcome.from_dict(data["outcome"]), float(data["elapsed_s"]))


@dataclass(frozen=True, slots=True)
class CallResult:
    """The results of one call: ``items[i]`` belongs to ``call.samples[i]``."""

    items: list[ItemResult]
    replayed: bool = False
    """True when the group's worker was killed (hard limit) or died, or its task failed as a
    whole, and every sample was run again as its own one-sample call so that only the
    culprit got the failure."""


class Executor(abc.ABC):
    """Runs verifier calls. Implementations: :class:`rewardd.workers.embedded.EmbeddedExecutor`.

    Every implementation keeps the same limits: each sample's check has ``timeout_s`` (a soft
    deadline inside the worker), each call :meth:`VerifyCall.hard_limit_s` (the worker is
    killed), and a call of several samples that is killed, whose worker dies or whose task
    fails as a whole is replayed one sample per call, so only the culprit sample fails.
    """

    kind: str

    @abc.abstractmethod
    async def run(self, calls: Sequence[VerifyCall],
                  progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        """Run every call; results come back in the order of ``calls``, ``progress`` hears
        of each call's samples once the call is settled, and ``on_call_done`` gets each
        call's result as it settles.

        Cancelling the awaiting task stops the calls not yet settled as far as the
        executor can (queued ones are dropped, running ones stopped or revoked) and leaves
        nothing waiting behind: a cancelled job must not hold workers or pollers."""

    @abc.abstractmethod
    async def ready(self, wait_s: float = 5.0) -> bool:
        """True when a worker answers a round trip within ``wait_s`` (used by /readyz)."""

    def not_ready_reason(self, wait_s: float = 5.0) -> str:
        """Why :meth:`ready` just answered False, for /readyz; executors that know more
        (a pool that died and was replaced) say so."""
        return f"no verifier worker answered a round trip within {wait_s:g} s"

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What /readyz reports about this executor."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the workers; pending calls fail as ``unavailable``."""
