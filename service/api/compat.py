"""Per-sample trainer protocols: OpenRLHF ``POST /get_reward``, slime ``POST /slime/reward``
(the path is ``slime.path`` of ``REWARDD_COMPAT_CONFIG``) and NeMo-Gym ``POST /verify``.

Each route reads the trainer's body, hands its samples to :mod:`rewardd.service.compat`
and writes the trainer's answer; API keys and tenant slots apply as on /v1 (a trainer sends
``Authorization: Bearer <key>`` through its client's headers or a proxy). No /v1 prefix:
the trainers post to the URL they are given, and these paths are theirs. The run a request's
samples are recorded under is in that URL's query (``?run_id=&step=``, see
:mod:`rewardd.service.compat.recording`).
"""

from __future__ import annotations

from typing import Annotated, Any, Callable

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

from rewardd.advantages.models import Name
from rewardd.service import heavy
from rewardd.service.api.bodies import BUSY_RESPONSE, body, responses
from rewardd.service.api.deps import AUTH_RESPONSES, current_tenant
from rewardd.service.codec import read_model, render
from rewardd.service.compat.config import CompatConfig
from rewardd.service.compat.protocols import (NemoGymRequest, NemoGymResponse,
                                              OpenRLHFRequest, OpenRLHFResponse, SlimeRequest,
                                              SlimeResponse, nemo_gym_answer,
                                              nemo_gym_samples, openrlhf_answer,
                                              openrlhf_samples, slime_answer, slime_samples)
from rewardd.service.compat.recording import NamedRun
from rewardd.service.compat.samples import SampleIn
from rewardd.service.models import ErrorResponse
from rewardd.service.services import ServicesDep, of_app
from rewardd.service.tenancy import Tenant

router = APIRouter(tags=["compat"], dependencies=[Depends(current_tenant)],
                   responses=AUTH_RESPONSES)

ERRORS: dict[int | str, dict[str, Any]] = {
    **BUSY_RESPONSE,
    503: {"model": ErrorResponse, "description": "A check failed and its component has no "
          "fallback (REWARDD_COMPAT_CONFIG); retrying may succeed.",
          "headers": {"Retry-After": {"schema": {"type": "integer"}}}},
    504: {"model": ErrorResponse, "description": "Group mode with on_timeout fail: the "
          "sample's group was not complete within group.timeout_s."}}


def named_run(services: ServicesDep,
              run_id: Annotated[Name | None, Query(
                  description="The run the request's samples are recorded under (put it in "
                  "the URL the trainer posts to); unset: REWARDD_COMPAT_CONFIG's run_id, "
                  "else not recorded.")] = None,
              step: Annotated[int | None, Query(
                  ge=0, description="The training step they are recorded under.")] = None
              ) -> NamedRun | None:
    """The run a per-sample request names (:mod:`rewardd.service.compat.recording`)."""
    return NamedRun.of(run_id, step, services.compat.config)


RunDep = Annotated[NamedRun | None, Depends(named_run)]


class ConfiguredPathRoute(APIRoute):
    """A route served at the path the app's compat configuration names (``slime.path``),
    documented at its default: the path is server configuration, the router is built once."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        services = of_app(scope.get("app"))
        if scope.get("type") != "http" or services is None:
            return super().matches(scope)
        configured = services.compat.config.slime.path
        path = scope["path"][len(scope.get("root_path", "")):] if scope.get(
            "root_path") and scope["path"].startswith(scope["root_path"]) else scope["path"]
        if path != configured:
            return Match.NONE, {}
        return super().matches({**scope, "path": self.path, "root_path": ""})


@router.post("/get_reward", response_model=None, openapi_extra=body(OpenRLHFRequest),
             responses={**responses(OpenRLHFResponse), **ERRORS},
             summary="OpenRLHF remote reward (--reward.remote_url)")
async def get_reward(request: Request, services: ServicesDep, run: RunDep,
                     tenant: Tenant = Depends(current_tenant)) -> Response:
    """OpenRLHF's remote reward call: one reward per query (see REWARDD_COMPAT_CONFIG)."""
    async def read(config: CompatConfig) -> list[SampleIn]:
        req = await read_model(request, OpenRLHFRequest, tenant)
        heavy.mark(heavy.heavy_rollouts(len(req.query)))
        return await heavy.offload(openrlhf_samples, req, config)  # O(samples)

    with heavy.scope():
        samples, outs = await services.compat.score(tenant, "openrlhf", read,
                                                    ("body", "query"), run)
        return await answer(request, openrlhf_answer, samples, outs, services.compat.config)


async def answer(request: Request, build: Callable[..., Any], *args: Any) -> Response:
    """The trainer's answer, built and encoded off the event loop for a heavy request (60,000
    samples: seconds of CPU), on it for a usual one (no thread hop for one sample)."""
    if heavy.is_heavy():
        return await heavy.offload(lambda: render(request, build(*args)))
    return render(request, build(*args))


slime = APIRouter(route_class=ConfiguredPathRoute)


@slime.post("/slime/reward", response_model=None, openapi_extra=body(SlimeRequest),
            responses={**responses(SlimeResponse), **ERRORS},
            summary="slime remote reward (--rm-type remote_rm --rm-url)")
async def slime_reward(request: Request, services: ServicesDep, run: RunDep,
                       tenant: Tenant = Depends(current_tenant)) -> Response:
    """slime's remote_rm call; the path is slime.path of REWARDD_COMPAT_CONFIG (this one by
    default), the reward is under slime.reward_key (`reward` by default)."""
    async def read(config: CompatConfig) -> list[SampleIn]:
        return slime_samples(await read_model(request, SlimeRequest, tenant), config)

    with heavy.scope():
        _, [out] = await services.compat.score(tenant, "slime", read, run=run)
        return render(request, slime_answer(out, services.compat.config))


@router.post("/verify", response_model=None, openapi_extra=body(NemoGymRequest),
             responses={**responses(NemoGymResponse), **ERRORS},
             summary="NeMo-Gym resources server verify")
async def nemo_gym_verify(request: Request, services: ServicesDep, run: RunDep,
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    """NeMo-Gym's /verify: the request echoed with `reward` (and `reward_components` when
    there are several rewards)."""
    box: list[NemoGymRequest] = []

    async def read(config: CompatConfig) -> list[SampleIn]:
        box.append(await read_model(request, NemoGymRequest, tenant))
        return nemo_gym_samples(box[0], config)

    with heavy.scope():
        _, [out] = await services.compat.score(tenant, "nemo_gym", read, run=run)
        return render(request, nemo_gym_answer(box[0], out, services.compat.config))


router.include_router(slime)
