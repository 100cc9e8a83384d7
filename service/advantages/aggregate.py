"""Multi-reward aggregation: how reward components combine into advantages.

An aggregate is ``fn(batch, params, pins, estimate) -> Advantages``; ``estimate`` runs the
request's estimator (with its params) on a batch, so an aggregate can apply it to the
weighted sum (``sum``) or to each component on its own (gdpo and its kin).
"""

from __future__ import annotations

from typing import Callable

from service.advantages.batch import AdvantageBatch, Advantages
from service.advantages.profiles import Pins
from service.advantages.registry import EstimatorParams, register

Estimate = Callable[[AdvantageBatch], Advantages]


@register("sum", kind="aggregate", formula="R_i = sum_k w_k r_i^k, then the estimator on R",
          source="sum_then_normalize (ESTIMATORS.md); every trainer's default")
def sum_then_normalize(batch: AdvantageBatch, params: EstimatorParams, pins: Pins,
                       estimate: Estimate) -> Advantages:
    """The weighted sum of the components is the reward; the estimator normalises it.
    The default, and the only choice with a single component."""
    return estimate(batch)
