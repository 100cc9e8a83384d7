"""The per-tenant bounds on requests that stay open: event streams and long polls.

An event stream (a job's or a session's, REST or gRPC) and a long poll (a group wait with
``wait_s``, a session's close waiting for its batch) each keep a request, a task and its
buffers on this API process for as long as the client likes. Each is held against the
tenant's :class:`~rewardd.service.budgets.TenantBudgets` *before* it starts, so one tenant's
thousand watchers are a typed 429 (gRPC ``RESOURCE_EXHAUSTED``) naming the bound and its
setting, not a process's memory and CPU.
"""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from rewardd.service.budgets import Bound, TenantBudgets
from rewardd.service.runtime import Runtime


def streams_bound(runtime: Runtime) -> Bound:
    return Bound("open event streams", runtime.settings.tenant_max_streams,
                 "REWARDD_TENANT_MAX_STREAMS")


def long_polls_bound(runtime: Runtime) -> Bound:
    return Bound("long polls", runtime.settings.tenant_max_long_polls,
                 "REWARDD_TENANT_MAX_LONG_POLLS")


class StreamHold:
    """One stream's place in its tenant's bound: taken at once (or :class:`Busy`), given
    back exactly once by :meth:`release`, however the stream ends (or if it never starts)."""

    def __init__(self, runtime: Runtime, tenant: str) -> None:
        self._budgets: TenantBudgets = runtime.budgets
        self._bound = streams_bound(runtime)
        self._tenant = tenant
        self._budgets.take(tenant, self._bound)
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._budgets.give_back(self._tenant, self._bound)


@contextlib.asynccontextmanager
async def long_poll(runtime: Runtime, tenant: str, waits: bool = True
                    ) -> AsyncIterator[None]:
    """Hold one of the tenant's long polls for the block (nothing when ``waits`` is False:
    a request that answers at once parks nothing)."""
    if not waits:
        yield
        return
    with runtime.budgets.hold(tenant, long_polls_bound(runtime)):
        yield
