"""What can be asked for: every verifier and every advantage entry, with every parameter.

Generated from the registries (:data:`rewardd.verifiers.REGISTRY`,
:data:`rewardd.advantages.ENTRIES`), so the catalogue a client reads (REST ``GET
/v1/verifiers`` and ``GET /v1/estimators``, gRPC ``ListVerifiers`` and ``ListEstimators``)
is the code's own description of itself.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rewardd.advantages import ENTRIES, PROFILES
from rewardd.advantages.profiles import aliases_of
from rewardd.advantages.registry import KINDS, Kind
from rewardd.service.models import EstimatorInfo, ParamInfo, VerifierInfo
from rewardd.verifiers import REGISTRY


def _type_name(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    return re.sub(r"\btyping\.", "", text)


def param_infos(model: type[BaseModel]) -> list[ParamInfo]:
    """Name, type, default and description of every parameter of ``model``."""
    infos = []
    for name, field in model.model_fields.items():
        default = None if field.default is PydanticUndefined else field.default
        infos.append(ParamInfo(name=name, type=_type_name(field.annotation),
                               required=field.is_required(), default=default,
                               description=field.description))
    return infos


def verifiers() -> list[VerifierInfo]:
    """Every registered verifier, by name."""
    return [VerifierInfo(name=v.name, description=v.description,
                         reference_fields=dict(v.reference_fields), params=param_infos(v.Params))
            for v in sorted(REGISTRY.values(), key=lambda v: v.name)]


def _profiles(entry: str) -> dict[str, dict[str, Any]]:
    """Each profile's pins, and under ``aliases`` the trainer names that mean ``entry`` under
    that profile with the params each pins (``rloo_vectorized``: rloo, singleton zero)."""
    aliases = aliases_of(entry)
    return {p.value: {**pins.as_dict(), "aliases": aliases.get(p.value, {})}
            for p, pins in PROFILES.items()}


def estimators(kind: Kind | None = None) -> list[EstimatorInfo]:
    """Every entry (transform, estimator, aggregate, reweight, filter), or those of ``kind``,
    in pipeline order. A trainer's own estimator names are listed under the entry they
    resolve to, per profile (``profiles.verl.aliases.grpo_vectorized``)."""
    return [EstimatorInfo(name=e.name, kind=e.kind, stateful=e.stateful, formula=e.formula,
                          description=e.description, source=e.source, inputs=list(e.inputs),
                          params=param_infos(e.Params), profiles=_profiles(e.name))
            for e in sorted(ENTRIES.values(), key=lambda e: (KINDS.index(e.kind), e.name))
            if kind is None or e.kind == kind]
