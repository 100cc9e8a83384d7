"""Wire formats: JSON (orjson) and msgpack, both ways, chosen by Content-Type and Accept.

Request bodies are read here rather than by FastAPI's body parameters because FastAPI only
decodes JSON; one reader serves both formats, enforces the body size limit while streaming
(413 before the whole body is buffered), and hands a dict to the pydantic model.

msgpack goes by three media types: ``application/vnd.msgpack`` (the IANA registration),
``application/msgpack`` (what most clients send) and ``application/x-msgpack`` (older ones).
Each is read as a request body, and a response is msgpack when ``Accept`` names one of them
with a quality at least that of ``application/json``; it carries the type the client named,
so a client that only knows one of them gets that one back.
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
from rewardd.advantages.checks import pydantic_errors
from rewardd.advantages.errors import RequestInvalid

MSGPACK = "application/msgpack"
VND_MSGPACK = "application/vnd.msgpack"
MSGPACK_TYPES = (MSGPACK, VND_MSGPACK, "application/x-msgpack")
"""Every msgpack media type read and answered (the documented ones first)."""
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
    raise BodyError(415, f"unsupported Content-Type {media!r}; send {JSON}, {MSGPACK} or "
                    f"{VND_MSGPACK}")


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


def _quality(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(max(float(value), 0.0), 1.0)
            except ValueError:
                return 0.0  # a malformed weight accepts nothing rather than everything
    return 1.0


def msgpack_type(accept: str) -> str | None:
    """The msgpack media type to answer an ``Accept`` header with, or None for JSON.

    msgpack when a msgpack type is listed with a quality above 0 and not below that of
    ``application/json``; of several msgpack types, the highest quality, then the first.
    Wildcards (``*/*``) never choose msgpack: JSON is what a client that names nothing reads.
    """
    best, best_q, json_q = None, 0.0, 0.0
    for item in accept.split(","):
        media, *params = item.split(";")
        media, q = media.strip().lower(), _quality(params)
        if media in MSGPACK_TYPES and q > best_q:
            best, best_q = media, q
        elif media == JSON:
            json_q = max(json_q, q)
    return best if best is not None and best_q >= json_q else None


def wants_msgpack(request: Request) -> bool:
    return msgpack_type(request.headers.get("accept", "")) is not None


def render(request: Request, payload: Any, status: int = 200) -> Response:
    """Serialise ``payload`` as msgpack when the client accepts it (in the msgpack media type
    it named), else JSON."""
    with gc_paused():
        media = msgpack_type(request.headers.get("accept", ""))
        if media is not None:
            return Response(msgpack.packb(payload, default=_msgpack_default, use_bin_type=True),
                            status_code=status, media_type=media)
        return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
                        status_code=status, media_type=JSON)
