"""Verifier calls on their way to the executor and back: the verdict cache answers what it
can, the executor runs the rest, and every outcome comes back stamped with its receipt.

Every entry (a batch, a job, a session's group, ``/v1/verify``, the trainer protocols) runs
its calls through :func:`run_stamped` (by way of :func:`rewardd.service.pipeline.run_calls`),
so every verdict carries a receipt (:mod:`rewardd.verifiers.receipts`) whichever route
brought it, and a cached verdict is the same outcome, receipt included, as a fresh one.

A call some of whose samples the cache answered goes to the executor with the other
samples only; a call it answered whole never leaves the API process. ``progress`` and
``on_call_done`` hear of the call as if it had run whole: a job streams its group the same
way with or without the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from rewardd.service import heavy, metrics
from rewardd.service.verdict_cache import CacheView
from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import Outcome
from rewardd.verifiers.receipts import CallStamp, text_digest
from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ItemResult,
                                      ProgressCallback, VerifyCall)

Observer = Callable[[VerifyCall, CallResult], None]
"""Hears of each call's checks that a verifier actually ran (the metrics)."""


@dataclass(slots=True)
class StampedCall:
    """One call with what its receipts and cache keys need, computed once."""

    call: VerifyCall
    stamp: CallStamp | None
    """None for a verifier this process does not know (its call fails typed anyway)."""
    hashes: list[str]
    keys: list[str | None]
    cached: dict[int, Outcome]
    """Samples (by index) the cache answered."""

    @classmethod
    def of(cls, call: VerifyCall) -> StampedCall:
        verifier = REGISTRY.get(call.verifier)
        stamp = (CallStamp.of(verifier, call.params, call.reference, call.context)
                 if verifier is not None else None)
        hashes = [text_digest(s.completion) for s in call.samples]
        keys = ([stamp.cache_key(s, h) for s, h in zip(call.samples, hashes)]
                if stamp is not None else [None] * len(hashes))
        return cls(call, stamp, hashes, keys, {})

    @property
    def answered(self) -> bool:
        return len(self.cached) == len(self.call.samples)

    def pending(self) -> tuple[VerifyCall, list[int] | None]:
        """The call of the samples the cache did not answer, and their indices (None: all)."""
        if not self.cached:
            return self.call, None
        missing = [i for i in range(len(self.call.samples)) if i not in self.cached]
        return replace(self.call, samples=tuple(self.call.samples[i] for i in missing)), missing

    def merge(self, ran: CallResult | None, missing: list[int] | None) -> CallResult:
        """The whole call's result: cached outcomes where the cache answered, the executor's
        elsewhere, each stamped with its receipt."""
        if missing is None and ran is not None:
            items = list(ran.items)
        else:
            slots: list[ItemResult | None] = [None] * len(self.call.samples)
            for i, outcome in self.cached.items():
                slots[i] = ItemResult(outcome, 0.0)
            for i, item in zip(missing or (), ran.items if ran is not None else ()):
                slots[i] = item
            items = [item for item in slots if item is not None]
        if self.stamp is not None:
            for sample, item, digest in zip(self.call.samples, items, self.hashes):
                item.outcome.receipt = self.stamp.receipt(sample, item.outcome, digest)
        return CallResult(items, ran.replayed if ran is not None else False)

    def fresh_verdicts(self, result: CallResult) -> list[tuple[str, Outcome]]:
        """What the cache may keep of ``result``: the samples it did not answer whose
        verdict the stamp says is repeatable."""
        if self.stamp is None:
            return []
        return [(key, item.outcome) for i, (key, item) in enumerate(zip(self.keys, result.items))
                if key is not None and i not in self.cached and self.stamp.keeps(item.outcome)]


async def _look_up(stamped: Sequence[StampedCall], cache: CacheView) -> None:
    wanted = [(sc, i, key) for sc in stamped for i, key in enumerate(sc.keys) if key]
    if not wanted:
        return
    found = await cache.get_many([key for _, _, key in wanted])
    counts: dict[str, list[int]] = {}
    for (sc, i, _), outcome in zip(wanted, found):
        tally = counts.setdefault(sc.call.verifier, [0, 0])
        if outcome is None:
            tally[1] += 1
            continue
        tally[0] += 1
        sc.cached[i] = Outcome(outcome.ok, outcome.reward, outcome.error, outcome.detail)
    for verifier, (hits, misses) in counts.items():
        cache.count(hits, misses)
        metrics.count_verdict_cache(verifier, hits, misses)


async def run_stamped(calls: Sequence[VerifyCall], executor: Executor,
                      observe: Observer, progress: ProgressCallback | None = None,
                      on_call_done: CallDoneCallback | None = None,
                      cache: CacheView | None = None,
                      beside: Sequence[VerifyCall] = ()) -> list[CallResult]:
    """Run ``calls`` (results in their order), answering from ``cache`` what it holds;
    ``observe`` hears of the checks that ran, ``on_call_done`` of every call as it settles.

    ``beside``: calls that ride in the same executor run (one flow, one round trip: the
    batch's canaries) but are not the batch's: never answered from or kept in the cache,
    never observed, never in ``progress`` or ``on_call_done``; their results follow the
    calls' in the list returned."""
    stamped = await heavy.offload(lambda: [StampedCall.of(call) for call in (*calls, *beside)])
    own = len(calls)
    if cache is not None and cache.enabled:
        await _look_up(stamped[:own], cache)
    results: list[CallResult | None] = [None] * len(stamped)
    todo: list[tuple[int, list[int] | None]] = []
    pending: list[VerifyCall] = []
    for index, sc in enumerate(stamped):
        if sc.answered:  # never a call beside: the cache was not asked about those
            results[index] = sc.merge(None, None)
            if progress is not None:
                progress(len(sc.call.samples))
            if on_call_done is not None:
                on_call_done(index, results[index])
            continue
        call, missing = sc.pending()
        if missing is not None and progress is not None:
            progress(len(sc.cached))
        todo.append((index, missing))
        pending.append(call)

    observed: set[int] = set()
    # with calls beside, progress is told per settled call of the batch's own (the executor
    # would count the others' samples too)
    counted = progress if beside else None

    def land(position: int, ran: CallResult) -> int:
        """Record the checks of pending call ``position`` once, and its whole call's
        result; the call's index in ``calls``."""
        index, missing = todo[position]
        if position not in observed:
            observed.add(position)
            if index < own:
                observe(pending[position], ran)
                if counted is not None:
                    counted(len(pending[position].samples))
        if results[index] is None:
            results[index] = stamped[index].merge(ran, missing)
        return index

    def settled(position: int, ran: CallResult) -> None:
        index = land(position, ran)
        if on_call_done is not None and index < own:
            on_call_done(index, results[index])

    ran_all = (await executor.run(pending, None if beside else progress, settled)
               if pending else [])
    for position, ran in enumerate(ran_all):  # an executor that reported no settled call
        land(position, ran)
    final = [result for result in results if result is not None]
    if cache is not None and cache.enabled:
        await cache.put_many([kept for sc, result in zip(stamped[:own], final)
                              for kept in sc.fresh_verdicts(result)])
    return final


__all__ = ["StampedCall", "run_stamped"]
