"""The REST event streams' response: ``text/event-stream`` holding its tenant's place.

A stream is held against the tenant's bound on open event streams
(:class:`~rewardd.service.holds.StreamHold`, taken by the route before the stream starts, so
past the bound the client gets a typed 429 and no stream) and given back when the response
ends however it ends: finished, the client gone, or the server stopping.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from rewardd.service.holds import StreamHold
from rewardd.service.models import ErrorResponse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _busy(what: str) -> dict[int | str, dict[str, Any]]:
    return {429: {"model": ErrorResponse, "description": f"The tenant already holds as many "
                  f"{what} on this API process as it may; retry after the `Retry-After` "
                  "header's seconds.",
                  "headers": {"Retry-After": {"schema": {"type": "integer"},
                                              "description": "Seconds to wait before "
                                              "retrying."}}}}


STREAMS_BUSY = _busy("open event streams (REWARDD_TENANT_MAX_STREAMS)")
LONG_POLLS_BUSY = _busy("long polls (REWARDD_TENANT_MAX_LONG_POLLS)")


class EventStreamResponse(StreamingResponse):
    """Server-sent events that release ``hold`` once the response is over."""

    def __init__(self, content: AsyncIterator[bytes], hold: StreamHold) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.hold = hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.hold.release()
