"""Per-request fair scheduling of verifier calls: a fair queue in front of each backend.

Without it both executors hand every call to their backend first come, first served (pebble's
task queue, a Redis list per Celery queue), so one valid request just under the bounds
(65,536 rollouts) makes every other tenant's small request wait behind all of it.

Who gets a share. A *flow* is one request (one ``/v1/score``, ``/v1/rewards`` or ``/v1/verify``
request, or one job); every flow waiting for workers gets an equal share of them, whatever its
size. Flows, not tenants: the promise is "one hostile request never hurts another tenant", and
under request fairness one huge request gets one share, the same as one small request, so a
trainer's small batch starts after at most the calls already running, never behind the huge
batch's remainder. A tenant cannot buy shares without limit by sending many requests: its
flows are bounded by its concurrency slots (``service/limits.py``, ``max_concurrent_jobs``),
so per-tenant fairness would add a second level for a bounded gain. The tenant's name rides
along with the flow for reporting only.

How (start-time fair queuing, Goyal et al. 1996). Each call has a cost (its samples: checks
are what occupy workers). A flow keeps the finish tag ``F`` of its last queued call; a call
arriving gets the start tag ``S = max(V, F)`` and moves ``F`` to ``S + cost``; the queue
dispatches the waiting call with the smallest start tag (ties: the earlier arrival), and the
virtual time ``V`` becomes that call's start tag. A flow that has been waiting gets no credit
for its idleness (``S >= V``), and a flow that sent a lot is charged for it (``F`` runs
ahead), so a late small flow starts before the backlog's remainder, after at most
``capacity`` calls that were already admitted. Within a flow the start tags never decrease,
so each flow is a FIFO and only the flows' heads sit in a heap: O(log flows) per call. A
flow's tag is kept while it has a call waiting or running (its running calls are still
charged to it) and forgotten with its last call, so the queue holds no state of finished
requests; a flow that returns competes from ``V`` like a new one.

Capacity. At most ``capacity`` calls are *running* (handed to the backend and not released),
or, with ``by_cost``, calls of at most ``capacity`` cost together (a call costlier than the
whole capacity still runs, alone); the others wait here. The head of the order is never
skipped for a cheaper call that would fit, so the order above holds. The caller hands over what :meth:`FairQueue.submit`,
:meth:`FairQueue.release` and :meth:`FairQueue.set_capacity` return (tickets now running) to
the backend, outside the queue's lock. Every running ticket is released exactly once
(:meth:`FairQueue.release` ignores a ticket that is not running), and a waiting one the caller
no longer wants is dropped at once by :meth:`FairQueue.cancel`. Thread-safe: the embedded
executor releases from pebble's result thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Generic, Iterator, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Flow:
    """Who a call is for: one request or job (``id``), and its tenant (reporting only)."""

    id: str
    tenant: str | None = None


DEFAULT_FLOW = Flow("default")
"""The flow of calls made with no flow set (the CLI, tests, a library user): one flow."""

_CURRENT: contextvars.ContextVar[Flow | None] = contextvars.ContextVar("rewardd_flow",
                                                                        default=None)


def current_flow() -> Flow:
    """The flow of the running request (the service sets it), else :data:`DEFAULT_FLOW`."""
    return _CURRENT.get() or DEFAULT_FLOW


@contextlib.contextmanager
def flow(tenant: str | None = None, flow_id: str | None = None,
         urgent: bool = False) -> Iterator[Flow]:
    """Make the calls of the block one flow (``flow_id``, else a new unique id), for tenant
    ``tenant``. A context variable: tasks the block starts inherit it.

    ``urgent``: calls that something already complete waits on alone (a streaming session's
    group whose last rollouts these are). They form the flow's own urgent sub-flow, which
    competes with its bulk as another flow would, so they do not wait behind the flow's
    backlog."""
    fid = flow_id or uuid.uuid4().hex
    current = Flow(f"{fid}!urgent" if urgent else fid, tenant)
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)


WAITING, RUNNING, DONE = "waiting", "running", "done"


@dataclass(eq=False, slots=True)
class Ticket(Generic[T]):
    """One call in the queue: ``item`` is the caller's (a call, a pack), ``state`` one of
    waiting, running, done."""

    item: T
    flow: Flow
    cost: int
    start: float
    seq: int
    state: str = WAITING


@dataclass(slots=True)
class _FlowQueue:
    tickets: dict[int, Ticket[Any]] = field(default_factory=dict)
    """Waiting tickets by arrival number, oldest first (a dict: O(1) removal on cancel)."""


class QueueClosed(Exception):
    """The queue was closed: the executor is shutting down."""


class FairQueue(Generic[T]):
    """Start-time fair queue of calls with at most ``capacity`` running (0: no bound, every
    call runs at once, the executors' behaviour before this queue). See the module docstring."""

    def __init__(self, capacity: int = 0, by_cost: bool = False) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.by_cost = by_cost
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._vtime = 0.0
        self._finish: dict[str, float] = {}
        self._active: dict[str, int] = {}
        """Calls waiting or running per flow: a flow's tag is forgotten with its last."""
        self._flows: dict[str, _FlowQueue] = {}
        self._heads: list[tuple[float, int, str]] = []
        self._waiting = 0
        self._running = 0
        self._in_use = 0
        """Of the capacity: running calls, or their cost with ``by_cost``."""
        self._closed = False

    # ---- the caller's side -------------------------------------------------------------

    def submit(self, flow_: Flow, cost: int, item: T) -> tuple[Ticket[T], list[Ticket[T]]]:
        """Queue ``item`` for ``flow_`` at ``cost`` (>= 1 counted); returns its ticket and the
        tickets now running (possibly this one) for the caller to start. Raises
        :class:`QueueClosed` after :meth:`close`."""
        with self._lock:
            if self._closed:
                raise QueueClosed("the fair queue is closed")
            start = max(self._vtime, self._finish.get(flow_.id, 0.0))
            self._finish[flow_.id] = start + max(cost, 1)
            self._active[flow_.id] = self._active.get(flow_.id, 0) + 1
            ticket: Ticket[T] = Ticket(item, flow_, max(cost, 1), start, next(self._seq))
            queue = self._flows.get(flow_.id)
            if queue is None:
                queue = self._flows[flow_.id] = _FlowQueue()
            if not queue.tickets:
                heapq.heappush(self._heads, (start, ticket.seq, flow_.id))
            queue.tickets[ticket.seq] = ticket
            self._waiting += 1
            return ticket, self._admit()

    def release(self, ticket: Ticket[T]) -> list[Ticket[T]]:
        """The running ``ticket`` finished (any way): free its place; returns the tickets now
        running. Idempotent: a ticket that is not running frees nothing."""
        with self._lock:
            if ticket.state != RUNNING:
                return []
            ticket.state = DONE
            self._running -= 1
            self._in_use -= self._units(ticket)
            self._inactive(ticket.flow.id)
            return self._admit()

    def cancel(self, ticket: Ticket[T]) -> bool:
        """Drop a waiting ticket (its caller gave up). True when it was waiting; False when
        it is running (release it) or already done."""
        with self._lock:
            if ticket.state != WAITING:
                return False
            ticket.state = DONE
            queue = self._flows[ticket.flow.id]
            head = next(iter(queue.tickets)) == ticket.seq
            del queue.tickets[ticket.seq]
            self._waiting -= 1
            if head:
                self._push_head(ticket.flow.id)
            self._inactive(ticket.flow.id)
            if not self._waiting:
                self._heads.clear()  # only stale entries are left
            return True

    def set_capacity(self, capacity: int) -> list[Ticket[T]]:
        """Change the bound (a new worker census); returns the tickets now running."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        with self._lock:
            self.capacity = capacity
            return self._admit()

    def close(self) -> list[Ticket[T]]:
        """Refuse new calls and return the waiting tickets (now done) for the caller to
        settle (``unavailable``). Running ones are the backend's to settle and release."""
        with self._lock:
            self._closed = True
            dropped = [t for queue in self._flows.values() for t in queue.tickets.values()]
            for ticket in dropped:
                ticket.state = DONE
            self._flows.clear()
            self._heads.clear()
            for ticket in dropped:
                self._inactive(ticket.flow.id)
            self._waiting = 0
            return dropped

    def stats(self) -> dict[str, Any]:
        """What /readyz reports: calls and flows waiting, calls running, the bound."""
        with self._lock:
            return {"waiting_calls": self._waiting,
                    "waiting_flows": sum(1 for q in self._flows.values() if q.tickets),
                    "running_calls": self._running, "in_use": self._in_use,
                    "capacity": self.capacity}

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return self._running

    # ---- under the lock ------------------------------------------------------------------

    def _admit(self) -> list[Ticket[T]]:
        admitted: list[Ticket[T]] = []
        while self._heads and (self.capacity == 0 or self._in_use < self.capacity):
            start, seq, flow_id = self._heads[0]
            queue = self._flows.get(flow_id)
            if queue is None or not queue.tickets or next(iter(queue.tickets)) != seq:
                heapq.heappop(self._heads)
                continue  # stale: the head was cancelled and its successor pushed
            ticket = queue.tickets[seq]
            units = self._units(ticket)
            if self.capacity and self._in_use and self._in_use + units > self.capacity:
                break  # the next call does not fit yet (never skipped for a smaller one)
            heapq.heappop(self._heads)
            del queue.tickets[seq]
            ticket.state = RUNNING
            self._vtime = start
            self._waiting -= 1
            self._running += 1
            self._in_use += units
            admitted.append(ticket)
            self._push_head(flow_id)
        if not self._waiting:
            self._heads.clear()  # only stale entries are left
        return admitted

    def _units(self, ticket: Ticket[Any]) -> int:
        return ticket.cost if self.by_cost else 1

    def _push_head(self, flow_id: str) -> None:
        queue = self._flows[flow_id]
        if queue.tickets:
            head = next(iter(queue.tickets.values()))
            heapq.heappush(self._heads, (head.start, head.seq, flow_id))
        else:
            del self._flows[flow_id]

    def _inactive(self, flow_id: str) -> None:
        """One call of the flow is done: forget the flow with its last call."""
        left = self._active[flow_id] - 1
        if left:
            self._active[flow_id] = left
        else:
            del self._active[flow_id]
            del self._finish[flow_id]
