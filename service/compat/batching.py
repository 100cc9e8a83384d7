"""Per-sample requests of one tenant scored together: the requests that arrive while a batch
is being scored make the next batch.

OpenRLHF posts each sample of a step on its own as its generation finishes (hundreds in
flight); one /v1/rewards call per sample would cost a tenant slot, a validation and a
pipeline round per sample, and past the tenant's limit a refusal per sample (see
:func:`rewardd.service.compat.scoring.score_each`). Here a tenant has at most
:data:`MAX_BATCHES` batches in flight; each takes every request waiting when it starts (up to
``REWARDD_MAX_ROLLOUTS_PER_REQUEST`` samples), so batches grow with the load by themselves and
a lone sample goes at once: no timer, no added latency when idle. Two batches rather than one,
so that a sample arriving while a slow check (a timeout) holds one batch does not wait for it.

A client that leaves takes its work back (issue 28: an 8,000-sample ``/get_reward`` whose
client left after 3 s kept 7,853 checks queued). A request waiting for a batch leaves the
queue. Inside a batch, the requests of at most :data:`SHARE_UP_TO` samples (OpenRLHF's one
sample per request) share one scoring call, and every larger request is a call of its own in
the same batch (under the same tenant slot); a call whose requests have all left is
cancelled, which drops its checks still queued in the executor. So a leaving client's work
that may run on is at most its own :data:`SHARE_UP_TO` checks, shared with requests that still
wait for them.

Alternatives weighed: a fixed flush interval (adds its delay to every sample when idle),
one call per sample with a slot each (the refusals above; 20x the pipeline overhead measured
per sample on a 2-core box for 1-rollout calls), one call per batch cancelled and restarted
without the leaver (every other request of the batch would lose its finished checks).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Sequence

from rewardd.service import heavy
from rewardd.service.compat.samples import SampleIn
from rewardd.service.compat.scoring import (SampleOut, compat_config, score_each,
                                            slot_when_free)
from rewardd.service.runtime import Runtime
from rewardd.service.tenancy import Tenant

MAX_BATCHES = 2
"""Batches one tenant's per-sample requests may have in flight in this process."""

SHARE_UP_TO = 8
"""Requests of at most this many samples share a scoring call with the other such requests
of their batch; a larger one is scored in a call of its own, cancelled when its client
leaves."""

CALL_SAMPLES = 4096
"""Samples scored per /v1/rewards round of a call, one round after another: what one round
builds (its request, plan, results and answer, a few KB per sample) is freed before the next,
so a 60,000-sample request holds its samples' results, not 60,000 samples' pipeline at once
(+370 MB of API memory in one round)."""

Outs = list[SampleOut | Exception]


@dataclass(eq=False)
class _Request:
    """One request's samples, waiting for a batch or being scored in one."""

    samples: Sequence[SampleIn]
    answer: asyncio.Future[Outs]
    call: _Call | None = None
    """The scoring call its samples are in, once its batch started."""


@dataclass(eq=False)
class _Call:
    """One scoring call of a batch and the requests still waiting for it."""

    requests: list[_Request]
    live: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Batcher:
    """The waiting requests of each tenant, and their batches in flight."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._waiting: dict[str, deque[_Request]] = defaultdict(deque)
        self._in_flight: dict[str, int] = defaultdict(int)
        self._tasks: set[asyncio.Task[None]] = set()

    def waiting(self, tenant: str) -> int:
        """Samples of ``tenant``'s requests waiting for a batch in this process."""
        return sum(len(request.samples) for request in self._waiting.get(tenant, ()))

    def calls_in_flight(self) -> int:
        """Scoring calls running now (for tests: a cancelled call is gone from here)."""
        return sum(1 for task in self._tasks if not task.done())

    async def submit(self, tenant: Tenant, samples: Sequence[SampleIn]) -> Outs:
        """Each sample's result (or the error its request answers), once its batch is
        scored; cancelling the caller takes its samples back (see the module docstring)."""
        loop = asyncio.get_running_loop()
        request = _Request(samples, loop.create_future())
        self._waiting[tenant.name].append(request)
        if self._in_flight[tenant.name] < MAX_BATCHES:
            self._in_flight[tenant.name] += 1
            # a context of its own: the batch outlives the request that started it, and
            # accounts its heavy work to itself (rewardd.service.heavy), not to the request
            self._spawn(self._drain(tenant), contextvars.Context())
        try:
            return await asyncio.shield(request.answer)
        except asyncio.CancelledError:
            self._leave(tenant.name, request)
            raise

    def _spawn(self, coro: object, context: contextvars.Context | None = None
               ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, context=context)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _leave(self, tenant: str, request: _Request) -> None:
        """A request whose client left: out of the queue, or one fewer waiting on its call
        (the call is cancelled when none is left)."""
        call = request.call
        if call is None:
            queue = self._waiting.get(tenant)
            if queue is not None and request in queue:
                queue.remove(request)
            return
        call.live -= 1
        if call.live <= 0 and call.task is not None:
            call.task.cancel()

    def _take(self, tenant: str) -> list[_Request]:
        """The next batch: waiting requests, in order, up to the per-request rollout limit
        in samples (always at least one request: each was capped at the door)."""
        limit = self._runtime.settings.max_rollouts_per_request
        queue, batch, size = self._waiting[tenant], [], 0
        while queue and (not batch or size + len(queue[0].samples) <= limit):
            request = queue.popleft()
            batch.append(request)
            size += len(request.samples)
        return batch

    async def _drain(self, tenant: Tenant) -> None:
        """Score batches of the tenant's waiting requests until none is left; each batch is
        taken once its slot is held, so it holds everything that arrived meanwhile."""
        queue = self._waiting[tenant.name]
        try:
            while queue:
                async with slot_when_free(self._runtime.limiter, tenant):
                    batch = self._take(tenant.name)
                    if not batch:  # every request that waited for this slot left
                        continue
                    shared = [r for r in batch if len(r.samples) <= SHARE_UP_TO]
                    calls = ([_Call(shared)] if shared else []) + [
                        _Call([r]) for r in batch if len(r.samples) > SHARE_UP_TO]
                    for call in calls:
                        call.live = len(call.requests)
                        for request in call.requests:
                            request.call = call
                        call.task = self._spawn(self._score(call, tenant))
                    # a cancelled call does not end the batch: asyncio.wait never raises
                    await asyncio.wait([call.task for call in calls if call.task is not None])
        finally:
            self._in_flight[tenant.name] -= 1

    async def _score(self, call: _Call, tenant: Tenant) -> None:
        """Score one call's samples and answer each of its requests with its share (the
        tenant's verdict cache answering what it has seen)."""
        samples = [sample for request in call.requests for sample in request.samples]
        config = compat_config(self._runtime.settings)
        outs: list[SampleOut | Exception] = []
        try:
            with heavy.scope():
                heavy.mark(heavy.heavy_rollouts(len(samples)))
                for start in range(0, len(samples), CALL_SAMPLES):
                    outs.extend(await score_each(samples[start:start + CALL_SAMPLES], config,
                                                 self._runtime, tenant.name))
        except asyncio.CancelledError:  # every request of the call left
            raise
        except Exception as exc:  # the call's failure is each of its samples' answer
            outs = [exc] * len(samples)
        start = 0
        for request in call.requests:
            end = start + len(request.samples)
            if not request.answer.done():
                request.answer.set_result(list(outs[start:end]))
            start = end
