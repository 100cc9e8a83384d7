"""The per-sample trainer protocols' entry: a request's samples scored alone or in groups.

The protocol routes (OpenRLHF, slime, NeMo-Gym) read their trainer's body into samples and
hand them here; which way they are scored is the server's configuration
(``REWARDD_COMPAT_CONFIG``), not the route's: without ``group``, with the other requests'
samples waiting at that moment (:mod:`.batching`); with it, each once its group is whole
(:mod:`.groups`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from rewardd.advantages.errors import Loc, RequestInvalid, error
from rewardd.service import heavy
from rewardd.service.budgets import Bound
from rewardd.service.compat.batching import Batcher
from rewardd.service.compat.config import CompatConfig, validated_compat_config
from rewardd.service.compat.groups import Assembler
from rewardd.service.compat.recording import NamedRun, record_samples
from rewardd.service.compat.samples import SampleIn
from rewardd.service.compat.scoring import SampleOut, compat_config, raise_first
from rewardd.service.runtime import Runtime
from rewardd.service.sessions import SessionManager
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant

SampleReader = Callable[[CompatConfig], Awaitable[list[SampleIn]]]
"""Reads a protocol request's samples under the server's compat configuration."""


@dataclass(frozen=True, slots=True)
class ParkedBounds:
    """What one tenant's per-sample requests may hold waiting in one API process."""

    requests: Bound
    samples: Bound

    @classmethod
    def of(cls, settings: Settings) -> ParkedBounds:
        return cls(Bound("parked per-sample requests", settings.compat_max_parked_requests,
                         "REWARDD_COMPAT_MAX_PARKED_REQUESTS"),
                   Bound("parked per-sample samples", settings.compat_max_parked_samples,
                         "REWARDD_COMPAT_MAX_PARKED_SAMPLES"))


class CompatScorer:
    """Per-sample protocol requests of one app: its batcher and its group assembler."""

    def __init__(self, runtime: Runtime, sessions: SessionManager) -> None:
        if runtime.settings.compat_config:  # a bad one stops the app's start, named
            validated_compat_config(runtime.settings)
        self._runtime = runtime
        self._bounds = ParkedBounds.of(runtime.settings)
        self.batcher = Batcher(runtime)
        self.assembler = Assembler(sessions)

    @property
    def config(self) -> CompatConfig:
        """The compat configuration (validated when the settings loaded)."""
        return compat_config(self._runtime.settings)

    async def score(self, tenant: Tenant, protocol: str, read: SampleReader,
                    where: Loc = ("body",), run: NamedRun | None = None
                    ) -> tuple[list[SampleIn], list[SampleOut]]:
        """Read a protocol request's samples and score them; the first failed sample's error
        is raised (a request answers one status). ``where`` is the field holding the
        samples (a 422 about their count names it). With ``run``, the answered samples are
        recorded under it (:mod:`.recording`); in group mode they join groups of that run
        only.

        Why no tenant slot while reading and waiting, unlike /v1/score: OpenRLHF posts every
        sample of a step on its own, hundreds at once, and retries a refusal five times a
        second apart before dropping the sample's reward; a 429 per sample past the tenant's
        limit on work in flight would lose rewards, and a sample waiting for its group while
        holding a slot would keep the rest of its group out. The scoring itself holds the
        tenant's slots (one per batch or group, waited for), so the tenant's limit on work in
        flight still holds. What waits is bounded per tenant and API process, checked before
        the work starts (:class:`~rewardd.service.budgets.TenantBudgets`, current use in
        ``rewardd_tenant_held``): the requests waiting (``REWARDD_COMPAT_MAX_PARKED_REQUESTS``,
        taken before the body is read) and their samples
        (``REWARDD_COMPAT_MAX_PARKED_SAMPLES``), a 429 naming the bound; a request that alone
        has more samples than one of its bounds can ever take is a 422 naming it (see
        :meth:`check_count`). A client that leaves takes its waiting samples back
        (:mod:`.batching`, :mod:`.groups`)."""
        config, budgets = self.config, self._runtime.budgets
        with budgets.hold(tenant.name, self._bounds.requests):
            samples = await read(config)
            self.check_count(len(samples), config, where)
            heavy.mark(heavy.heavy_rollouts(len(samples)))
            with budgets.hold(tenant.name, self._bounds.samples, len(samples)):
                if config.group is None:
                    outs = await self.batcher.submit(tenant, samples)
                else:
                    outs = await self.assembler.submit(tenant, protocol, samples, config,
                                                       run.run_id if run else None)
        answered = raise_first(outs)
        if run is not None and self._runtime.records.enabled:
            await self.record(tenant, run, samples, answered, config)
        return samples, answered

    async def record(self, tenant: Tenant, run: NamedRun, samples: list[SampleIn],
                     outs: list[SampleOut], config: CompatConfig) -> None:
        """Queue the request's samples for the record: on the event loop for a usual
        request (one sample: no thread hop), off it for a heavy one (O(samples))."""
        record = self._runtime.records.for_tenant(tenant.name)
        if heavy.is_heavy():
            await heavy.offload(record_samples, record, run, samples, outs, config)
        else:
            record_samples(record, run, samples, outs, config)

    def check_count(self, count: int, config: CompatConfig, where: Loc) -> None:
        """A 422 naming ``where`` and the setting when one request has more samples than a
        bound it must fit in whole: the per-request limits, the tenant's parked
        samples and, in group mode, the rollouts in flight a session add may reserve (a
        larger placement could never be taken and would wait forever)."""
        settings = self._runtime.settings
        caps = [(settings.compat_max_samples_per_request,
                 "REWARDD_COMPAT_MAX_SAMPLES_PER_REQUEST", "samples per request"),
                (settings.max_rollouts_per_request, "REWARDD_MAX_ROLLOUTS_PER_REQUEST",
                 "samples one request may send to the verifiers"),
                (self._bounds.samples.limit, self._bounds.samples.setting,
                 "samples one tenant may have waiting in this API process")]
        if config.group is not None:
            caps.append((settings.session_max_inflight, "REWARDD_SESSION_MAX_INFLIGHT",
                         "rollouts one tenant may have being checked (group mode)"))
        for limit, setting, what in caps:
            if count > limit:
                raise RequestInvalid([error(where, f"{count} samples in one request, over the "
                                            f"limit of {limit} {what} ({setting}); split the "
                                            "request", "too_many_samples")])
