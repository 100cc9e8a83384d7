"""Per-sample requests of one tenant scored together: the samples that arrive while a batch
is being scored make the next batch.

OpenRLHF posts each sample of a step on its own as its generation finishes (hundreds in
flight); one /v1/rewards call per sample would cost a tenant slot, a validation and a
pipeline round per sample, and past the tenant's limit a refusal per sample (see
:func:`rewardd.service.compat.scoring.score_samples`). Here a tenant has at most
:data:`MAX_BATCHES` calls in flight; each takes every sample waiting when it starts (up to
``REWARDD_MAX_ROLLOUTS_PER_REQUEST``), so batches grow with the load by themselves and a
lone sample goes at once: no timer, no added latency when idle. Two calls rather than one, so
that a sample arriving while a slow check (a timeout) holds one batch does not wait for it.

Alternatives weighed: a fixed flush interval (adds its delay to every sample when idle),
one call per sample with a slot each (the refusals above; 20x the pipeline overhead measured
per sample on a 2-core box for 1-rollout calls).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Sequence

from rewardd.service.compat.samples import SampleIn
from rewardd.service.compat.scoring import (SampleOut, compat_config, score_each,
                                            slot_when_free)
from rewardd.service.errors import Busy
from rewardd.service.runtime import Runtime
from rewardd.service.tenancy import Tenant

MAX_BATCHES = 2
"""Scoring calls one tenant's per-sample requests may have in flight in this process."""

MAX_PENDING = 65_536
"""Samples one tenant may have waiting for a batch in this process (more: 429)."""

Waiting = tuple[SampleIn, "asyncio.Future[SampleOut | Exception]"]


class Batcher:
    """The waiting samples of each tenant, and their batches in flight."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._waiting: dict[str, list[Waiting]] = defaultdict(list)
        self._in_flight: dict[str, int] = defaultdict(int)
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, tenant: Tenant, samples: Sequence[SampleIn]
                     ) -> list[SampleOut | Exception]:
        """Each sample's result (or the error its request answers), once its batch is
        scored."""
        waiting = self._waiting[tenant.name]
        if len(waiting) + len(samples) > MAX_PENDING:
            raise Busy(f"tenant {tenant.name!r} has {len(waiting)} samples waiting to be "
                       f"scored (the limit is {MAX_PENDING})", tenant=tenant.name,
                       retry_after_s=self._runtime.settings.retry_after_s)
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in samples]
        waiting.extend(zip(samples, futures))
        if self._in_flight[tenant.name] < MAX_BATCHES:
            self._in_flight[tenant.name] += 1
            task = loop.create_task(self._drain(tenant))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # a client that leaves does not cancel its samples: they are in a shared batch
        return list(await asyncio.gather(*(asyncio.shield(f) for f in futures)))

    async def _drain(self, tenant: Tenant) -> None:
        """Score batches of the tenant's waiting samples until none is left; each batch is
        taken once its slot is held, so it holds everything that arrived meanwhile."""
        limit = self._runtime.settings.max_rollouts_per_request
        waiting = self._waiting[tenant.name]
        try:
            while waiting:
                batch: list[Waiting] = []
                try:
                    async with slot_when_free(self._runtime.limiter, tenant):
                        batch = waiting[:limit]
                        del waiting[:limit]
                        outs: Sequence[SampleOut | Exception] = await score_each(
                            [sample for sample, _ in batch],
                            compat_config(self._runtime.settings), self._runtime)
                except Exception as exc:  # the batch's failure is each of its samples' answer
                    outs = [exc] * len(batch)
                for (_, future), out in zip(batch, outs):
                    if not future.done():
                        future.set_result(out)
        finally:
            self._in_flight[tenant.name] -= 1
