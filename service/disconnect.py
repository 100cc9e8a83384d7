"""A client that goes away cancels its request's work.

Starlette runs a handler to its end whether or not anyone waits for the answer: a trainer
killed mid-batch left its verifier calls running (holding pool workers and the tenant's
slot) and made ``SIGTERM`` wait for them without bound. This middleware runs the request in a
task of its own and, once the body has been read, listens for ``http.disconnect``; when the
client leaves before the response is complete the task is cancelled, which the executors
turn into dropped queue entries and cancelled (embedded) or revoked (Celery) calls, and the
limiter's slot is released by its ``finally``.

Only the routes that compute for the caller are watched (:data:`WATCHED`): a job submitted
with ``POST /v1/jobs`` runs on after its client leaves by design, and streams (job events)
watch for the disconnect themselves.

Hand-written (60 lines) because neither Starlette nor uvicorn offers it: Starlette's
``request.is_disconnected()`` must be polled by every handler, and uvicorn only cancels at
shutdown (``timeout_graceful_shutdown``, which ``rewardd serve`` sets too).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, Callable

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

WATCHED = ("/v1/score", "/v1/rewards", "/v1/advantages", "/v1/verify/", "/get_reward",
           "/verify")
"""Path prefixes of the POST routes whose work is cancelled when their client leaves (the
per-sample trainer protocols' fixed paths included; slime's configured path is not)."""


class CancelOnDisconnect:
    """ASGI middleware: cancel a watched request's handler when its client disconnects."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or not scope.get("path", "").startswith(WATCHED)):
            await self.app(scope, receive, send)
            return
        body_read = asyncio.Event()
        finished = False

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def send_tracked(message: Message) -> None:
            nonlocal finished
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        handler = asyncio.create_task(self.app(scope, receive_body, send_tracked))
        watcher = asyncio.create_task(self._watch(receive, body_read))
        try:
            await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if handler.done():
                handler.result()  # its error, if any, goes to the server as before
                return
            if not finished:  # the client left before its answer: drop the work
                handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handler
        finally:
            for task in (handler, watcher):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    @staticmethod
    async def _watch(receive: Receive, body_read: asyncio.Event) -> None:
        """Return when the client disconnects (after the body: before, the handler reads)."""
        await body_read.wait()
        while (await receive())["type"] != "http.disconnect":
            pass
