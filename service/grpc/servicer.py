"""The rewardd.v1.Rewardd service: each call is the REST route's, over messages.

Every call authenticates from the ``authorization`` metadata (the REST keys and tenants;
:mod:`.intake` did so before the message was read, and applied the tenant's body limit to
its bytes before they were parsed), converts its message to the REST body, validates it with the same pydantic model, and calls
the same service the REST route calls (:mod:`rewardd.service.pipeline`,
:mod:`rewardd.service.verify`, :class:`~rewardd.service.jobs.service.JobService`...). Calls that spend workers or CPU hold the tenant's limiter slot like
their routes. A call past its deadline (or cancelled by its client) is cancelled by gRPC,
which cancels the pipeline and with it the verifier checks still queued or running.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc
import orjson
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from rewardd.advantages.checks import pydantic_errors
from rewardd.advantages.errors import Loc, RequestInvalid, error
from rewardd.advantages.registry import Kind
from rewardd.service import catalogue, heavy, pipeline
from rewardd.service.codec import validate_model
from rewardd.service.gcpause import gc_paused
from rewardd.service.grpc import convert
from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc import rewardd_pb2_grpc as pb_grpc
from rewardd.service.grpc.errors import abort_with, status_of
from rewardd.service.holds import StreamHold
from rewardd.service.jobs.service import IDEMPOTENCY_KEY_MAX, JobProgressTick
from rewardd.service.jobs.store import FINAL, SCORE, Job
from rewardd.service.models import (AdvantagesRequest, RewardsRequest, ScoreRequest,
                                    VerifyRequest)
from rewardd.service.records.store import MAX_PAGE
from rewardd.service.runview import DEFAULT_STEPS, RunRecords
from rewardd.service.services import Services
from rewardd.service.tenancy import Tenant, authenticate, bearer
from rewardd.service.verify import known_verifier, verify_one

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

_KIND = TypeAdapter(Kind | None)
_IDEMPOTENCY_KEY = TypeAdapter(Annotated[str, Field(min_length=1,
                                                    max_length=IDEMPOTENCY_KEY_MAX)])


def tenant_of(context: grpc.aio.ServicerContext, services: Services) -> Tenant:
    """The caller's tenant from ``authorization: Bearer <key>`` metadata (REST's rules and
    words, :func:`rewardd.service.tenancy.authenticate`)."""
    header = dict(context.invocation_metadata() or ()).get("authorization", "")
    return authenticate(services.keys, services.settings, bearer(str(header)),
                        missing="no `authorization: Bearer <key>` metadata")


def parse_message(message: Any, model: type[M]) -> M:
    """The message as its REST body, validated by ``model`` as REST validates a body
    (:func:`rewardd.service.codec.validate_model`: in the heavy lane a chunk of groups at a
    time). CPU-bound: off the loop."""
    with gc_paused():
        return validate_model(model, convert.to_body(message))


async def read_message(message: Any, model: type[M], tenant: Tenant) -> M:
    """:func:`parse_message` off the event loop (a large one in the heavy lane). The
    tenant's body limit was applied to the message's bytes before they were parsed
    (:mod:`.intake`)."""
    return await heavy.offload(parse_message, message, model)


def validate(adapter: TypeAdapter, value: Any, loc: Loc) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise RequestInvalid(pydantic_errors(exc, loc)) from None


class RewarddServicer(pb_grpc.RewarddServicer):
    """rewardd.v1.Rewardd over the REST app's services (executor, limiter, keys, stores)."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def _call(self, context: grpc.aio.ServicerContext,
                    work: Callable[[Tenant], Awaitable[R]]) -> R:
        try:
            return await work(tenant_of(context, self.services))
        except Exception as exc:  # cancellation (deadline, client gone) is not an Exception
            status = status_of(exc)
        await abort_with(context, status)
        raise AssertionError("unreachable: abort raises")

    async def _scoring(self, tenant: Tenant, run: Callable[[], Awaitable[dict[str, Any]]]
                       ) -> bytes:
        """A ScoreResponse already serialized (:func:`convert.score_wire`; the server's
        handlers pass bytes through)."""
        async with self.services.limiter.hold(tenant):  # a worker's time, like the routes
            return await asyncio.to_thread(convert.score_wire, await run())

    async def Score(self, request: pb.ScoreRequest, context: Any) -> bytes:
        services = self.services

        async def work(tenant: Tenant) -> bytes:
            async def run() -> dict[str, Any]:
                req = await read_message(request, ScoreRequest, tenant)
                return await pipeline.score(req, services.executor, services.settings,
                                            runs=services.runs.for_tenant(tenant.name),
                                            record=services.records.for_tenant(tenant.name),
                                            cache=services.verdicts.view(tenant.name,
                                                                         req.cache))
            return await self._scoring(tenant, run)

        return await self._call(context, work)

    async def Rewards(self, request: pb.RewardsRequest, context: Any) -> bytes:
        services = self.services

        async def work(tenant: Tenant) -> bytes:
            async def run() -> dict[str, Any]:
                req = await read_message(request, RewardsRequest, tenant)
                return await pipeline.rewards(req, services.executor, services.settings,
                                              record=services.records.for_tenant(tenant.name),
                                              cache=services.verdicts.view(tenant.name,
                                                                           req.cache))
            return await self._scoring(tenant, run)

        return await self._call(context, work)

    async def Advantages(self, request: pb.AdvantagesRequest, context: Any) -> bytes:
        services = self.services

        async def work(tenant: Tenant) -> bytes:
            async def run() -> dict[str, Any]:
                req = await read_message(request, AdvantagesRequest, tenant)
                return await asyncio.to_thread(pipeline.advantages, req,
                                               services.runs.for_tenant(tenant.name),
                                               services.settings)
            return await self._scoring(tenant, run)

        return await self._call(context, work)

    async def Verify(self, request: pb.VerifyRequest, context: Any) -> pb.VerifyResponse:
        services = self.services

        async def work(tenant: Tenant) -> pb.VerifyResponse:
            known_verifier(request.verifier)
            async with services.limiter.hold(tenant):
                req = await read_message(request, VerifyRequest, tenant)
                out = await verify_one(request.verifier, req, services.settings,
                                       services.executor)
            return convert.message_of(pb.VerifyResponse, out)

        return await self._call(context, work)

    async def ListVerifiers(self, request: pb.ListVerifiersRequest,
                            context: Any) -> pb.ListVerifiersResponse:
        async def work(tenant: Tenant) -> pb.ListVerifiersResponse:
            infos = [v.model_dump(mode="json") for v in catalogue.verifiers()]
            return convert.catalogue_message(pb.ListVerifiersResponse, {"verifiers": infos})

        return await self._call(context, work)

    async def ListEstimators(self, request: pb.ListEstimatorsRequest,
                             context: Any) -> pb.ListEstimatorsResponse:
        async def work(tenant: Tenant) -> pb.ListEstimatorsResponse:
            kind = validate(_KIND, request.kind if request.HasField("kind") else None,
                            ("query", "kind"))
            infos = [e.model_dump(mode="json") for e in catalogue.estimators(kind)]
            return convert.catalogue_message(pb.ListEstimatorsResponse, {"estimators": infos})

        return await self._call(context, work)

    # ---- jobs ----------------------------------------------------------------------------

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Any) -> pb.JobSubmitted:
        services = self.services

        async def work(tenant: Tenant) -> pb.JobSubmitted:
            key = (validate(_IDEMPOTENCY_KEY, request.idempotency_key,
                            ("header", "Idempotency-Key"))
                   if request.HasField("idempotency_key") else None)
            req = await read_message(request.request, ScoreRequest, tenant)
            job, created = await services.jobs.submit(tenant, req, key)
            return convert.message_of(pb.JobSubmitted, {
                "id": job.id, "state": job.state, "existing": not created,
                "links": {"status": f"/v1/jobs/{job.id}",
                          "events": f"/v1/jobs/{job.id}/events"}})

        return await self._call(context, work)

    async def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.JobStatus:
        async def work(tenant: Tenant) -> pb.JobStatus:
            jobs = self.services.jobs
            job = await jobs.own(tenant, request.id)
            out = convert.message_of(pb.JobStatus, job.view())
            raw = await jobs.result(job)
            if raw is not None and job.kind == SCORE:  # a reverify job's result: over REST
                result = await asyncio.to_thread(
                    lambda: convert.score_response(orjson.loads(raw)))
                out.result.CopyFrom(result)
            return out

        return await self._call(context, work)

    async def CancelJob(self, request: pb.CancelJobRequest, context: Any) -> pb.JobStatus:
        async def work(tenant: Tenant) -> pb.JobStatus:
            jobs = self.services.jobs
            job = await jobs.cancel(await jobs.own(tenant, request.id))
            return convert.message_of(pb.JobStatus, job.view())

        return await self._call(context, work)

    async def ListRuns(self, request: Any, context: Any) -> pb.RunList:
        async def work(tenant: Tenant) -> pb.RunList:
            limit = bounded(request, "limit", 100, 1, MAX_PAGE)
            body = await RunRecords.of(self.services, tenant.name).list(limit)
            return convert.message_of(pb.RunList, body.model_dump())

        return await self._call(context, work)

    async def GetRun(self, request: Any, context: Any) -> pb.RunView:
        async def work(tenant: Tenant) -> pb.RunView:
            steps = bounded(request, "steps", DEFAULT_STEPS, 0, MAX_PAGE)
            view = await RunRecords.of(self.services, tenant.name).view(request.run_id, steps)
            return convert.message_of(pb.RunView, view.model_dump(exclude_none=True))

        return await self._call(context, work)

    async def WatchJob(self, request: pb.WatchJobRequest,
                       context: Any) -> AsyncIterator[pb.JobEvent]:
        jobs = self.services.jobs

        async def start(tenant: Tenant) -> tuple[Job, int, StreamHold]:
            job = await jobs.own(tenant, request.id)
            after = str(request.after) if request.HasField("after") else None
            after_id = await jobs.resume_after(job.id, after, ("after",))
            # RESOURCE_EXHAUSTED past the tenant's bound, before the stream starts
            return job, after_id, StreamHold(self.services.runtime, tenant.name)

        job, after, hold = await self._call(context, start)
        try:
            async for item in jobs.watch(job.id, after):
                if item is None:  # a heartbeat: gRPC has its own keepalive
                    continue
                if isinstance(item, JobProgressTick):
                    yield pb.JobEvent(progress=pb.JobProgress(done=item.done, total=item.total))
                    continue
                data = orjson.loads(item.data)
                if item.kind in FINAL:
                    yield pb.JobEvent(seq=item.seq, end=convert.message_of(pb.JobEnd, data))
                else:
                    yield pb.JobEvent(seq=item.seq,
                                      group=convert.message_of(pb.GroupEvent, data))
        finally:
            hold.release()


def bounded(request: Any, name: str, default: int, low: int, high: int) -> int:
    """An optional int64 of a request, within [low, high] (else INVALID_ARGUMENT naming it),
    as the REST route's query parameter of the same name."""
    if not request.HasField(name):
        return default
    value = getattr(request, name)
    if not low <= value <= high:
        raise RequestInvalid([error(("body", name), f"must be between {low} and {high}, "
                                    f"not {value}")])
    return int(value)
