"""The advantage library: a registry of pure tensor functions, composed per request.

Importing this package registers every entry (the modules below). ``run_stages`` in
``compose.py`` is what the service pipeline calls; ``compute`` runs one estimator alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rewardd.advantages import aggregate as _aggregate  # noqa: F401  (registers entries)
from rewardd.advantages import filters as _filters  # noqa: F401
from rewardd.advantages import outcome as _outcome  # noqa: F401
from rewardd.advantages import returns as _returns  # noqa: F401
from rewardd.advantages import reweight as _reweight  # noqa: F401
from rewardd.advantages import routing as _routing  # noqa: F401
from rewardd.advantages import steps as _steps  # noqa: F401
from rewardd.advantages import transforms as _transforms  # noqa: F401
from rewardd.advantages import tree as _tree  # noqa: F401
from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.compose import Composed, run_stages
from rewardd.advantages.compute import compute_advantages
from rewardd.advantages.encode import decode_rle, encode
from rewardd.advantages.groups import GroupFlags, describe_groups, group_stats
from rewardd.advantages.profiles import PROFILES, Pins, pins_for
from rewardd.advantages.registry import (ENTRIES, ESTIMATORS, Entry, get_entry,
                                         get_estimator, names_of, resolve_estimator)


def compute(batch: AdvantageBatch, estimator: str, params: dict, profile: str) -> Advantages:
    """One estimator alone on ``batch`` under ``profile`` (a trainer's own name for an entry,
    such as verl's ``rloo_vectorized``, resolves under its profile)."""
    entry, params = resolve_estimator(estimator, str(getattr(profile, "value", profile)),
                                      params)
    result = entry.fn(batch, entry.Params.model_validate(params), pins_for(profile))
    return result if isinstance(result, Advantages) else Advantages(rollout=result)


__all__ = ["ENTRIES", "ESTIMATORS", "PROFILES", "AdvantageBatch", "Advantages", "Composed",
           "Entry", "GroupFlags", "Pins", "compute", "compute_advantages", "decode_rle",
           "describe_groups", "encode", "get_entry", "get_estimator", "names_of", "pins_for",
           "run_stages"]
