"""The per-sample trainer protocols' entry: a request's samples scored alone or in groups.

The protocol routes (OpenRLHF, slime, NeMo-Gym) read their trainer's body into samples and
hand them here; which way they are scored is the server's configuration
(``REWARDD_COMPAT_CONFIG``), not the route's: without ``group``, with the other requests'
samples waiting at that moment (:mod:`.batching`); with it, each once its group is whole
(:mod:`.groups`).
"""

from __future__ import annotations

from typing import Awaitable, Callable

from rewardd.service.compat.batching import Batcher
from rewardd.service.compat.config import CompatConfig, validated_compat_config
from rewardd.service.compat.groups import Assembler
from rewardd.service.compat.samples import SampleIn
from rewardd.service.compat.scoring import SampleOut, compat_config, raise_first
from rewardd.service.runtime import Runtime
from rewardd.service.sessions import SessionManager
from rewardd.service.tenancy import Tenant

SampleReader = Callable[[CompatConfig], Awaitable[list[SampleIn]]]
"""Reads a protocol request's samples under the server's compat configuration."""


class CompatScorer:
    """Per-sample protocol requests of one app: its batcher and its group assembler."""

    def __init__(self, runtime: Runtime, sessions: SessionManager) -> None:
        if runtime.settings.compat_config:  # a bad one stops the app's start, named
            validated_compat_config(runtime.settings)
        self._runtime = runtime
        self.batcher = Batcher(runtime)
        self.assembler = Assembler(sessions)

    @property
    def config(self) -> CompatConfig:
        """The compat configuration (validated when the settings loaded)."""
        return compat_config(self._runtime.settings)

    async def score(self, tenant: Tenant, protocol: str, read: SampleReader
                    ) -> tuple[list[SampleIn], list[SampleOut]]:
        """Read a protocol request's samples and score them; the first failed sample's error
        is raised (a request answers one status).

        Why no tenant slot while reading and waiting, unlike /v1/score: OpenRLHF posts every
        sample of a step on its own, hundreds at once, and retries a refusal five times a
        second apart before dropping the sample's reward; a 429 per sample past the tenant's
        limit would lose rewards, and a sample waiting for its group while holding a slot
        would keep the rest of its group out. The scoring itself holds the tenant's slots
        (one per batch or group, waited for), so the tenant's limit on work in flight still
        holds. What waits is bounded per tenant by :data:`.batching.MAX_PENDING` (without
        group mode) and by the tenant's rollouts in flight (group mode,
        ``REWARDD_SESSION_MAX_INFLIGHT``), and a body by the tenant's max_body_bytes."""
        config = self.config
        samples = await read(config)
        if config.group is None:
            return samples, raise_first(await self.batcher.submit(tenant, samples))
        return samples, raise_first(await self.assembler.submit(tenant, protocol, samples,
                                                                config))
