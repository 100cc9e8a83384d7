"""Replay: re-score a run's recorded rollouts with today's verifiers, or changed parameters,
and report every verdict that flips (``POST /v1/runs/{run_id}/reverify``, a job).

This is how a team checks an upgrade of rewardd or a verifier change before it reaches a
run: the rollouts recorded with their completions (REWARDD_RECORD_COMPLETIONS) are checked
again, group by group, with the reward components their batch named (params overridden by
``set``), and each verdict is compared with the recorded one. A flip is a change of reward
or of outcome (a success that now fails, a failure kind that changed); each carries both
receipts, so it says what changed: the verifier's revision, its parameters, or neither (a
verdict that is not repeatable, like a judge sampled without a seed).

Replay never reads the verdict cache (it must run the verifiers) and never writes to the
run's record or state: its result is the job's. Rollouts recorded without their completion,
or before the record kept groups' inputs, are counted as skipped.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service import pipeline
from rewardd.service.records.models import ComponentInput, StoredRollout
from rewardd.service.records.store import RecordStore
from rewardd.service.replaymodels import (MAX_FLIPS, CountsBy, Flip, ReplaySummary,
                                          ReverifyRequest, ReverifyResult, VerdictPair)
from rewardd.service.settings import Settings
from rewardd.verifiers import REGISTRY, Sample
from rewardd.verifiers.base import Outcome
from rewardd.workers.executor import CallResult, Executor, VerifyCall, keeps_group_whole

PAGE = 200
"""Rollouts read (and re-scored) at a time: the job's progress moves page by page."""


# ---- overrides -------------------------------------------------------------------------------

def overridden(component: ComponentInput, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The component's recorded params with the ``set`` entries that name it applied."""
    params = copy.deepcopy(dict(component.params))
    for key, value in overrides.items():
        name, _, path = key.partition(".")
        if name != component.name:
            continue
        *parents, last = path.split(".")
        target = params
        for part in parents:
            nested = target.get(part)
            target[part] = nested = dict(nested) if isinstance(nested, Mapping) else {}
            target = nested
        target[last] = value
    return params


def check_overrides(req: ReverifyRequest, components: Sequence[ComponentInput]) -> None:
    """A 422 for a ``set`` entry naming no recorded component, or making its params invalid."""
    by_name = {c.name: c for c in components}
    problems = []
    for key in req.set:
        name = key.partition(".")[0]
        if name not in by_name:
            known = ", ".join(sorted(by_name)) or "none recorded with completions"
            problems.append(error(("body", "set", key), f"the run has no component {name!r} "
                                  f"to re-score (its components: {known})"))
    for component in components:
        verifier = REGISTRY.get(component.verifier)
        if verifier is None or not any(k.partition(".")[0] == component.name for k in req.set):
            continue
        try:
            verifier.Params.model_validate(overridden(component, req.set))
        except Exception as exc:
            problems.append(error(("body", "set"), f"component {component.name!r} "
                                  f"({component.verifier}): {exc}"))
    if problems:
        raise RequestInvalid(problems)


# ---- running -------------------------------------------------------------------------------

@dataclass(slots=True)
class _Group:
    """Recorded rollouts of one group, in written order, with their inputs."""

    rollouts: list[StoredRollout]


def _group_key(stored: StoredRollout) -> tuple[Any, ...]:
    record = stored.record
    return record.step, record.group_id, record.inputs.digest if record.inputs else None


def groups_of(page: Sequence[StoredRollout]) -> list[_Group]:
    groups: dict[tuple[Any, ...], _Group] = {}
    for stored in page:
        groups.setdefault(_group_key(stored), _Group([])).rollouts.append(stored)
    return list(groups.values())


def whole_groups(page: list[StoredRollout], full: bool) -> list[StoredRollout]:
    """``page`` without its last group when the page was ``full`` (the group may go on in
    the next page; it starts that page whole: a group-level verifier must see all of it),
    unless that group is all the page holds."""
    if not full:
        return page
    last = _group_key(page[-1])
    cut = next(i for i, stored in enumerate(page) if _group_key(stored) == last)
    return page[:cut] if cut > 0 else page


@dataclass
class _Tally:
    summary: ReplaySummary
    flips: list[Flip] = field(default_factory=list)

    def count(self, component: str, source: str | None, flipped: bool, up: bool) -> None:
        for counts in (self.summary.components.setdefault(component, CountsBy()),
                       self.summary.sources.setdefault(source or "", CountsBy())):
            counts.rescored += 1
            if flipped:
                counts.flipped += 1
                counts.up += up
                counts.down += not up
        self.summary.checks += 1


def _outcome_name(ok: bool, error_kind: Any) -> str:
    return "ok" if ok else str(getattr(error_kind, "value", error_kind) or "failed")


def _higher(before: float | None, after: float | None) -> bool:
    if before is None or after is None:
        return after is not None
    return after > before


def _calls(group: _Group, run_id: str, overrides: Mapping[str, Any],
           settings: Settings) -> list[tuple[ComponentInput, VerifyCall]]:
    first = group.rollouts[0].record
    inputs = first.inputs
    assert inputs is not None
    samples = tuple(Sample(s.record.completion or "", inputs.prompt, s.record.num_tokens)
                    for s in group.rollouts)
    context = pipeline.BatchContext(run_id, first.step, inputs.evaluation)
    calls = []
    for component in inputs.components:
        if component.verifier not in REGISTRY:
            continue
        calls.append((component, VerifyCall(
            component.verifier, samples, inputs.reference, overridden(component, overrides),
            pipeline.call_timeout(component.timeout_s, settings),
            context.for_group(first.group_id) if keeps_group_whole(component.verifier)
            else None)))
    return calls


def _compare(group: _Group, component: ComponentInput, result: CallResult,
             tally: _Tally) -> None:
    for stored, item in zip(group.rollouts, result.items):
        record = stored.record
        recorded = next((v for v in record.verdicts if v.component == component.name), None)
        if recorded is None:
            continue
        now: Outcome = item.outcome
        before = recorded.reward if recorded.outcome == "ok" else None
        after = now.reward if now.ok else None
        after_outcome = _outcome_name(now.ok, now.error)
        flipped = (before, recorded.outcome) != (after, after_outcome)
        tally.count(component.name, record.source, flipped, _higher(before, after))
        if not flipped:
            continue
        tally.summary.flips += 1
        if len(tally.flips) < MAX_FLIPS:
            tally.flips.append(Flip(
                step=record.step, group_id=record.group_id, rollout_id=record.rollout_id,
                component=component.name, source=record.source, before=before, after=after,
                outcomes=VerdictPair(before=recorded.outcome, after=after_outcome),
                receipts=VerdictPair(before=recorded.status.get("receipt"),
                                     after=now.receipt)))


async def reverify(store: RecordStore, tenant: str, run_id: str, req: ReverifyRequest,
                   executor: Executor, settings: Settings,
                   progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Re-score the run's recorded rollouts (see the module doc); the result as JSON data.
    ``progress`` hears of each page of rollouts re-scored."""
    total, _ = await asyncio.to_thread(store.replay_counts, tenant, run_id, req.steps)
    tally = _Tally(ReplaySummary(rollouts=total, rescored=0, skipped=0))
    after: int | None = None
    while True:
        page = await asyncio.to_thread(store.replayable, tenant, run_id, req.steps, after, PAGE)
        if not page:
            break
        page = whole_groups(page, len(page) == PAGE)
        groups = groups_of(page)
        after = page[-1].id
        planned = [(group, component, call) for group in groups
                   for component, call in _calls(group, run_id, req.set, settings)]
        results = await pipeline.run_calls([call for _, _, call in planned], executor)
        for (group, component, _), result in zip(planned, results):
            _compare(group, component, result, tally)
        rescored = sum(len(group.rollouts) for group in groups)
        tally.summary.rescored += rescored
        if progress is not None:
            progress(rescored)
    tally.summary.skipped = total - tally.summary.rescored
    return ReverifyResult(run_id=run_id, steps=req.steps, set=req.set, flips=tally.flips,
                          flips_truncated=tally.summary.flips > len(tally.flips),
                          summary=tally.summary).model_dump(mode="json")


def first_components(store: RecordStore, tenant: str, run_id: str,
                     steps: tuple[int, int] | None) -> list[ComponentInput]:
    """The reward components of the run's first replayable page (what ``set`` may name)."""
    seen: dict[str, ComponentInput] = {}
    for stored in store.replayable(tenant, run_id, steps, None, PAGE):
        for component in stored.record.inputs.components if stored.record.inputs else ():
            seen.setdefault(component.name, component)
    return list(seen.values())


__all__ = ["check_overrides", "first_components", "reverify"]
