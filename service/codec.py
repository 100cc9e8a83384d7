"""Wire formats: JSON (orjson) and msgpack, both ways, chosen by Content-Type and Accept.

Request bodies are read here rather than by FastAPI's body parameters because FastAPI only
decodes JSON; one reader serves both formats, enforces the body size limit while streaming
(413 before the whole body is buffered), and hands a dict to the pydantic model.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgpack
import numpy as np
import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from rewardd.service.gcpause import gc_paused
from rewardd.service.validation import RequestInvalid, pydantic_errors

MSGPACK = "application/msgpack"
MSGPACK_TYPES = {MSGPACK, "application/x-msgpack"}
JSON = "application/json"

M = TypeVar("M", bound=BaseModel)


class BodyError(Exception):
    """A body that cannot be read: too large (413), not decodable (400), wrong type (415)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: Request, max_bytes: int,
                    setting: str = "REWARDD_MAX_BODY_BYTES") -> bytes:
    """The body, refused with 413 once it passes ``max_bytes`` (``setting`` names the limit
    in the message)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyError(413, f"request body of {declared} bytes is over the limit of "
                        f"{max_bytes} bytes ({setting}); split the batch")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyError(413, f"request body is over the limit of {max_bytes} bytes "
                            f"({setting}); split the batch")
        chunks.append(chunk)
    return b"".join(chunks)


def decode(body: bytes, content_type: str) -> Any:
    media = content_type.split(";")[0].strip().lower() or JSON
    if media in MSGPACK_TYPES:
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise BodyError(400, f"body is not valid msgpack: {exc}") from None
    if media == JSON or media.endswith("+json"):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        try:  # the stdlib reads NaN/Infinity, so the model can name the offending field
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BodyError(400, f"body is not valid JSON: {exc}") from None
    raise BodyError(415, f"unsupported Content-Type {media!r}; send {JSON} or {MSGPACK}")


async def read_model(request: Request, model: type[M]) -> M:
    """Read, decode and validate a request body; errors carry the field path under 'body'."""
    limit = request.app.state.settings.max_body_bytes
    setting = "REWARDD_MAX_BODY_BYTES"
    tenant = getattr(request.state, "tenant", None)  # set by service.tenancy.current_tenant
    if tenant is not None and tenant.max_body_bytes < limit:
        limit, setting = tenant.max_body_bytes, f"max_body_bytes of tenant {tenant.name!r}"
    body = await read_body(request, limit, setting)
    with gc_paused():
        data = decode(body, request.headers.get("content-type", JSON))
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise RequestInvalid(pydantic_errors(exc, ("body",))) from None


def _msgpack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def wants_msgpack(request: Request) -> bool:
    return any(t in request.headers.get("accept", "") for t in MSGPACK_TYPES)


def render(request: Request, payload: Any, status: int = 200) -> Response:
    """Serialise ``payload`` as msgpack when the client accepts it, else JSON."""
    with gc_paused():
        if wants_msgpack(request):
            return Response(msgpack.packb(payload, default=_msgpack_default, use_bin_type=True),
                            status_code=status, media_type=MSGPACK)
        return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
                        status_code=status, media_type=JSON)
