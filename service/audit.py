"""Audit components: a second opinion on a share of the rollouts, never a reward.

A request's ``audit`` lists components in the ``rewards`` shape, each with a ``rate``: a
stronger judge, the full rubric when training uses rubric dropout, a second verifier. Each
rollout is audited by a component or not by a hash of (run, step, group, rollout, component)
below the rate (:func:`audited`): the same rollouts on any pod and on a retry, and a rate
that holds for small batches too (a session's one-group batches), where a per-batch draw of
"at least one" would audit them all.

The audit calls ride in the batch's executor run beside its own (:func:`rewardd.service.
stamping.run_stamped`'s ``beside``, as canaries do: never through the verdict cache, never
in the verifier metrics), one call per (group, component) over the group's audited rollouts
(a group-level verifier sees those as the group). Their verdicts, stamped with receipts,
go to the audited rollouts' ``audit`` and, per component, to ``summary.audit``: how they
agree with the training reward (Spearman's rank correlation and the mean gap,
:mod:`rewardd.service.agreement`). Rewards, advantages, group diagnostics and run state are
the same bytes with or without audit: the audit is added to the finished answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rewardd.advantages.table import FlatBatch
from rewardd.service.agreement import Agreement, is_reward
from rewardd.service.models import AuditSpec
from rewardd.service.records.recorder import sampled
from rewardd.workers.executor import CallResult, VerifyCall

PlanCalls = Callable[[AuditSpec, str, str, Mapping[str, Any], Sequence[Any]], VerifyCall]
"""``make(spec, group_id, prompt, reference, rollouts)``: the call of one component over
some rollouts of a group (the batch's own call planner, so timeouts and group context are
the batch's)."""


@dataclass(frozen=True, slots=True)
class AuditCall:
    """One audit component over the audited rollouts of one group."""

    spec: AuditSpec
    group: int
    """Index of the group in the batch (and in the answer's ``groups``)."""
    rollouts: tuple[int, ...]
    """Indices of the audited rollouts within the group, in order (the call's samples)."""
    call: VerifyCall


def audited(run_id: str | None, step: int | None, group_id: str, rollout_id: str,
            component: str, rate: float) -> bool:
    """Whether ``component`` audits the rollout: a hash below ``rate`` (see the module doc)."""
    return sampled((run_id or "", "" if step is None else str(step), group_id,
                    f"{rollout_id}\x1f{component}"), rate)


def plan(flat: FlatBatch, specs: Sequence[AuditSpec], run_id: str | None, step: int | None,
         make: PlanCalls) -> list[AuditCall]:
    """The audit calls of a batch (none without ``specs``)."""
    out: list[AuditCall] = []
    for spec in specs:
        for gi, group in enumerate(flat.groups):
            picked = tuple(ri for ri, rollout in enumerate(group.rollouts)
                           if audited(run_id, step, group.group_id, rollout.rollout_id,
                                      spec.name, spec.rate))
            if picked:
                chosen = [group.rollouts[ri] for ri in picked]
                out.append(AuditCall(spec, gi, picked, make(spec, group.group_id, group.prompt,
                                                            group.reference, chosen)))
    return out


def apply(body: dict[str, Any], specs: Sequence[AuditSpec], audits: Sequence[AuditCall],
          results: Sequence[CallResult]) -> None:
    """Put the audit verdicts on the audited rollouts of ``body`` (a finished answer) and
    ``summary.audit`` per component (every component of ``specs``, audited or not)."""
    if not specs:
        return
    pairs: dict[str, list[tuple[float, float]]] = {spec.name: [] for spec in specs}
    counts: dict[str, list[int]] = {spec.name: [0, 0] for spec in specs}  # rollouts, failed
    groups = body["groups"]
    for audit, result in zip(audits, results):
        name = audit.spec.name
        answered = groups[audit.group]["rollouts"]
        for ri, item in zip(audit.rollouts, result.items):
            outcome = item.outcome
            verdict = outcome.to_dict()
            if not outcome.ok:
                verdict["reward"] = None
            rollout = answered[ri]
            rollout.setdefault("audit", {})[name] = verdict
            counts[name][0] += 1
            if not outcome.ok:
                counts[name][1] += 1
                continue
            training = rollout.get("reward")
            if is_reward(training) and is_reward(outcome.reward):
                pairs[name].append((float(training), float(outcome.reward)))
    body["summary"]["audit"] = {spec.name: _report(spec, counts[spec.name], pairs[spec.name])
                                for spec in specs}


def _report(spec: AuditSpec, counts: list[int], pairs: list[tuple[float, float]]
            ) -> dict[str, Any]:
    agreement = Agreement.of(pairs)
    return {"verifier": spec.verifier, "rate": spec.rate, "rollouts": counts[0],
            "failed": counts[1], "compared": agreement.compared,
            "agreement": agreement.agreement, "mean_gap": agreement.mean_gap,
            "training_mean": agreement.training_mean, "audit_mean": agreement.audit_mean}


__all__ = ["AuditCall", "apply", "audited", "plan"]
