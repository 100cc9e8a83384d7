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
are what occupy workers). A flow with calls waiting has a start tag ``S`` for its next call:
``S = max(V, F)`` when it starts waiting, ``F`` the finish tag of its last dispatched call;
the queue dispatches the head of the flow with the smallest ``S`` (ties: the earlier
arrival), the virtual time ``V`` becomes that ``S``, and the flow's next ``S`` is
``F = S + cost``. A flow that has been waiting gets no credit for its idleness (``S >= V``),
and a flow that sent a lot is charged for it (``F`` runs ahead), so a late small flow starts
before the backlog's remainder, after at most ``capacity`` calls that were already admitted.
Only the flows' heads sit in a heap: O(log flows) per call. A flow's ``F`` is kept while it
has a call waiting or running (its running calls are still charged to it) and forgotten with
its last call, so the queue holds no state of finished requests; a flow that returns competes
from ``V`` like a new one. (Tags are given when a call reaches its flow's head rather than
on arrival, which orders the flows exactly as tagging on arrival would, and lets a flow
choose which of its calls goes next.)

Urgent calls (:func:`flow` ``urgent``). Within a flow, its urgent calls go before its other
calls, whenever they arrived, and take the flow's calls of their ``group`` (:func:`flow`)
still waiting with them: a streaming session's checks that complete a group are what that
group's event waits on, with its earlier checks still waiting, while the session's other
checks only feed groups still filling. They are charged to the flow like any call, so a flow
gets no more of the pool by marking calls urgent: the priority reorders a flow's own share,
never another flow's. An urgent call that names no group waits as any other: without the
group its earlier calls cannot go with it, and putting a group's last call alone first only
delays the other groups' earlier calls (bench_stream.py --compare, seed 1, pool 8: p99 group
delay 460 ms against 300 ms without urgency; 60 ms with the group's calls promoted).

Capacity. At most ``capacity`` calls are *running* (handed to the backend and not released),
or, with ``by_cost`` or explicit ``units``, calls of at most ``capacity`` units together (a
call bigger than the whole capacity still runs, alone); the others wait here. Whatever the
units, ``floor`` calls may always run (the embedded executor's units are estimated seconds of
checks, and its ``floor`` is its workers: a worker never idles while calls wait, whatever
their size). The head of the order is never skipped for a cheaper call that would fit, so
the order above holds. The caller hands over what :meth:`FairQueue.submit`,
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
    """Who a call is for: one request or job (``id``), and its tenant (reporting only).
    ``urgent`` and ``group``: how the call ranks within its flow (see :func:`flow`)."""

    id: str
    tenant: str | None = None
    urgent: bool = False
    group: str | None = None


DEFAULT_FLOW = Flow("default")
"""The flow of calls made with no flow set (the CLI, tests, a library user): one flow."""

_CURRENT: contextvars.ContextVar[Flow | None] = contextvars.ContextVar("rewardd_flow",
                                                                        default=None)


def current_flow() -> Flow:
    """The flow of the running request (the service sets it), else :data:`DEFAULT_FLOW`."""
    return _CURRENT.get() or DEFAULT_FLOW


@contextlib.contextmanager
def flow(tenant: str | None = None, flow_id: str | None = None,
         urgent: bool = False, group: str | None = None) -> Iterator[Flow]:
    """Make the calls of the block one flow (``flow_id``, else a new unique id), for tenant
    ``tenant``. A context variable: tasks the block starts inherit it.

    ``group``: which group of the flow the calls are for (a session's group id, on every
    check of the group). ``urgent``: calls that something already complete waits on (a
    streaming session's group whose last rollouts these are, or its group-level checks): with
    a ``group``, they and the flow's calls of that group still waiting go before the flow's
    other calls, charged to the flow as usual (module docstring); without one, nothing."""
    current = Flow(flow_id or uuid.uuid4().hex, tenant, urgent, group)
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)


WAITING, RUNNING, DONE = "waiting", "running", "done"


@dataclass(eq=False, slots=True)
class Ticket(Generic[T]):
    """One call in the queue: ``item`` is the caller's (a call, a pack), ``state`` one of
    waiting, running, done; ``units`` what it takes of the capacity; ``start`` the start tag
    it was dispatched with; ``urgent`` whether it waits (waited) among its flow's urgent
    calls (it arrived urgent, or was promoted)."""

    item: T
    flow: Flow
    cost: int
    units: float
    seq: int
    start: float = 0.0
    urgent: bool = False
    state: str = WAITING


@dataclass(slots=True)
class _FlowQueue:
    """One flow's waiting calls: its urgent ones first, then the others, each oldest first
    (dicts by arrival number: O(1) removal on cancel and promotion)."""

    tag: float = 0.0
    """Start tag of the flow's head (the next call it dispatches, whichever that is)."""
    urgent: dict[int, Ticket[Any]] = field(default_factory=dict)
    bulk: dict[int, Ticket[Any]] = field(default_factory=dict)
    groups: dict[str, dict[int, Ticket[Any]]] = field(default_factory=dict)
    """The waiting calls of ``bulk`` that name a group, by group: what a promotion moves."""

    def head(self) -> Ticket[Any] | None:
        for tickets in (self.urgent, self.bulk):
            if tickets:
                return next(iter(tickets.values()))
        return None

    def remove(self, ticket: Ticket[Any]) -> None:
        if ticket.urgent:
            del self.urgent[ticket.seq]
            return
        del self.bulk[ticket.seq]
        group = ticket.flow.group
        if group is not None:
            members = self.groups[group]
            del members[ticket.seq]
            if not members:
                del self.groups[group]

    def promote(self, group: str) -> None:
        """The group's waiting calls join the urgent ones (in their arrival order)."""
        for ticket in self.groups.pop(group, {}).values():
            del self.bulk[ticket.seq]
            ticket.urgent = True
            self.urgent[ticket.seq] = ticket

    def tickets(self) -> list[Ticket[Any]]:
        return [*self.urgent.values(), *self.bulk.values()]


class QueueClosed(Exception):
    """The queue was closed: the executor is shutting down."""


class FairQueue(Generic[T]):
    """Start-time fair queue of calls with at most ``capacity`` running (0: no bound, every
    call runs at once, the executors' behaviour before this queue). See the module docstring."""

    def __init__(self, capacity: float = 0, by_cost: bool = False, floor: int = 0) -> None:
        if capacity < 0 or floor < 0:
            raise ValueError(f"capacity and floor must be >= 0, got {capacity}, {floor}")
        self.capacity = capacity
        self.by_cost = by_cost
        self.floor = floor
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._vtime = 0.0
        self._finish: dict[str, float] = {}
        self._active: dict[str, int] = {}
        """Calls waiting or running per flow: a flow's tag is forgotten with its last."""
        self._flows: dict[str, _FlowQueue] = {}
        """Flows with calls waiting."""
        self._heads: list[tuple[float, int, str]] = []
        """(start tag, arrival number of the flow's head, flow id); an entry whose flow's
        head or tag changed since is stale and skipped."""
        self._waiting = 0
        self._running = 0
        self._in_use: float = 0
        """Of the capacity: running calls, or their units."""
        self._closed = False

    # ---- the caller's side -------------------------------------------------------------

    def submit(self, flow_: Flow, cost: int, item: T,
               units: float | None = None) -> tuple[Ticket[T], list[Ticket[T]]]:
        """Queue ``item`` for ``flow_`` at ``cost`` (>= 1 counted), taking ``units`` of the
        capacity while it runs (default: its cost with ``by_cost``, else 1); returns its
        ticket and the tickets now running (possibly this one) for the caller to start.
        Raises :class:`QueueClosed` after :meth:`close`."""
        cost = max(cost, 1)
        with self._lock:
            if self._closed:
                raise QueueClosed("the fair queue is closed")
            if units is None:
                units = cost if self.by_cost else 1
            ticket: Ticket[T] = Ticket(item, flow_, cost, units, next(self._seq),
                                       urgent=flow_.urgent and flow_.group is not None)
            self._active[flow_.id] = self._active.get(flow_.id, 0) + 1
            queue = self._flows.get(flow_.id)
            if queue is None:  # the flow starts waiting: S = max(V, F)
                queue = self._flows[flow_.id] = _FlowQueue(
                    max(self._vtime, self._finish.get(flow_.id, 0.0)))
            head = queue.head()
            if ticket.urgent:
                queue.promote(flow_.group)
                queue.urgent[ticket.seq] = ticket
            else:
                queue.bulk[ticket.seq] = ticket
                if flow_.group is not None:
                    queue.groups.setdefault(flow_.group, {})[ticket.seq] = ticket
            if queue.head() is not head:
                self._push_head(flow_.id)
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
            self._in_use = self._in_use - ticket.units if self._running else 0
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
            was_head = queue.head() is ticket
            queue.remove(ticket)
            self._waiting -= 1
            if was_head:  # its successor inherits the tag: the cancelled call cost nothing
                self._push_head(ticket.flow.id)
            self._inactive(ticket.flow.id)
            if not self._waiting:
                self._heads.clear()  # only stale entries are left
            return True

    def set_capacity(self, capacity: float) -> list[Ticket[T]]:
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
            dropped = [t for queue in self._flows.values() for t in queue.tickets()]
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
            return {"waiting_calls": self._waiting, "waiting_flows": len(self._flows),
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
        while self._heads:
            bounded = self.capacity and self._running >= self.floor
            if bounded and self._in_use >= self.capacity:
                break
            start, seq, flow_id = self._heads[0]
            queue = self._flows.get(flow_id)
            ticket = queue.head() if queue is not None else None
            if ticket is None or ticket.seq != seq or queue.tag != start:
                heapq.heappop(self._heads)
                continue  # stale: the flow's head or tag changed since
            if bounded and self._running and self._in_use + ticket.units > self.capacity:
                break  # the next call does not fit yet (never skipped for a smaller one)
            heapq.heappop(self._heads)
            queue.remove(ticket)
            ticket.state, ticket.start = RUNNING, start
            self._vtime = start
            self._finish[flow_id] = queue.tag = start + ticket.cost
            self._waiting -= 1
            self._running += 1
            self._in_use += ticket.units
            admitted.append(ticket)
            self._push_head(flow_id)
        if not self._waiting:
            self._heads.clear()  # only stale entries are left
        return admitted

    def _push_head(self, flow_id: str) -> None:
        """Enter the flow's (new) head in the heap, or forget a flow with nothing waiting."""
        queue = self._flows[flow_id]
        head = queue.head()
        if head is not None:
            heapq.heappush(self._heads, (queue.tag, head.seq, flow_id))
        else:
            del self._flows[flow_id]

    def _inactive(self, flow_id: str) -> None:
        """One call of the flow is done: forget the flow with its last call."""
        left = self._active[flow_id] - 1
        if left:
            self._active[flow_id] = left
        else:
            del self._active[flow_id]
            self._finish.pop(flow_id, None)
