"""The run inspector: a static web page served at ``/ui`` (docs/inspector.md).

The page is packaged files (``static/``: HTML, CSS, plain ES modules and the vendored uPlot,
declared as package data so they are in the wheel); nothing is built or fetched at run time.
Loading it needs no key: it holds no data. Everything it shows it asks of the ``/v1`` API
with the caller's key, so it sees what that key's tenant sees and nothing more.

Every answer carries a Content-Security-Policy that allows scripts, styles and requests from
this origin only: the page shows model-written completions, and although it renders them as
text, a policy that runs no inline or foreign script is the second line of defence.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.responses import RedirectResponse, Response
from starlette.routing import Match, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

PATH = "/ui"

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")


class InspectorFiles(StaticFiles):
    """The page's files, each answer with the policy above; revalidated by ETag on every
    load (``no-cache``), so an upgraded server never runs a browser's stale module."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-cache")
        return response


class InspectorMount(Mount):
    """The files' mount, named as the request's route like the API's routes are, so the
    HTTP metrics count every file of the page under one label, ``/ui`` (a plain mount
    leaves them ``unmatched``, beside scans of paths that are not there)."""

    def matches(self, scope: Scope) -> tuple[Match, dict[str, Any]]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


def mount(app: FastAPI) -> None:
    """Serve the inspector at ``/ui/`` (``/ui`` redirects there, so the page's relative
    module URLs resolve); outside the OpenAPI document, which describes the API."""

    @app.get(PATH, include_in_schema=False)
    async def inspector() -> RedirectResponse:
        return RedirectResponse(f"{PATH}/", status_code=308)

    app.router.routes.append(InspectorMount(
        PATH, InspectorFiles(packages=[(__name__, "static")], html=True), name="inspector"))
