"""The API's side of logging: a request id per request, bound for every log line written
while serving it (:mod:`rewardd.workers.logs` holds the formats and the context).

The id is the caller's ``X-Request-ID`` when it is a plain token (``[A-Za-z0-9._:-]``, at
most 128 characters: it lands in log lines verbatim, so nothing else is trusted), else a new
random one; either way it is sent back as ``X-Request-ID`` so a trainer can quote it in a bug
report. The tenant is read from the request's state once its API key resolved it
(:func:`rewardd.service.api.deps.current_tenant`), so lines written before that carry none.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from rewardd.service.asgi import HttpMiddleware
from rewardd.workers.logs import bound

HEADER = b"x-request-id"
_TOKEN = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def request_id(scope: dict[str, Any]) -> str:
    """The caller's X-Request-ID if it is a plain token, else a new one."""
    for name, value in scope.get("headers") or ():
        if name == HEADER and _TOKEN.fullmatch(value):
            return value.decode()
    return uuid.uuid4().hex


class RequestContext(HttpMiddleware):
    """Binds ``request_id`` (and the request state, for ``tenant``) around the request and
    returns the id as ``X-Request-ID``."""

    async def http(self, scope: dict, receive: Any, send: Any) -> None:
        rid = request_id(scope)

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid.encode())]}
            await send(message)

        with bound(request_id=rid, state=scope.setdefault("state", {})):
            await self.app(scope, receive, send_with_id)
