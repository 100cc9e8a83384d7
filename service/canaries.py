"""Canaries: probes built from a batch's own references, run beside the batch, so that a
broken verifier is caught in the first batch instead of passing for a hard task.

Per reward component that has a probe maker (:mod:`rewardd.verifiers.probes`), a share of
the batch's groups (REWARDD_CANARY_RATE, or the request's ``canaries.rate``; at least one
group, spread evenly from the first) each get one extra :class:`VerifyCall` whose samples
are the probes, with the component's params, timeout and group context. They ride in the
batch's own executor run (:func:`rewardd.service.stamping.run_stamped`'s ``beside``: one
flow of the fair queue, one round trip, nothing held twice against a tenant's limits), but:

* never through the verdict cache (a cached verdict would test the cache, not today's
  verifier), and never into the verifier metrics (they count rollouts);
* never into the reward table: their results become ``summary.canaries`` and
  ``rewardd_canary_total`` only, so rewards, advantages, group diagnostics, run state and
  the recorded rollouts are the same bytes with canaries on or off.

Why extra calls rather than extra samples in the batch's own calls: a group-level verifier
(a judge batching its group, rubric dropout drawing per group) would see the probes as
rollouts of the group. Cost: one call per canaried group and component (2 or 3 checks); at
the default rate on a 512-rollout math step, 2 checks beside 512 (README, "Canaries:
what they cost a step").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rewardd.advantages.table import FlatBatch
from rewardd.service import metrics
from rewardd.service.canary_findings import findings, passes
from rewardd.service.models import RewardSpec, RewardsRequest, ScoreRequest, SessionSpec
from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import Sample
from rewardd.verifiers.probes import Probe, maker_for, shape_of
from rewardd.workers.executor import CallResult, VerifyCall

MAX_PROBLEMS = 5
"""Problems listed per component (more groups with problems are counted, not listed: a
broken verifier says the same of every group)."""


@dataclass(frozen=True, slots=True)
class Canary:
    """One canaried (group, component): its probes and the call that checks them."""

    component: str
    verifier: str
    source: str
    group_id: str
    reference: Mapping[str, Any]
    probes: tuple[Probe, ...]
    call: VerifyCall


def rate_of(req: ScoreRequest | RewardsRequest | SessionSpec, default: float) -> float:
    """The share of groups canaried: the request's ``canaries`` (false: none; an object:
    its ``rate`` or the server's), else the server's REWARDD_CANARY_RATE."""
    spec = req.canaries
    if isinstance(spec, bool):
        return default if spec else 0.0
    if not spec.enabled:
        return 0.0
    return default if spec.rate is None else spec.rate


def chosen(groups: int, rate: float) -> list[int]:
    """Indices of the groups canaried at ``rate``: round(rate x groups) of them, at least
    one, spread evenly from the first (the same groups for the same batch, on any pod)."""
    if rate <= 0 or groups == 0:
        return []
    k = min(groups, max(1, round(rate * groups)))
    return sorted({i * groups // k for i in range(k)})


def plan(flat: FlatBatch, specs: Sequence[RewardSpec], timeouts: Sequence[float],
         context_of: Callable[[str], Mapping[str, Any]], rate: float) -> list[Canary]:
    """The canaries of a batch: ``timeouts`` per component (the batch's own), and
    ``context_of(group_id)`` the group context a group-level verifier's call carries."""
    groups = [gi for gi, group in enumerate(flat.groups) if group.rollouts]
    picked = [groups[i] for i in chosen(len(groups), rate)]
    out: list[Canary] = []
    for spec, timeout_s in zip(specs, timeouts):
        verifier = REGISTRY.get(spec.verifier)
        maker = maker_for(verifier) if verifier is not None else None
        if maker is None:
            continue
        for gi in picked:
            group = flat.groups[gi]
            shape = shape_of([r.completion or "" for r in group.rollouts])
            probes = tuple(maker(group.reference, spec.params, shape))
            if not probes:
                continue
            samples = tuple(Sample(completion=p.text, prompt=group.prompt) for p in probes)
            context = context_of(group.group_id) if verifier.group_level else None
            call = VerifyCall(spec.verifier, samples, group.reference, spec.params, timeout_s,
                              context)
            out.append(Canary(spec.name, spec.verifier, group.source or group.data_source or "",
                              group.group_id, group.reference, probes, call))
    return out


def report(canaries: Sequence[Canary], results: Sequence[CallResult]
           ) -> dict[str, dict[str, Any]] | None:
    """``summary.canaries``: per canaried component its verifier, probes passed and failed
    (in all and per source) and the problems found; counted in ``rewardd_canary_total``.
    None when no component was canaried."""
    if not canaries:
        return None
    out: dict[str, dict[str, Any]] = {}
    unlisted: dict[str, int] = {}
    for index, canary in enumerate(canaries):
        entry = out.setdefault(canary.component, {
            "verifier": canary.verifier, "passed": 0, "failed": 0, "problems": [],
            "sources": {}})
        source = entry["sources"].setdefault(canary.source, {"passed": 0, "failed": 0})
        outcomes = [item.outcome for item in results[index].items]
        for probe, outcome in zip(canary.probes, outcomes):
            result = "passed" if passes(probe, outcome) else "failed"
            entry[result] += 1
            source[result] += 1
            metrics.count_canary(canary.verifier, canary.source, probe.kind, result)
        for problem in findings(canary.component, canary.verifier, canary.group_id,
                                canary.reference, canary.probes, outcomes):
            if len(entry["problems"]) < MAX_PROBLEMS:
                entry["problems"].append(problem)
            else:
                unlisted[canary.component] = unlisted.get(canary.component, 0) + 1
    for component, more in unlisted.items():
        out[component]["problems"].append(f"... and {more} more like these")
    return out


__all__ = ["Canary", "chosen", "plan", "rate_of", "report"]
