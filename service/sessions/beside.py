"""What runs beside a session's batch at its close: its canaries and its audit components.

A batch runs them in its own executor run (:func:`rewardd.service.pipeline.score`); a
session's checks run as rollouts arrive, a few at a time, so its canaries and audits run
once, at the close, over the groups the close answers for, in one executor run of their own
(the session's fair-queue flow; uncached and uncounted, as in a batch) before the close is
written (no check runs under the close's lock). Their results go into the close's answer
as a batch's would: ``summary.canaries``, per rollout ``audit`` and ``summary.audit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from rewardd.advantages.table import FlatBatch
from rewardd.service import audit, canaries, pipeline
from rewardd.service.models import SessionSpec
from rewardd.service.sessions.records import GroupRecord
from rewardd.service.sessions.results import group_model
from rewardd.service.settings import Settings
from rewardd.workers import fairness
from rewardd.workers.executor import CallResult, Executor


@dataclass(frozen=True, slots=True)
class Beside:
    """The close's canaries and audits, run; :meth:`apply` puts them in its answer."""

    group_ids: list[str]
    """The answered groups they were planned over, in order."""
    spec: SessionSpec
    watch: list[canaries.Canary]
    audits: list[audit.AuditCall]
    results: list[CallResult]

    @classmethod
    async def run(cls, spec: SessionSpec, answered: Sequence[GroupRecord], tenant: str,
                  sid: str, settings: Settings, executor: Executor) -> Beside | None:
        """Plan and run them over ``answered`` (None: nothing to run)."""
        flat = FlatBatch.of([group_model(group) for group in answered])
        batch = pipeline.BatchContext(spec.run_id, spec.step, spec.evaluation)
        watch = pipeline.plan_canaries(spec, flat, settings, batch)
        audits = pipeline.plan_audits(spec, flat, settings, batch)
        calls = [c.call for c in watch] + [a.call for a in audits]
        if not calls:
            return None
        with fairness.flow(tenant, sid):
            results = await pipeline.run_calls([], executor, beside=calls)
        return cls([group.group_id for group in answered], spec, watch, audits, results)

    def apply(self, result: dict[str, Any]) -> None:
        """Into the close's answer ``result``, when it answers for the same groups."""
        if self.group_ids != [group["group_id"] for group in result["groups"]]:
            return  # the answered groups changed since (they cannot once all are done)
        found = canaries.report(self.watch, self.results[:len(self.watch)])
        if found is not None:
            result["summary"]["canaries"] = found
        audit.apply(result, self.spec.audit, self.audits, self.results[len(self.watch):])


__all__ = ["Beside"]
