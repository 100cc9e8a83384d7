"""Builds the FastAPI application: routers, middleware, error handlers and the executor."""

from __future__ import annotations

import asyncio
import importlib
import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import torch
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from rewardd.service import __version__
from rewardd.service.api import catalogue, compat, health, jobs, runs, score, sessions, verify
from rewardd.service.codec import BodyError
from rewardd.service.disconnect import CancelOnDisconnect
from rewardd.service.errors import ServiceError
from rewardd.service.logs import RequestContext
from rewardd.service.metrics import MetricsMiddleware
from rewardd.service.openapi import build_openapi
from rewardd.service.limits import STATE_RETRY_AFTER_S, state_errors, state_unavailable_detail
from rewardd.service.runtime import start_executor
from rewardd.service.services import build_services
from rewardd.service.services import install as install_services
from rewardd.service.settings import Settings, get_settings
from rewardd.service import ui
from rewardd.advantages.errors import RequestInvalid
from rewardd.workers.executor import Executor

DESCRIPTION = ("rewardd verifies and judges rollout groups and returns rewards plus per-token "
               "advantages ready for the policy loss. Bodies are JSON or msgpack "
               "(Content-Type: application/msgpack, application/vnd.msgpack or "
               "application/x-msgpack), responses likewise (Accept: one of them; the "
               "response carries the msgpack type asked for).")


def load_plugins(settings: Settings) -> None:
    """Import verifier plugins so the API knows their names and parameters."""
    for module in settings.plugin_modules:
        importlib.import_module(module)


def create_app(settings: Settings | None = None, executor: Executor | None = None) -> FastAPI:
    """The application. Without ``executor`` it starts (and stops) the one the settings
    ask for (:func:`rewardd.service.runtime.start_executor`)."""
    settings = settings or get_settings()
    load_plugins(settings)
    torch.set_num_threads(settings.torch_threads)

    # a bad key file stops the start here, with the reason
    services = build_services(settings, executor)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = services.runtime
        owned = executor is None
        if owned:
            runtime.attach_executor(await start_executor(settings))
        await services.jobs.runner.start()  # resumes jobs whose API pod died (Redis store)
        await services.sessions.start()  # group timeouts, idle sessions, a dead pod's checks
        grpc_server = None
        if settings.grpc_port is not None:  # the same calls over gRPC, on this event loop
            from rewardd.service.grpc import server as grpc_api

            grpc_server, services.grpc_port = await grpc_api.start(services)
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_api.stop(grpc_server)
            await services.jobs.runner.close()
            await services.sessions.stop()
            if owned:
                runtime.executor.close()
            if runtime.redis is not None:
                await runtime.redis.aclose()
            await asyncio.to_thread(runtime.records.close)  # writes what is queued

    app = FastAPI(title="rewardd", version=__version__, description=DESCRIPTION,
                  lifespan=lifespan)
    install_services(app, services)
    for router in (score.router, jobs.router, sessions.router, verify.router, catalogue.router,
                   runs.router, compat.router, health.router):
        app.include_router(router)
    ui.mount(app)  # the run inspector's static page, /ui (docs/inspector.md)
    app.add_middleware(CancelOnDisconnect)  # a client that left cancels its work
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(RequestContext)  # outermost: ids bound for every line, access log too
    _add_error_handlers(app)
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestInvalid)
    async def invalid(_: Request, exc: RequestInvalid) -> JSONResponse:
        return JSONResponse({"detail": exc.errors}, status_code=422)

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        # every typed failure of the request logic, one mapping (gRPC: grpc.errors.status_of)
        return JSONResponse({"detail": exc.message}, status_code=exc.status,
                            headers=exc.headers())

    async def state_down(_: Request, exc: Exception) -> JSONResponse:
        # Redis unreachable (tenant limiter, job store, run state, Celery publish): typed,
        # with Retry-After, on every route; /healthz does not touch Redis and stays 200
        return JSONResponse({"detail": state_unavailable_detail(exc)}, status_code=503,
                            headers={"Retry-After": str(STATE_RETRY_AFTER_S)})

    for error in state_errors():
        app.add_exception_handler(error, state_down)

    @app.exception_handler(BodyError)
    async def bad_body(_: Request, exc: BodyError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_params(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                  for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Any:
        # A path served by several routes (GET and DELETE /v1/jobs/{id}): Starlette's 405
        # names only the first route's methods in Allow; RFC 9110 wants all of the path's.
        if exc.status_code == 405:
            exc.headers = {**(exc.headers or {}), "Allow": allowed_methods(request)}
        return await http_exception_handler(request, exc)


HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """Every method some route fully matches on the request's path, as an ``Allow`` value
    (asked of each route through ``matches``: included routers wrap their routes)."""
    routes = request.app.router.routes
    return ", ".join(m for m in HTTP_METHODS
                     if any(r.matches({**request.scope, "method": m})[0] == Match.FULL
                            for r in routes))


def render_openapi() -> str:
    """The document as committed in ``openapi/openapi.json`` (stable key order, final newline)."""
    return json.dumps(create_app().openapi(), indent=2, sort_keys=True) + "\n"
