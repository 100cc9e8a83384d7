"""The advantage library: estimators (registry), trainer profiles and token encodings.

``compute`` is the single entry point the pipeline calls: scalar rewards per rollout in,
per-rollout advantages and group diagnostics out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from service.advantages import outcome as _outcome  # noqa: F401  (registers the estimators)
from service.advantages.encode import TokenLayout, decode_rle, encode
from service.advantages.groups import OutcomeBatch, group_stats
from service.advantages.profiles import PROFILES, Pins, pins_for
from service.advantages.registry import ESTIMATORS, Estimator, get_estimator


@dataclass(frozen=True, slots=True)
class GroupFlags:
    """Per-group diagnostics computed alongside the advantages."""

    count: Tensor  # float64 [G] included rollouts
    mean: Tensor  # float64 [G]
    std: Tensor  # float64 [G] (NaN where fewer than 2 included)
    zero_spread: Tensor  # bool [G]
    singleton: Tensor  # bool [G]


def describe_groups(batch: OutcomeBatch, pins: Pins) -> GroupFlags:
    stats = group_stats(batch, ddof=pins.std_ddof)
    return GroupFlags(count=stats.count, mean=stats.mean, std=stats.std,
                      zero_spread=stats.zero_spread, singleton=stats.count < 2)


def compute(batch: OutcomeBatch, estimator: str, params: dict, profile: str) -> Tensor:
    """Per-rollout advantages of ``estimator`` under ``profile`` (params already validated)."""
    entry = get_estimator(estimator)
    return entry.fn(batch, entry.Params.model_validate(params), pins_for(profile))


__all__ = ["ESTIMATORS", "PROFILES", "Estimator", "GroupFlags", "OutcomeBatch", "Pins",
           "TokenLayout", "compute", "decode_rle", "describe_groups", "encode", "get_estimator",
           "pins_for", "torch"]
