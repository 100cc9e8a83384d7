"""Streaming sessions (issue #18): rollouts scored the moment they finish, a group's
advantages the moment it is whole, the batch's at the step's close.

Routes in :mod:`rewardd.service.api.sessions`; the work in
:class:`~rewardd.service.sessions.manager.SessionManager`, one per API process on
the app's :class:`~rewardd.service.services.Services` (started and stopped by the app's
lifespan). Other routes (the per-sample trainer protocols) feed sessions through the same
manager::

    manager = services.sessions
    sid = await manager.open(tenant, SessionSpec(...) or a dict)       # -> session id
    await manager.add(tenant, sid, [{"group_id", "prompt", "reference",
                                     "rollouts": [{...}, ...]}])        # -> {"accepted",
                                                                        #     "duplicates"}
    group = await manager.wait_group(tenant, sid, group_id, wait_s)     # -> group object|None
    await manager.close_group(tenant, sid, group_id)                    # -> group object|None
    final = await manager.close(tenant, sid)                            # -> {"session_id",
                                                                        #  "state", "error",
                                                                        #  "summary", "result"}
    await manager.cancel(tenant, sid); await manager.status(tenant, sid)
    await manager.standing(tenant, sid, spec)   # the server's own session (see below)
    await manager.add_rollouts(tenant, sid, groups)  # add, answering {(group, rollout)} taken
    await manager.group_done(sid, group_id, timeout)  # a standing session's group event|None

``tenant`` is a :class:`~rewardd.service.tenancy.Tenant` or a tenant name. A group object
is the ``/v1/score`` group (``group_id``, ``rollouts`` with ``reward``, ``rewards``,
``status``, ``advantages``..., ``diagnostics``) plus ``index`` (first-sight order),
``final`` (its advantages are final: a group-level estimator; else they are null until the
close, and ``wait_group`` after the close answers the final ones), ``reason`` (``full``,
``closed``, ``timeout``), ``failed`` and ``arrived``. Errors: ``SessionNotFound`` (404),
``SessionConflict`` (409; a resent rollout with other content, a group or session no longer
open), ``RequestInvalid`` (422 naming the field; a session's groups), ``SessionBusy`` (429:
the tenant's open sessions, rollouts in flight, stored groups or bytes), all handled by the
app.

Semantics:

* A group completes when ``group_size`` of its rollouts are checked, when the client closes
  it, or ``group_timeout_s`` after its first rollout (completed from what arrived, or
  ``failed`` with ``on_group_timeout="fail"``); then its ``group`` event is published.
* Idempotent on (session, group, rollout_id): a resent rollout with the same content is
  counted in ``duplicates`` and not scored again; with other content it is a 409.
* Advantages come from the same functions as ``/v1/score``
  (:mod:`rewardd.service.sessions.results`): bit for bit equal for group-level estimators
  (:mod:`rewardd.service.sessions.locality`), and the close computes the whole batch
  (batch whitening, gdpo, dara, reinforce_pp, filters, budgets, run state) exactly as
  ``/v1/score`` would on the completed groups in first-sight order.
* Stored like jobs (:mod:`rewardd.service.sessions.store`): in the process in embedded
  mode, in Redis when shared state is configured, where a session outlives its pod.
* Per-tenant bounds: open sessions (``REWARDD_SESSION_MAX_OPEN``), rollouts being checked
  over every pod (``REWARDD_SESSION_MAX_INFLIGHT``; a dead pod's count is dropped) and idle
  time (``REWARDD_SESSION_IDLE_TIMEOUT_S``); what the store keeps: groups per session
  (``REWARDD_SESSION_MAX_GROUPS``, 422), groups and bytes per tenant
  (``REWARDD_SESSION_TENANT_MAX_GROUPS`` / ``_MAX_BYTES``, 429) and ended sessions retained
  (``REWARDD_SESSION_TENANT_MAX_RETAINED``; the oldest ended are deleted first, also to make
  room for an add): :mod:`rewardd.service.sessions.quota`.
* A check the executor could not run fails its cells ``unavailable``: the group completes.
* *Standing* sessions (:meth:`SessionManager.standing`) are the server's own, for the
  per-sample trainer protocols (:mod:`rewardd.service.compat.groups`): never closed, each
  group final alone, no events, not counted as the tenant's.
"""

from __future__ import annotations

from rewardd.service.sessions.errors import SessionBusy, SessionConflict, SessionNotFound
from rewardd.service.sessions.manager import SessionManager
from rewardd.service.sessions.redis_store import RedisStore
from rewardd.service.sessions.store import MemoryStore, SessionStore

__all__ = ["MemoryStore", "RedisStore", "SessionBusy", "SessionConflict", "SessionManager",
           "SessionNotFound", "SessionStore"]
