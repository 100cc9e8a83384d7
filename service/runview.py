"""The request logic of the run routes (GET /v1/runs, /v1/runs/{run_id},
/v1/runs/{run_id}/rollouts), below the HTTP edge so gRPC and the CLI can share it: the run
record's queries (blocking, run in a thread) turned into typed bodies. A record that cannot
be opened is :class:`~rewardd.service.errors.Unavailable` (503 with the reason), never an
empty answer that would read as "no runs". A tenant runs at most
REWARDD_TENANT_MAX_RECORD_QUERIES queries at once per process (429 beyond).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from fastapi.concurrency import run_in_threadpool

from rewardd.service.budgets import Bound, TenantBudgets
from rewardd.service.errors import NotFound, Unavailable
from rewardd.service.records.models import RolloutQuery, RunSummary, StoredRollout
from rewardd.service.records.recorder import Recorder
from rewardd.service.records.store import RecordStore
from rewardd.service.models import SentinelAlert
from rewardd.service.runmodels import (AuditStepInfo, CanaryStepInfo,
                                       ComponentStepInfo, RolloutInfo, RolloutPageBody,
                                       RunAlerts, RunInfo, RunList, RunView, SignalInfo,
                                       StepInfo, VerdictInfo)
from rewardd.service.sentinel import SIGNALS, Alert, evaluate
from rewardd.service.stepstats import StepStats
from rewardd.service.runstate import RunStore
from rewardd.service.services import Services
from rewardd.service.timestamps import iso


DEFAULT_STEPS = 20
"""Per-step summaries a run view carries unless asked: they are summed over the steps'
rollouts when asked (tests/benchmarks/bench_record_query.py: 100 steps of 512 rollouts took
about 0.8 s in PostgreSQL, 20 a fifth of that)."""


class RunRecords:
    """One tenant's view of the run record and run state."""

    def __init__(self, recorder: Recorder, runs: RunStore, tenant: str,
                 budgets: TenantBudgets, max_queries: int) -> None:
        self.recorder = recorder
        self.runs = runs
        self.tenant = tenant
        self.budgets = budgets
        self.bound = Bound("run record queries", max_queries,
                           "REWARDD_TENANT_MAX_RECORD_QUERIES")

    @classmethod
    def of(cls, services: Services, tenant: str) -> RunRecords:
        return cls(services.records, services.runs.for_tenant(tenant), tenant,
                   services.runtime.budgets, services.settings.tenant_max_record_queries)

    @contextlib.contextmanager
    def _query(self) -> Iterator[None]:
        """One of the tenant's record queries: refused (429) past its bound."""
        with self.budgets.hold(self.tenant, self.bound):
            yield

    async def list(self, limit: int) -> RunList:
        store = await self.store()
        with self._query():
            found = await run_in_threadpool(store.runs, self.tenant, limit)
        return RunList(runs=[_run_info(run) for run in found])

    async def view(self, run_id: str, steps: int) -> RunView:
        with self._query():
            return await self._view(run_id, steps)

    async def _view(self, run_id: str, steps: int) -> RunView:
        state = await run_in_threadpool(self.runs.view, run_id)
        record, summaries, stats = None, [], {}
        if self.recorder.enabled:
            store = await self.store()
            record = await run_in_threadpool(store.run, self.tenant, run_id)
            if record is not None and steps:
                summaries = await run_in_threadpool(store.steps, self.tenant, run_id, steps)
                wanted = [s.step for s in summaries if s.step is not None]
                stats = dict(await run_in_threadpool(store.step_stats, self.tenant, run_id,
                                                     wanted))
        if state is None and record is None:
            raise NotFound(f"run {run_id!r} has no state and no record (never seen, expired, "
                           "reset or pruned)")
        return RunView(run_id=run_id, state=state,
                       record=_run_info(record) if record is not None else None,
                       steps=[StepInfo(step=s.step, rollouts=s.rollouts,
                                       failed_rollouts=s.failed_rollouts,
                                       components={name: ComponentStepInfo(
                                           rollouts=c.rollouts, mean=c.mean, std=c.std,
                                           failures=dict(c.failures))
                                           for name, c in s.components.items()},
                                       sources=dict(s.sources), mean_length=s.mean_length,
                                       zero_advantage_fraction=s.zero_advantage_fraction,
                                       **_from_stats(stats.get(s.step)))
                              for s in summaries])

    async def alerts(self, run_id: str) -> RunAlerts:
        """The sentinel over every recorded step of the run."""
        store = await self.store()
        with self._query():
            if await run_in_threadpool(store.run, self.tenant, run_id) is None:
                raise NotFound(f"run {run_id!r} has no record (never recorded, or pruned)")
            series = await run_in_threadpool(store.step_stats, self.tenant, run_id)
            numbered = [(step, stats) for step, stats in series if step is not None]
            found = await run_in_threadpool(evaluate, numbered)
        return RunAlerts(run_id=run_id, steps=len(numbered),
                         alerts=[alert_body(a) for a in found],
                         signals=[SignalInfo(name=s.name, description=s.description,
                                             threshold=s.threshold) for s in SIGNALS])

    async def rollouts(self, run_id: str, query: RolloutQuery) -> RolloutPageBody:
        store = await self.store()
        with self._query():
            if await run_in_threadpool(store.run, self.tenant, run_id) is None:
                raise NotFound(f"run {run_id!r} has no record (never recorded, or pruned)")
            page = await run_in_threadpool(store.rollouts, self.tenant, run_id, query)
        return RolloutPageBody(rollouts=[_rollout_info(item) for item in page.items],
                               next_cursor=str(page.next_cursor)
                               if page.next_cursor is not None else None)

    async def store(self) -> RecordStore:
        if not self.recorder.enabled:
            raise NotFound("this server records no runs (REWARDD_RECORD_RUNS=false)")
        try:
            return await run_in_threadpool(self.recorder.store)
        except Exception as exc:
            raise Unavailable(f"the run record's database cannot be reached "
                              f"({type(exc).__name__}: {exc}); check REWARDD_DATABASE_URL "
                              "and the database, then retry") from exc


def alert_body(alert: Alert) -> SentinelAlert:
    return SentinelAlert(signal=alert.signal, step=alert.step, onset=alert.onset,
                         value=alert.value, threshold=alert.threshold, message=alert.message,
                         component=alert.component)


def _from_stats(stats: StepStats | None) -> dict[str, Any]:
    """The fields of a :class:`StepInfo` that come from the step's statistics (none for a
    step recorded before they were kept)."""
    if stats is None:
        return {}
    audit = {}
    for name in stats.audit:
        agreement = stats.agreement(name)
        audit[name] = AuditStepInfo(compared=agreement.compared,
                                    agreement=agreement.agreement,
                                    mean_gap=agreement.mean_gap)
    return {"reward_mean": stats.reward_mean, "source_rewards": stats.source_means(),
            "audit": audit,
            "canaries": {name: CanaryStepInfo(passed=p, failed=f)
                         for name, (p, f) in stats.canaries.items()},
            "signals": {"hedged_share": stats.hedged_share,
                        "lenient_share": stats.lenient_share,
                        "repeat_share": stats.repeat_share,
                        "length_correlation": stats.length_correlation}}


def _run_info(run: RunSummary) -> RunInfo:
    return RunInfo(run_id=run.run_id, first_at=iso(run.first_at) or "",
                   last_at=iso(run.last_at) or "", last_step=run.last_step,
                   rollouts=run.rollouts)


def _rollout_info(item: StoredRollout) -> RolloutInfo:
    record = item.record
    verdicts: dict[str, Any] = {v.component: VerdictInfo(reward=v.reward, outcome=v.outcome,
                                                          status=dict(v.status))
                                for v in record.verdicts}
    return RolloutInfo(id=item.id, run_id=record.run_id, step=record.step,
                       source=record.source, group_id=record.group_id,
                       rollout_id=record.rollout_id, recorded_at=iso(record.recorded_at) or "",
                       outcome=record.outcome, verdicts=verdicts,
                       summary=dict(record.summary) if record.summary is not None else None,
                       num_tokens=record.num_tokens, zero_advantage=record.zero_advantage,
                       completion=record.completion)
