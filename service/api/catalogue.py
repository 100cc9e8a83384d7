"""GET /v1/verifiers and GET /v1/estimators: what can be asked for, with every parameter
(:mod:`rewardd.service.catalogue`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from rewardd.advantages.registry import Kind
from rewardd.service import catalogue
from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.models import EstimatorInfo, VerifierInfo

router = APIRouter(prefix="/v1", tags=["catalogue"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)


@router.get("/verifiers", response_model=list[VerifierInfo], summary="Verifier kinds")
def list_verifiers() -> list[VerifierInfo]:
    return catalogue.verifiers()


@router.get("/estimators", response_model=list[EstimatorInfo],
            summary="The advantage catalogue")
def list_estimators(kind: Kind | None = None) -> list[EstimatorInfo]:
    """Every entry (transform, estimator, aggregate, reweight, filter), or those of ``kind``.
    A trainer's own estimator names are listed under the entry they resolve to, per profile
    (``profiles.verl.aliases.grpo_vectorized``)."""
    return catalogue.estimators(kind)
