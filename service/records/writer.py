"""Writing the record off the request path: :class:`RecordWriter`.

A request hands its rollouts to :meth:`RecordWriter.submit` and goes on (an append under a
lock); one thread drains the queue into the store in batches. The queue is bounded
(REWARDD_RECORD_QUEUE rollouts): when the database cannot keep up, or is down, what does not
fit is dropped and counted (``rewardd_records_dropped_total{reason}``), so recording never
slows or fails scoring and never grows the API's memory without bound. What was accepted is
kept while the database is down (retried with backoff) and written when it is back, in order.

The gap is reported, never silent: :meth:`RecordWriter.health` (for ``/readyz``'s detail)
says how many rollouts were dropped, how many wait, and since when writing fails; the same
numbers are metrics, with an alert rule on drops.

Why a thread and not the event loop: the database drivers block, and one writer per process
keeps the writes in order with one connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from rewardd.service.records.models import RolloutRecord
from rewardd.service.records.store import RecordStore, RolloutRow

log = logging.getLogger(__name__)

BATCH = 2000
"""Rollouts per transaction, at most: big enough that a scored batch of a few hundred
rollouts is one transaction (its fixed cost: the run's upsert, the commit, on PostgreSQL the
ids' round trip), small enough to keep one failed write cheap to retry."""
RETRY_MIN_S, RETRY_MAX_S = 0.2, 5.0

PRUNE_EVERY_S = 600.0
"""How often the writer applies retention (:attr:`RecordWriter.prune`) between writes."""

DropCounter = Callable[[str, int], None]
"""``count(reason, n)``: where the writer reports dropped rollouts (the metrics)."""


@dataclass(frozen=True, slots=True)
class WriterHealth:
    queued: int
    written: int
    dropped: int
    failing_since: float | None
    """time.time() of the first failed write of the current outage (None: writing works)."""
    last_error: str | None

    @property
    def ok(self) -> bool:
        return self.failing_since is None and self.dropped == 0


@dataclass(slots=True)
class _Pending:
    """Accepted rollouts not yet turned into records: ``build`` runs in the writer thread."""

    count: int
    build: Callable[[], Sequence[RolloutRecord | RolloutRow]]
    size: int = 0
    """Bytes it holds, as the submitter estimated them (completions mostly)."""
    owner: str | None = None
    """The tenant it was recorded for (None: no per-tenant bound)."""


class RecordWriter:
    """The bounded queue and the writer thread (see the module doc)."""

    def __init__(self, store: Callable[[], RecordStore], capacity: int,
                 count_dropped: DropCounter | None = None, batch: int = BATCH,
                 on_written: Callable[[int], None] | None = None,
                 prune: Callable[[RecordStore], int] | None = None,
                 capacity_bytes: int | None = None,
                 owner_capacity: int | None = None,
                 after_write: Callable[[RecordStore, Sequence[RolloutRecord | RolloutRow]],
                                       None] | None = None) -> None:
        self._open_store = store
        self._after_write = after_write
        """Called in this thread with what was just written (the sentinel looks at the runs
        it touched); its failures are logged, never retried."""
        """The store, opened on the first write (raises while the database is unreachable:
        handled as a failed write)."""
        self._on_written = on_written or (lambda n: None)
        self._prune = prune
        """Retention, run by this thread after a write at most every :data:`PRUNE_EVERY_S`
        (so it never competes with the writes, and a process that records nothing prunes
        nothing: another pod's writes prune the shared database)."""
        self._pruned_at = 0.0
        self.capacity = capacity
        self.capacity_bytes = capacity_bytes
        """Bound on the estimated bytes the queue holds (None: rollouts only): a queue of
        rollouts with long completions must not grow the API's memory without bound while
        the database is down."""
        self._queued_bytes = 0
        self.owner_capacity = owner_capacity
        """Rollouts one owner (tenant) may have waiting, at most: one tenant flooding a slow
        database must not crowd the others' records out of the queue."""
        self._queued_by: dict[str, int] = {}
        self.batch = batch
        self._count_dropped = count_dropped or (lambda reason, n: None)
        self._inbox: deque[_Pending] = deque()
        self._ready: list[RolloutRecord | RolloutRow] = []
        """Records built from the inbox, oldest first; only the writer thread touches it."""
        self._queued = 0
        """Rollouts accepted and not yet written (inbox and ready)."""
        self._lock = threading.Condition()
        self._closing = False
        self._stop = threading.Event()
        self._in_flight = 0
        """Rollouts being written now (they leave the queue once stored)."""
        self._written = 0
        self._dropped = 0
        self._failing_since: float | None = None
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="rewardd-record-writer",
                                        daemon=True)
        self._thread.start()

    def submit(self, records: Sequence[RolloutRecord]) -> int:
        """Queue ``records`` for writing; returns how many were accepted (the rest were
        dropped and counted: the queue is full or the writer closed). Never blocks on the
        database."""
        with self._lock:
            room = 0 if self._closing else max(self.capacity - self._queued, 0)
            accepted = list(records[:room])
            if accepted:
                self._accept(_Pending(len(accepted), lambda: accepted))
        self._drop(len(records) - len(accepted))
        return len(accepted)

    def submit_batch(self, count: int,
                     build: Callable[[], Sequence[RolloutRecord | RolloutRow]],
                     size: int = 0, owner: str | None = None) -> int:
        """Queue ``count`` rollouts (about ``size`` bytes) whose records ``build`` makes
        later, in the writer thread (the request pays an append, not the records). All or
        none: a batch that does not fit is dropped and counted whole. Returns how many were
        accepted. ``owner``'s waiting rollouts are bounded by :attr:`owner_capacity` (dropped
        as ``tenant_full``) before the shared bounds apply."""
        reason = None
        with self._lock:
            if (owner is not None and self.owner_capacity is not None and not self._closing
                    and self._queued_by.get(owner, 0) + count > self.owner_capacity):
                reason = "tenant_full"
            fits = (reason is None and not self._closing
                    and self._queued + count <= self.capacity
                    and (self.capacity_bytes is None
                         or self._queued_bytes + size <= self.capacity_bytes))
            if fits and count:
                self._accept(_Pending(count, build, size, owner))
        if not fits:
            self._drop(count, reason)
        return count if fits else 0

    def _accept(self, pending: _Pending) -> None:
        self._inbox.append(pending)
        self._queued += pending.count
        self._queued_bytes += pending.size
        if pending.owner is not None:
            self._queued_by[pending.owner] = self._queued_by.get(pending.owner, 0) + pending.count
        self._lock.notify()

    def _drop(self, count: int, reason: str | None = None) -> None:
        if count <= 0:
            return
        with self._lock:
            self._dropped += count
            reason = reason or ("closed" if self._closing else "queue_full")
        self._count_dropped(reason, count)

    def health(self) -> WriterHealth:
        with self._lock:
            return WriterHealth(self._queued, self._written, self._dropped,
                                self._failing_since, self._last_error)

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued is written (True) or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._queued:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (for up to ``timeout_s``), then stop; what is left is
        dropped and counted."""
        self.flush(timeout_s)
        with self._lock:
            self._closing = True
            self._stop.set()
            left = self._queued - self._in_flight
            self._inbox.clear()
            self._queued_bytes = 0
            self._queued_by.clear()
            self._queued = self._in_flight
            self._lock.notify_all()
        self._drop(left, "closed")
        self._thread.join(timeout_s)

    def _maybe_prune(self) -> None:
        now = time.monotonic()
        if self._prune is None or now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        try:
            deleted = self._prune(self._open_store())
        except Exception:
            log.exception("applying the run record's retention failed; retrying in %g s",
                          PRUNE_EVERY_S)
            return
        if deleted:
            log.info("retention deleted %d recorded rollouts", deleted)

    def _fill(self) -> None:
        """In the writer thread: build records from the inbox until a batch is ready."""
        while len(self._ready) < self.batch:
            with self._lock:
                if not self._inbox:
                    return
                pending = self._inbox.popleft()
                self._queued_bytes -= pending.size  # built: the request's objects are freed
                if pending.owner is not None:
                    left = self._queued_by.pop(pending.owner) - pending.count
                    if left:
                        self._queued_by[pending.owner] = left
            try:
                records = list(pending.build())
            except Exception:  # a recording bug: its rollouts are lost, the rest go on
                log.exception("could not turn a scored batch into records")
                records = []
            if len(records) != pending.count:
                with self._lock:
                    self._queued -= pending.count - len(records)
                    self._lock.notify_all()
                if len(records) < pending.count:
                    self._drop(pending.count - len(records), "error")
            self._ready.extend(records)

    def _run(self) -> None:
        retry_s = RETRY_MIN_S
        while True:
            with self._lock:
                while not self._inbox and not self._ready and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
            self._fill()
            batch = self._ready[:self.batch]
            if not batch:
                continue
            with self._lock:
                self._in_flight = len(batch)
            try:
                self._open_store().write(batch)
            except Exception as exc:
                with self._lock:
                    self._in_flight = 0
                    if self._failing_since is None:
                        log.warning("the run record cannot be written (%s: %s); scoring goes "
                                    "on, up to %d rollouts wait for the database",
                                    type(exc).__name__, exc, self.capacity)
                        self._failing_since = time.time()
                    self._last_error = f"{type(exc).__name__}: {exc}"
                    self._lock.notify_all()
                if self._stop.wait(retry_s):  # woken early only by close()
                    return
                retry_s = min(retry_s * 2, RETRY_MAX_S)
                continue
            retry_s = RETRY_MIN_S
            if self._after_write is not None:  # before the rollouts leave the queue: a
                try:                             # flush() waits for it too
                    self._after_write(self._open_store(), batch)
                except Exception:
                    log.exception("looking at what the record just wrote failed")
            del self._ready[:len(batch)]
            with self._lock:
                self._queued -= len(batch)
                self._written += len(batch)
                self._in_flight = 0
                if self._failing_since is not None:
                    log.warning("the run record is written again")
                self._failing_since = None
                self._last_error = None
                self._lock.notify_all()
            self._on_written(len(batch))
            self._maybe_prune()
