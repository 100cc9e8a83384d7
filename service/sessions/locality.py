"""Which advantage specs give a group numbers that do not depend on the rest of the batch.

The registry has no such flag, and most entries cannot tell by their kind: ``grpo`` is
group-level unless ``scale_rewards`` is ``batch``, ``rloo`` unless ``normalize_advantages``,
and a profile whitens some estimators over the batch. So this is an allow-list: a spec is
group-local only when every stage it uses is known to read nothing but the group (and the
rollout); anything else (batch whitening, gdpo, dara, reinforce_pp, filters, budgets,
reweights, stateful entries, aggregates other than the weighted sum) waits for the session's
close. A new group-level entry that is not listed is merely computed at close: correct, later.
"""

from __future__ import annotations

from rewardd.advantages.models import AdvantageSpec
from rewardd.advantages.profiles import pins_for
from rewardd.advantages.registry import resolve_estimator

GROUP_ESTIMATORS = frozenset({"grpo", "dr_grpo", "rloo", "opo", "passk", "grpo_passk",
                              "remax", "outcome_conditioned"})
"""Estimators whose advantages of a group read only that group (with the params below)."""

GROUP_TRANSFORMS = frozenset({"rank", "overlong"})
"""Reward transforms that read only the group (rank) or the rollout (overlong)."""


def group_local(spec: AdvantageSpec) -> bool:
    """True when a group's advantages under ``spec`` equal those it gets in any batch, so a
    session publishes them as final the moment the group completes."""
    if spec.aggregate != "sum" or spec.filters or spec.reweight:
        return False
    if any(stage.name not in GROUP_TRANSFORMS for stage in spec.transforms):
        return False
    try:
        entry, params = resolve_estimator(spec.estimator, spec.profile.value, spec.params)
    except (KeyError, ValueError):
        return False
    if entry.name not in GROUP_ESTIMATORS or entry.stateful:
        return False
    if entry.name in pins_for(spec.profile).whitened:
        return False
    if params.get("scale_rewards") == "batch" or params.get("normalize_advantages"):
        return False
    return True
