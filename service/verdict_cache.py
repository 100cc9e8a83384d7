"""The verdict cache: a check answered from an earlier one with exactly the same inputs.

RL revisits its prompts every epoch, and a policy that has converged writes the same short
answers and the same programs again and again; each repeat costs a verifier call (a sandbox
run, a judge call). The cache's key is everything a verdict may depend on
(:meth:`rewardd.verifiers.receipts.CallStamp.cache_key`: verifier revision, effective
parameters, reference, group context, prompt, completion, token count), so a hit is the
verdict the verifier would give again, and results with the cache are bit-identical to
results without it (``tests/unit/test_verdict_cache.py`` checks it on math and code).

Two layers: an LRU per tenant in the API process under one bound
(``REWARDD_VERDICT_CACHE_ENTRIES``; a full cache evicts from the tenant holding the most, so
one tenant cannot flush another's verdicts: :class:`LocalVerdicts`), and in
distributed mode Redis beside it (``REWARDD_VERDICT_CACHE_TTL_S``), shared by every API pod.
Keys are per tenant: a hit would otherwise tell one tenant that another checked the same
completion. Only successful verdicts are kept (a timeout or an unavailable sandbox is
about that moment, not about the completion), and a judge's only when it samples
repeatably. Redis trouble never fails a check: the cache is then a miss, and said in the
log once.

Hand-written because the layers are ~100 lines over an OrderedDict and two Redis commands
(MGET, SET EX in one pipeline); a caching library would add a dependency for less.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import orjson

from rewardd.service.settings import Settings
from rewardd.verifiers.base import Outcome

if TYPE_CHECKING:
    import redis.asyncio

log = logging.getLogger(__name__)

REDIS_PREFIX = "rewardd:verdict:"


class LocalVerdicts:
    """The process's verdicts, an LRU per tenant under one bound (thread-safe: jobs and
    requests share it).

    When the bound is reached, the entry evicted is the least recently used one of the
    tenant holding the most entries: one tenant flooding the cache evicts its own verdicts
    once it holds the largest share, never a quieter tenant's (which keep at least an even
    share of the bound); with one tenant it is a plain LRU."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._tenants: dict[str, OrderedDict[str, Outcome]] = {}
        self._size = 0
        self._lock = threading.Lock()

    def get_many(self, tenant: str, keys: Sequence[str]) -> list[Outcome | None]:
        with self._lock:
            items = self._tenants.get(tenant)
            if items is None:
                return [None] * len(keys)
            found = []
            for key in keys:
                outcome = items.get(key)
                if outcome is not None:
                    items.move_to_end(key)
                found.append(outcome)
            return found

    def put_many(self, tenant: str, items: Sequence[tuple[str, Outcome]]) -> None:
        if not items:
            return
        with self._lock:
            mine = self._tenants.setdefault(tenant, OrderedDict())
            for key, outcome in items:
                if key not in mine:
                    self._size += 1
                mine[key] = outcome
                mine.move_to_end(key)
            while self._size > self._entries:
                largest = max(self._tenants, key=lambda name: len(self._tenants[name]))
                bucket = self._tenants[largest]
                bucket.popitem(last=False)
                self._size -= 1
                if not bucket:
                    del self._tenants[largest]

    def held(self, tenant: str) -> int:
        """Entries ``tenant`` holds."""
        with self._lock:
            return len(self._tenants.get(tenant, ()))

    def __len__(self) -> int:
        return self._size


class SharedVerdicts:
    """Verdicts in Redis, shared by every API pod; any Redis error is a miss."""

    def __init__(self, client: redis.asyncio.Redis, ttl_s: float, max_bytes: int) -> None:
        self._client = client
        self._ttl_ms = max(int(ttl_s * 1000), 1)
        self._max_bytes = max_bytes
        self._warned = False

    async def get_many(self, keys: Sequence[str]) -> list[Outcome | None]:
        try:
            values = await self._client.mget([REDIS_PREFIX + key for key in keys])
        except Exception as exc:  # the cache is an optimisation: never a failed check
            self._warn(exc)
            return [None] * len(keys)
        return [Outcome.from_dict(orjson.loads(v)) if v is not None else None for v in values]

    async def put_many(self, items: Sequence[tuple[str, Outcome]]) -> None:
        payloads = [(key, orjson.dumps(outcome.to_dict())) for key, outcome in items]
        payloads = [(key, data) for key, data in payloads if len(data) <= self._max_bytes]
        if not payloads:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, data in payloads:
                    pipe.set(REDIS_PREFIX + key, data, px=self._ttl_ms)
                await pipe.execute()
        except Exception as exc:
            self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("the shared verdict cache is unavailable (%s: %s): checks run "
                        "without it until Redis answers", type(exc).__name__, exc)


@dataclass(eq=False)
class VerdictCache:
    """The app's cache: the local layer, and the shared one in distributed mode."""

    local: LocalVerdicts
    shared: SharedVerdicts | None = None
    enabled: bool = True

    @classmethod
    def of(cls, settings: Settings, client: redis.asyncio.Redis | None) -> VerdictCache:
        shared = (SharedVerdicts(client, settings.verdict_cache_ttl_s,
                                 settings.verdict_cache_max_bytes)
                  if client is not None else None)
        return cls(LocalVerdicts(settings.verdict_cache_entries), shared,
                   settings.verdict_cache)

    def view(self, namespace: str, use: bool = True) -> CacheView:
        """One request's use of the cache (its tenant; ``use``: the request's ``cache``)."""
        return CacheView(self, namespace, self.enabled and use)

    async def get_many(self, tenant: str, keys: Sequence[str]) -> list[Outcome | None]:
        """``tenant``'s verdicts of ``keys`` (the shared layer's keys carry the tenant:
        :meth:`CacheView.key`)."""
        found = self.local.get_many(tenant, keys)
        if self.shared is None:
            return found
        missing = [i for i, outcome in enumerate(found) if outcome is None]
        if missing:
            remote = await self.shared.get_many([keys[i] for i in missing])
            back = [(keys[i], outcome) for i, outcome in zip(missing, remote) if outcome]
            for i, outcome in zip(missing, remote):
                found[i] = outcome
            self.local.put_many(tenant, back)
        return found

    async def put_many(self, tenant: str, items: Sequence[tuple[str, Outcome]]) -> None:
        self.local.put_many(tenant, items)
        if self.shared is not None:
            await self.shared.put_many(items)


@dataclass(eq=False)
class CacheView:
    """A request's window on the cache: its tenant's keys, and its own hit and miss
    counts (the response's ``diagnostics.cache``)."""

    cache: VerdictCache
    namespace: str
    enabled: bool
    hits: int = 0
    misses: int = 0

    def key(self, key: str) -> str:
        return f"{self.namespace}:{key}"

    async def get_many(self, keys: Sequence[str]) -> list[Outcome | None]:
        if not self.enabled or not keys:
            return [None] * len(keys)
        return await self.cache.get_many(self.namespace, [self.key(k) for k in keys])

    async def put_many(self, items: Sequence[tuple[str, Outcome]]) -> None:
        if self.enabled and items:
            await self.cache.put_many(self.namespace, [(self.key(k), outcome)
                                                       for k, outcome in items])

    def count(self, hits: int, misses: int) -> None:
        self.hits += hits
        self.misses += misses

    def diagnostics(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}


__all__ = ["CacheView", "LocalVerdicts", "SharedVerdicts", "VerdictCache"]
