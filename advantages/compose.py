"""Run the stages a request composes: transforms -> aggregate(estimator) -> reweight -> filters.

The aggregate receives ``estimate``, the chosen estimator bound to its params: ``sum``
calls it once on the weighted-sum rewards; gdpo and its kin call it per component.

Parameters were validated against each entry's model when the request was checked; they are
parsed again here (cheap) so every entry receives its typed params object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.profiles import pins_for
from rewardd.advantages.registry import Entry, get_entry, resolve_estimator
from rewardd.advantages.models import AdvantageSpec


@dataclass
class Composed:
    batch: AdvantageBatch  # after the reward transforms
    advantages: Advantages  # after reweighting
    advice: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


def _as_advantages(result: Advantages | Tensor) -> Advantages:
    return result if isinstance(result, Advantages) else Advantages(rollout=result)


def _params(entry: Entry, params: dict[str, Any], batch: AdvantageBatch) -> Any:
    if entry.stateful and batch.run is None:
        raise RuntimeError(f"{entry.kind} {entry.name!r} keeps per-run state: call with a "
                           "run_id and a RunStore (runs=...)")
    return entry.Params.model_validate(params)


def per_component(batch: AdvantageBatch, estimate: Callable[[AdvantageBatch], Advantages]
                  ) -> dict[str, Tensor]:
    """Each component's own advantages (the estimator on that component alone), for the
    per-component energy diagnostic and ``advantage.components``. Rollout-level estimators
    only: a token-level estimator's per-component split is not defined here."""
    out: dict[str, Tensor] = {}
    for k, name in enumerate(batch.component_names):
        valid = batch.valid & batch.component_valid[:, k]
        result = estimate(batch.with_rewards(batch.components[:, k], valid=valid))
        if result.rollout is None:
            return {}
        out[name] = result.rollout
    return out


def run_stages(batch: AdvantageBatch, spec: AdvantageSpec) -> Composed:
    pins = pins_for(spec.profile)
    report: dict[str, Any] = {}
    for stage in spec.transforms:
        entry = get_entry(stage.name, "transform")
        batch = entry.fn(batch, _params(entry, stage.params, batch), pins)
    estimator, params = resolve_estimator(spec.estimator, spec.profile.value, spec.params)
    estimator_params = _params(estimator, params, batch)

    def estimate(b: AdvantageBatch) -> Advantages:
        return _as_advantages(estimator.fn(b, estimator_params, pins))

    aggregate = get_entry(spec.aggregate, "aggregate")
    advantages = _as_advantages(aggregate.fn(
        batch, _params(aggregate, spec.aggregate_params, batch), pins, estimate))
    if advantages.report:
        report[spec.aggregate if spec.aggregate != "sum" else estimator.name] = advantages.report
        advantages.report = {}
    if (not advantages.components and len(batch.component_names) > 1
            and not advantages.is_token_level):
        advantages.components = per_component(batch, estimate)
    for stage in spec.reweight:
        entry = get_entry(stage.name, "reweight")
        advantages = entry.fn(batch, advantages, _params(entry, stage.params, batch), pins)
        if advantages.report:
            report[entry.name] = advantages.report
            advantages.report = {}
    advice = {}
    for stage in spec.filters:
        entry = get_entry(stage.name, "filter")
        params = _params(entry, stage.params, batch)
        advice[entry.name] = entry.fn(batch, advantages, params, pins)
    return Composed(batch=batch, advantages=advantages, advice=advice, report=report)
