"""Per-run state for stateful advantage entries (difficulty anchors, UCB statistics).

State is keyed by tenant and ``run_id`` and, inside a run, by the entry that owns it. Two
stores share the interface: :class:`MemoryRunStore` in the API process (embedded use) and
:class:`RedisRunStore`, shared by every API pod (``REWARDD_STATE_URL`` or the broker). Every
run expires ``ttl_s`` after its last write, and ``DELETE /v1/runs/{run_id}`` resets it at once.

Tenants never see each other's runs: the routes hand the pipeline
``store.for_tenant(tenant)``, a view whose run ids are namespaced by the tenant, so two teams
that both name their run ``run-1`` keep separate state.
"""

from __future__ import annotations

import abc
import copy
import threading
import time
from typing import Any

import orjson


class RunStore(abc.ABC):
    """Where run state lives. Values are JSON-ready dicts."""

    @abc.abstractmethod
    def get(self, run_id: str, key: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def put(self, run_id: str, key: str, value: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def view(self, run_id: str) -> dict[str, dict[str, Any]] | None:
        """Everything stored for the run, or None when it has no state."""

    @abc.abstractmethod
    def reset(self, run_id: str) -> bool:
        """Forget the run; True if it had state."""

    def scope(self, run_id: str) -> RunScope:
        return RunScope(self, run_id)

    def for_tenant(self, tenant: str) -> RunStore:
        """This store as ``tenant`` sees it."""
        return TenantRuns(self, tenant)


class TenantRuns(RunStore):
    """One tenant's view of a store: its run ids live in a namespace of their own. Run ids
    are :data:`~rewardd.service.models.Name` strings (no ``/``), so ``tenant/run`` cannot collide."""

    def __init__(self, store: RunStore, tenant: str) -> None:
        self.store = store
        self.tenant = tenant

    def _id(self, run_id: str) -> str:
        return f"{self.tenant}/{run_id}"

    def get(self, run_id: str, key: str) -> dict[str, Any] | None:
        return self.store.get(self._id(run_id), key)

    def put(self, run_id: str, key: str, value: dict[str, Any]) -> None:
        self.store.put(self._id(run_id), key, value)

    def view(self, run_id: str) -> dict[str, dict[str, Any]] | None:
        return self.store.view(self._id(run_id))

    def reset(self, run_id: str) -> bool:
        return self.store.reset(self._id(run_id))

    def for_tenant(self, tenant: str) -> RunStore:
        return TenantRuns(self.store, tenant)


class RunScope:
    """The state of one run, as the entries of one request see it.

    Writes are buffered and reach the store only on :meth:`commit`, which the pipeline calls
    once the response is complete: a request that fails (a 422 found late) leaves the run's
    state as it was.
    """

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self._pending: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        if key in self._pending:
            return copy.deepcopy(self._pending[key])
        return self.store.get(self.run_id, key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._pending[key] = copy.deepcopy(value)

    def commit(self) -> None:
        for key, value in self._pending.items():
            self.store.put(self.run_id, key, value)
        self._pending.clear()


class MemoryRunStore(RunStore):
    """Run state in this process (embedded mode), with a time-to-live per run."""

    def __init__(self, ttl_s: float = 7 * 24 * 3600) -> None:
        self.ttl_s = ttl_s
        self._runs: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def _live(self, run_id: str) -> dict[str, dict[str, Any]] | None:
        entry = self._runs.get(run_id)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            del self._runs[run_id]
            return None
        return entry[1]

    def get(self, run_id: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            run = self._live(run_id)
            return copy.deepcopy(run.get(key)) if run else None

    def put(self, run_id: str, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            run = self._live(run_id) or {}
            run[key] = copy.deepcopy(value)
            self._runs[run_id] = (time.monotonic() + self.ttl_s, run)

    def view(self, run_id: str) -> dict[str, dict[str, Any]] | None:
        with self._lock:
            run = self._live(run_id)
            return copy.deepcopy(run) if run is not None else None

    def reset(self, run_id: str) -> bool:
        with self._lock:
            return self._runs.pop(run_id, None) is not None


class RedisRunStore(RunStore):
    """Run state in Redis: one hash per run (field: the owning entry, value: its JSON), shared
    by every API pod, so a trainer's requests may land on any pod. Each write renews the
    run's expiry. Called from worker threads (the advantage step runs off the event loop),
    hence the blocking client."""

    PREFIX = "rewardd:run:"

    def __init__(self, client: Any, ttl_s: float = 7 * 24 * 3600) -> None:
        self.client = client
        self.ttl_s = max(1, int(ttl_s))

    def _key(self, run_id: str) -> str:
        return self.PREFIX + run_id

    def get(self, run_id: str, key: str) -> dict[str, Any] | None:
        raw = self.client.hget(self._key(run_id), key)
        return orjson.loads(raw) if raw is not None else None

    def put(self, run_id: str, key: str, value: dict[str, Any]) -> None:
        with self.client.pipeline() as pipe:
            pipe.hset(self._key(run_id), key, orjson.dumps(value))
            pipe.expire(self._key(run_id), self.ttl_s)
            pipe.execute()

    def view(self, run_id: str) -> dict[str, dict[str, Any]] | None:
        raw = self.client.hgetall(self._key(run_id))
        if not raw:
            return None
        return {k.decode(): orjson.loads(v) for k, v in raw.items()}

    def reset(self, run_id: str) -> bool:
        return bool(self.client.delete(self._key(run_id)))
