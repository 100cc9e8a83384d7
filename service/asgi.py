"""The one shape of rewardd's pure ASGI middlewares (metrics, request context): HTTP
requests go to :meth:`HttpMiddleware.http`, anything else (lifespan) passes through. Pure ASGI
rather than Starlette's BaseHTTPMiddleware, which buffers streaming responses and runs the
app in a task of its own (breaking context variables)."""

from __future__ import annotations

from typing import Any


class HttpMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: dict, receive: Any, send: Any) -> None:
        raise NotImplementedError
