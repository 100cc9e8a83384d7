"""The estimator registry: one function per estimator, registered by name (verl's pattern).

An estimator is a pure function ``fn(batch, params, pins) -> Tensor[R]`` of tensors in and
tensors out. Registering it here is all it takes for the API, the CLI and
``GET /v1/estimators`` to offer it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from pydantic import BaseModel, ConfigDict
from torch import Tensor

from service.advantages.groups import OutcomeBatch
from service.advantages.profiles import Pins


class EstimatorParams(BaseModel):
    """Base of estimator parameter models; unknown parameters are an error."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


EstimatorFn = Callable[[OutcomeBatch, EstimatorParams, Pins], Tensor]


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: EstimatorFn
    Params: type[EstimatorParams]
    formula: str
    source: str
    description: str
    inputs: tuple[str, ...] = field(default=("rewards",))


ESTIMATORS: dict[str, Estimator] = {}


def register(name: str, *, formula: str, source: str,
             params: type[EstimatorParams] = EstimatorParams,
             inputs: tuple[str, ...] = ("rewards",)) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: add ``fn`` to the registry under ``name``; its docstring is the description."""

    def add(fn: EstimatorFn) -> EstimatorFn:
        if name in ESTIMATORS:
            raise ValueError(f"estimator {name!r} registered twice")
        ESTIMATORS[name] = Estimator(name=name, fn=fn, Params=params, formula=formula,
                                     source=source, description=inspect.getdoc(fn) or "",
                                     inputs=inputs)
        return fn

    return add


def get_estimator(name: str) -> Estimator:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown estimator {name!r}; valid: {', '.join(sorted(ESTIMATORS))}") from None
