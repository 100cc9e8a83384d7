"""plan -> execute -> reward table -> advantages -> response: the one path every entry uses.

The HTTP routes, the CLI and embedding applications all call the functions here, so a batch
scored offline and a batch scored over HTTP give the same bytes.

Every CPU-bound step (validation, planning, the reward table, advantages; the routes do the
same for decoding and encoding) runs in a worker thread (:func:`rewardd.service.heavy.offload`),
never on the event loop, which only awaits workers: otherwise a 10^5-group batch held
/healthz, /readyz and every other tenant's request for 10-20 s. A usual request's steps run
in the default thread pool (min(32, cores + 4) threads; each hop costs ~50 us); a large
one's run in the API process's one heavy lane, which bounds how much of the process (and its
GIL) big requests take at once (:mod:`rewardd.service.heavy` says why and what it measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rewardd.service import audit, canaries, heavy, metrics
from rewardd.service.gcpause import gc_paused
from rewardd.service.models import (AdvantageSpec, AdvantagesRequest, RewardSpec, RewardsRequest,
                            Rollout, ScoreRequest, SessionSpec)
from rewardd.service.respond import respond, respond_advantages
from rewardd.service.runstate import RunStore
from rewardd.service.settings import Settings
from rewardd.service.stamping import run_stamped
from rewardd.service.verdict_cache import CacheView
from rewardd.advantages.checks import DEFAULT_LIMITS, resolved_num_tokens
from rewardd.advantages.table import Column, FlatBatch, combine, precomputed_columns
from rewardd.service.validation import size_limits, validate_score
from rewardd.verifiers.base import Outcome, Sample
from rewardd.workers.executor import (CallDoneCallback, CallResult, Executor, ProgressCallback,
                              VerifyCall, keeps_group_whole)

BatchRecorder = Callable[..., int]
"""``record(run_id, step, groups, body, rewards=..., evaluation=...)``: hands a scored batch
(and what replay needs of it: the request's reward components, whether it was an evaluation)
to the run record (:class:`rewardd.service.records.recorder.TenantRecorder`), in the thread
that built the response; queues and returns at once, never raises."""

GroupCallback = Callable[[int, list[CallResult]], None]
"""Called once per group, in the event loop, with the group's index in the request and the
results of its calls (one per reward component, in the order of ``rewards``) as soon as all
of them are settled: how a job streams finished groups before the batch is done."""


def call_timeout(requested_s: float | None, settings: Settings) -> float:
    """The wall-clock limit of one check (one sample through one verifier): the request's,
    else the server default (validation has already rejected requests above the server's
    maximum)."""
    return min(requested_s or settings.verifier_timeout_s, settings.max_verifier_timeout_s)


def plan(flat: FlatBatch, specs: Sequence[RewardSpec], settings: Settings,
         batch: BatchContext | None = None) -> list[VerifyCall]:
    """One call per (group, component), group-major, with the group's samples in rollout
    order: a worker checks a whole group at once (see :class:`VerifyCall`). Calls of
    group-level verifiers carry the group's context (run, group, step, evaluation)."""
    planner = CallPlanner.of(specs, settings, batch)
    return [call for group in flat.groups if group.rollouts
            for call in planner.calls(group.group_id, group.prompt, group.reference,
                                      group.rollouts)]


@dataclass(frozen=True, slots=True)
class CallPlanner:
    """How groups become verifier calls: per group, one call per reward component over the
    group's samples (from its rollouts, in order), with the group's reference, the
    component's params and timeout, and for group-level verifiers the group's context.

    The one planner of ``/v1/score`` (:func:`plan`, a batch's groups) and of streaming
    sessions (:mod:`rewardd.service.sessions.checking`, the part of a group that just
    arrived, or the assembled group for its group-level components), so a rollout is checked
    the same way whichever route brought it. Built once per request: each component's
    timeout and level are looked up once, not per group."""

    specs: tuple[RewardSpec, ...]
    timeouts: tuple[float, ...]
    group_level: tuple[bool, ...]
    batch: BatchContext

    @classmethod
    def of(cls, specs: Sequence[RewardSpec], settings: Settings,
           batch: BatchContext | None = None) -> CallPlanner:
        return cls(tuple(specs), tuple(call_timeout(s.timeout_s, settings) for s in specs),
                   tuple(keeps_group_whole(s.verifier) for s in specs), batch or BatchContext())

    def calls(self, group_id: str, prompt: str, reference: Mapping[str, Any],
              rollouts: Sequence[Rollout]) -> list[VerifyCall]:
        """The calls of one group's ``rollouts`` (one per component, in ``specs`` order)."""
        samples = tuple(Sample(completion=r.completion or "", prompt=prompt,
                               num_tokens=resolved_num_tokens(r)) for r in rollouts)
        return [VerifyCall(spec.verifier, samples, reference, spec.params, timeout_s,
                           self.batch.for_group(group_id) if whole else None)
                for spec, timeout_s, whole in zip(self.specs, self.timeouts, self.group_level)]


@dataclass(frozen=True, slots=True)
class BatchContext:
    """What group-level verifiers may know of the request (see GroupContext)."""

    run_id: str | None = None
    step: int | None = None
    evaluation: bool = False

    @classmethod
    def of(cls, req: ScoreRequest | RewardsRequest) -> BatchContext:
        return cls(req.run_id, req.step, req.evaluation)

    def for_group(self, group_id: str) -> dict[str, Any]:
        return {"run_id": self.run_id, "group_id": group_id, "step": self.step,
                "evaluation": self.evaluation}


def verifier_columns(specs: Sequence[RewardSpec], outcomes: Sequence[Outcome]) -> list[Column]:
    """Columns of the reward table from outcomes planned rollout-major (rollout 0's
    components first)."""
    k = len(specs)
    return [Column(s.name, s.weight, s.fallback, list(outcomes[j::k]))
            for j, s in enumerate(specs)]


def rollout_major(calls: Sequence[VerifyCall], results: Sequence[CallResult],
                  num_specs: int) -> list[Outcome]:
    """The outcomes of :func:`plan`'s calls, rollout-major (rollout 0's components first),
    the order :func:`verifier_columns` reads."""
    outcomes: list[Outcome] = []
    for start in range(0, len(calls), max(num_specs, 1)):  # no specs: no calls
        group = results[start:start + num_specs]
        for i in range(len(calls[start].samples)):
            outcomes.extend(result.items[i].outcome for result in group)
    return outcomes


async def run_calls(calls: Sequence[VerifyCall], executor: Executor,
                    progress: ProgressCallback | None = None,
                    on_call_done: CallDoneCallback | None = None,
                    cache: CacheView | None = None,
                    beside: Sequence[VerifyCall] = ()) -> list[CallResult]:
    """Run calls on the executor, answering from the verdict ``cache`` what it holds, with
    every outcome stamped with its receipt (:mod:`rewardd.service.stamping`); each check a
    verifier ran is recorded in the metrics (outcome, duration, judge usage) as its call
    settles: a batch cancelled midway (a job cancelled, a client gone) still counts the
    checks and the judge calls that were made, and paid for. ``beside``: calls that ride
    along uncached and uncounted (the canaries); their results follow the calls'."""
    return await run_stamped(calls, executor, _record, progress, on_call_done, cache, beside)


def _record(call: VerifyCall, result: CallResult) -> None:
    for item in result.items:
        outcome = "ok" if item.outcome.ok else item.outcome.error.value
        metrics.observe_verifier(call.verifier, outcome, item.elapsed_s)
        judge = item.outcome.detail.get("judge")
        if isinstance(judge, dict):
            metrics.observe_judge_usage(call.verifier, judge)


async def run_verifiers(flat: FlatBatch, specs: Sequence[RewardSpec], executor: Executor,
                        settings: Settings, progress: ProgressCallback | None,
                        on_group: GroupCallback | None = None,
                        batch: BatchContext | None = None,
                        cache: CacheView | None = None,
                        beside: Sequence[VerifyCall] = ()
                        ) -> tuple[list[Column], list[CallResult]]:
    """Every verifier component as a column; ``progress`` counts checks (rollout x
    component) as their groups finish; ``on_group`` hears of each finished group. With
    the results of the calls run ``beside`` the batch's (the canaries')."""
    calls = await heavy.offload(plan, flat, specs, settings, batch)  # O(rollouts)
    hook = _group_hook(flat, len(specs), on_group) if on_group is not None else None
    results = await run_calls(calls, executor, progress, hook, cache, beside)
    own, extra = results[:len(calls)], results[len(calls):]
    columns = await heavy.offload(
        lambda: verifier_columns(specs, rollout_major(calls, own, len(specs))))
    return columns, extra


def _group_hook(flat: FlatBatch, num_specs: int, on_group: GroupCallback) -> CallDoneCallback:
    """A per-call callback that calls ``on_group`` once all of a group's calls settled.
    :func:`plan` makes ``num_specs`` consecutive calls per group that has rollouts."""
    group_of = [gi for gi, group in enumerate(flat.groups) if group.rollouts
                for _ in range(num_specs)]
    settled: dict[int, dict[int, CallResult]] = {}

    def done(index: int, result: CallResult) -> None:
        gi = group_of[index]
        parts = settled.setdefault(gi, {})
        parts[index % num_specs] = result
        if len(parts) == num_specs:
            del settled[gi]
            on_group(gi, [parts[j] for j in range(num_specs)])

    return done


def plan_canaries(req: ScoreRequest | RewardsRequest, flat: FlatBatch, settings: Settings,
                  batch: BatchContext) -> list[canaries.Canary]:
    """The batch's canaries (:mod:`rewardd.service.canaries`), planned with the batch's own
    timeouts and group contexts; none when the request or the server turned them off."""
    rate = canaries.rate_of(req, settings.canary_rate)
    if rate <= 0:
        return []
    planner = CallPlanner.of(req.rewards, settings, batch)
    return canaries.plan(flat, planner.specs, planner.timeouts, batch.for_group, rate)


def plan_audits(req: ScoreRequest | RewardsRequest | SessionSpec, flat: FlatBatch,
                settings: Settings, batch: BatchContext) -> list[audit.AuditCall]:
    """The batch's (or a closing session's) audit calls (:mod:`rewardd.service.audit`),
    planned with the batch's own call planner (timeouts, group contexts); none without
    ``audit``."""
    if not req.audit:
        return []
    planners = {spec.name: CallPlanner.of([spec], settings, batch) for spec in req.audit}

    def make(spec: Any, group_id: str, prompt: str, reference: Mapping[str, Any],
             rollouts: Sequence[Rollout]) -> VerifyCall:
        return planners[spec.name].calls(group_id, prompt, reference, rollouts)[0]

    return audit.plan(flat, req.audit, req.run_id, req.step, make)


def check_request(req: ScoreRequest | RewardsRequest, settings: Settings) -> None:
    """The request's checks beyond its model (a 422 naming the field). CPU-bound (a 10^5-group
    batch: seconds; a request's regex is compiled): callers run it off the event loop."""
    with gc_paused():
        validate_score(req, settings)


def validated(req: ScoreRequest | RewardsRequest, settings: Settings) -> FlatBatch:
    """:func:`check_request`, then the request's rollouts as one flat batch (off the loop)."""
    check_request(req, settings)
    with gc_paused():
        return FlatBatch.of(req.groups)


async def score(req: ScoreRequest, executor: Executor, settings: Settings,
                progress: ProgressCallback | None = None,
                runs: RunStore | None = None,
                on_group: GroupCallback | None = None,
                record: BatchRecorder | None = None,
                cache: CacheView | None = None) -> dict[str, Any]:
    """POST /v1/score (and a job): verify every rollout, then advantages. With ``cache``
    (the request's view of the verdict cache), the answer says what it saved in
    ``diagnostics.cache``."""
    return await _verify_then_respond(req, req.advantage, executor, settings, progress, runs,
                                      on_group, record, cache)


async def rewards(req: RewardsRequest, executor: Executor, settings: Settings,
                  progress: ProgressCallback | None = None,
                  record: BatchRecorder | None = None,
                  cache: CacheView | None = None) -> dict[str, Any]:
    """POST /v1/rewards: verify every rollout; no advantages."""
    return await _verify_then_respond(req, None, executor, settings, progress, None,
                                      record=record, cache=cache)


async def _verify_then_respond(req: ScoreRequest | RewardsRequest, spec: AdvantageSpec | None,
                               executor: Executor, settings: Settings,
                               progress: ProgressCallback | None,
                               runs: RunStore | None,
                               on_group: GroupCallback | None = None,
                               record: BatchRecorder | None = None,
                               cache: CacheView | None = None) -> dict[str, Any]:
    with heavy.scope():  # a job's or a gRPC call's own; a route's is already open
        heavy.mark(heavy.heavy_rollouts(sum(len(group.rollouts) for group in req.groups)))
        flat = await heavy.offload(validated, req, settings)
        batch = BatchContext.of(req)
        watch = await heavy.offload(plan_canaries, req, flat, settings, batch)
        audits = await heavy.offload(plan_audits, req, flat, settings, batch)
        columns, beside = await run_verifiers(flat, req.rewards, executor, settings,
                                              progress, on_group, batch, cache,
                                              [c.call for c in (*watch, *audits)])
        watched, audited = beside[:len(watch)], beside[len(watch):]

        def finish() -> dict[str, Any]:
            with gc_paused():
                columns.extend(precomputed_columns(flat.rollouts, spec.weights if spec else {}))
                body = respond(req.run_id, flat, combine(columns, len(flat.rollouts)), columns,
                               spec, runs)
                found = canaries.report(watch, watched)
                if found is not None:  # beside the rewards, never part of them
                    body["summary"]["canaries"] = found
                audit.apply(body, req.audit, audits, audited)  # the same: beside them
                if cache is not None:
                    body["diagnostics"] = {"cache": cache.diagnostics()}
                if record is not None and req.run_id is not None:
                    _add_sentinel(body, record, req.run_id)
                    record(req.run_id, req.step, flat.groups, body,  # queued, never raises
                           rewards=req.rewards, evaluation=req.evaluation)
                return body

        # the advantage step is CPU-bound: off the event loop, so other requests keep flowing
        return await heavy.offload(finish)


def _add_sentinel(body: dict[str, Any], record: BatchRecorder, run_id: str) -> None:
    """``summary.sentinel``: the run's alerts as the record's sentinel last saw them (a
    recorder that keeps none, an offline one say, adds nothing)."""
    active = getattr(record, "active_alerts", None)
    alerts = active(run_id) if active is not None else None
    if alerts is None:
        return
    body["summary"]["sentinel"] = {
        "step": max((a.step for a in alerts), default=None),
        "alerts": [{"signal": a.signal, "step": a.step, "onset": a.onset, "value": a.value,
                    "threshold": a.threshold, "message": a.message,
                    "component": a.component} for a in alerts]}


def advantages(req: AdvantagesRequest, runs: RunStore | None = None,
               settings: Settings | None = None) -> dict[str, Any]:
    """POST /v1/advantages: pure compute from the rewards the rollouts carry, within the
    settings' size limits (rollouts, per-token advantages; without settings: the library's)."""
    limits = size_limits(settings) if settings is not None else DEFAULT_LIMITS
    with gc_paused():
        return respond_advantages(req, runs, limits)
