"""Per-run state for stateful advantage entries (difficulty anchors, UCB statistics).

State is keyed by ``run_id`` and, inside a run, by the entry that owns it. This module holds
the interface and the in-memory store the embedded mode uses; the distributed executor backs
the same interface with Redis. Every run expires ``ttl_s`` after its last write, and
``DELETE /v1/runs/{run_id}`` resets it at once.
"""

from __future__ import annotations

import abc
import copy
import threading
import time
from typing import Any


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
