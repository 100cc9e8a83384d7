"""Per-tenant budgets of what an API process holds on a tenant's behalf.

A shared server must bound every resource one tenant can make it hold, or one tenant takes
memory and CPU from all: open event streams and long polls, per-sample requests parked while
their group assembles, samples waiting for a batch. Each such bound is a :class:`Bound` (a
name for people, the limit, and the setting that sets it, so a refusal says whom to ask),
checked *before* the work starts; past it the caller gets :class:`~rewardd.service.errors.Busy`
(429 with ``Retry-After``) naming the bound, and nothing was taken.

:class:`TenantBudgets` counts holdings in this process, exactly: what it bounds lives in this
process (a stream is held by the pod that serves it; a parked request by the pod it reached),
so a per-pod bound is the bound on the memory and CPU that pod spends, and needs no round trip
to Redis on every hold. What lives in the shared store (stored sessions, their groups and
bytes) is counted by the store itself, across pods, and reported here with the same names.

The current use per tenant and bound is exported as ``rewardd_tenant_held{tenant,bound}``
(:func:`rewardd.service.metrics.register_budgets`), so an operator sees who is near a limit
before anyone is refused.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterator

from rewardd.service.errors import Busy


@dataclass(frozen=True, slots=True)
class Bound:
    """One per-tenant limit: ``limit`` units of ``name`` (e.g. "open event streams"),
    set by ``setting`` (e.g. ``REWARDD_TENANT_MAX_STREAMS``)."""

    name: str
    limit: int
    setting: str


class TenantBudgets:
    """Holdings per (tenant, bound) in this process; thread-safe (scrapes read it from a
    worker thread)."""

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        self._held: dict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()

    def take(self, tenant: str, bound: Bound, amount: int = 1) -> None:
        """Hold ``amount`` more units of ``bound`` for ``tenant``, or raise :class:`Busy`
        (nothing taken) when that would pass its limit."""
        key = (tenant, bound.name)
        with self._lock:
            held = self._held[key]
            if held + amount > bound.limit:
                raise Busy(f"tenant {tenant!r} would hold {held + amount} {bound.name} on this "
                           f"API process (the limit is {bound.limit}, {bound.setting}); "
                           "finish or close some first, or ask the operator to raise it",
                           tenant=tenant, retry_after_s=self.retry_after_s)
            self._held[key] = held + amount

    def give_back(self, tenant: str, bound: Bound, amount: int = 1) -> None:
        """Release what :meth:`take` held (never below zero)."""
        key = (tenant, bound.name)
        with self._lock:
            left = self._held[key] - amount
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)

    @contextlib.contextmanager
    def hold(self, tenant: str, bound: Bound, amount: int = 1) -> Iterator[None]:
        """:meth:`take` for the duration of the block, released however it ends."""
        self.take(tenant, bound, amount)
        try:
            yield
        finally:
            self.give_back(tenant, bound, amount)

    def held(self, tenant: str, bound: Bound) -> int:
        with self._lock:
            return self._held.get((tenant, bound.name), 0)

    def usage(self) -> dict[tuple[str, str], int]:
        """Current holdings: (tenant, bound name) -> units (for the metrics)."""
        with self._lock:
            return dict(self._held)
