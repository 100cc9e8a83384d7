"""Wire formats: JSON (orjson) and msgpack, both ways, chosen by Content-Type and Accept.

Request bodies are read here rather than by FastAPI's body parameters because FastAPI only
decodes JSON; one reader serves both formats, enforces the body size limit while streaming
(413 before the whole body is buffered), and hands a dict to the pydantic model.

msgpack goes by three media types: ``application/vnd.msgpack`` (the IANA registration),
``application/msgpack`` (what most clients send) and ``application/x-msgpack`` (older ones).
Each is read as a request body, and a response is msgpack when ``Accept`` names one of them
with a quality at least that of ``application/json``; it carries the type the client named,
so a client that only knows one of them gets that one back.

Text is read with the rules it is written with: a string the service accepts is valid
Unicode, so every writer (orjson for JSON responses and job results, msgpack, the Redis job
store, judges' HTTP bodies, sandbox files) can encode it. orjson (the reader and the writer)
refuses a lone UTF-16 surrogate (``"\\ud800"`` without its pair, which RFC 8259 leaves to
the implementation); the stdlib reader we fall back to for ``NaN`` accepts it, and such a
completion used to answer 500 on /v1/verify and /v1/score and lose the batch. Such a string
is now a **422 naming the field** (type ``string_unicode``) on both wires: JSON with an
unpaired ``\\uD800``-``\\uDFFF`` escape, msgpack with a string that is not UTF-8 (msgpack
requires UTF-8; raw bytes belong in ``bin``). Carrying them through was the alternative
(msgpack can write them with ``surrogatepass``), but the bytes it writes are not UTF-8, so
every client's msgpack reader would fail instead, and JSON cannot carry them at all. The
check costs nothing on the usual path: it runs only when orjson or strict msgpack refused
the body (then a walk over the decoded strings names the first bad one).

Nesting depth: both decoders refuse more than 1024 levels (a 400); free-form fields are
bounded far below that by the models (:mod:`rewardd.advantages.bounds`).
"""

from __future__ import annotations

import functools
import json
import re
import time
from typing import Annotated, Any, Iterator, TypeVar

import msgpack
import numpy as np
import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from rewardd.service import heavy
from rewardd.service.gcpause import gc_paused
from rewardd.service.tenancy import Tenant
from rewardd.advantages.checks import pydantic_errors
from rewardd.advantages.errors import Loc, RequestInvalid, error

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
    """The body as Python data; 400 when it is not the format it says, 415 for other
    formats, 422 naming the field for a string that is not valid Unicode."""
    media = content_type.split(";")[0].strip().lower() or JSON
    if media in MSGPACK_TYPES:
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        except UnicodeDecodeError as exc:  # a str that is not UTF-8: name it
            bad = exc
        except Exception as exc:  # msgpack raises several unrelated types
            raise BodyError(400, f"body is not valid msgpack: {exc}") from None
        try:
            data = msgpack.unpackb(body, raw=False, strict_map_key=False,
                                   unicode_errors="surrogateescape")
        except Exception:
            data = None
        refuse_invalid_text(data, "msgpack")
        raise BodyError(400, f"body is not valid msgpack: {bad}")
    if media == JSON or media.endswith("+json"):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        try:  # the stdlib reads NaN/Infinity, so the model can name the offending field
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BodyError(400, f"body is not valid JSON: {exc}") from None
        if _SURROGATE_ESCAPE.search(body):  # it also reads lone surrogates: refuse them
            refuse_invalid_text(data, "JSON")
        return data
    raise BodyError(415, f"unsupported Content-Type {media!r}; send {JSON}, {MSGPACK} or "
                    f"{VND_MSGPACK}")


_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: paired ones are fine, lone ones are not text."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def _strings(data: Any, wire: str) -> Iterator[tuple[Loc, str]]:
    """Every string in decoded data (map keys too) with its path, iteratively."""
    stack: list[tuple[Loc, Any]] = [(("body",), data)]
    while stack:
        loc, node = stack.pop()
        if isinstance(node, str):
            yield loc, node
        elif isinstance(node, dict):
            children = []
            for key, value in node.items():
                if isinstance(key, str):
                    yield loc + (_printable(key, wire),), key
                children.append((loc + (_printable(key, wire) if isinstance(key, str)
                                        else key,), value))
            stack.extend(reversed(children))  # popped in document order
        elif isinstance(node, list):
            stack.extend((loc + (k,), v) for k, v in reversed(list(enumerate(node))))


def _printable(text: str, wire: str) -> str:
    """``text`` as a loc can carry it: lone surrogates as ``\\udXXX`` (JSON), bytes that
    were not UTF-8 as ``\\xXX`` (msgpack)."""
    if wire == "msgpack":
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def refuse_invalid_text(data: Any, wire: str) -> None:
    """Raise a 422 naming the first string in ``data`` that is not valid Unicode (a lone
    surrogate; from msgpack, undecodable bytes kept as ``surrogateescape``)."""
    for loc, text in _strings(data, wire):
        if text.isascii():
            continue
        found = _SURROGATE.search(text)
        if found is None:
            continue
        code, at = ord(found.group()), found.start()
        if wire == "msgpack":
            why = (f"is not valid UTF-8 (byte 0x{code - 0xDC00:02X} at character {at}): "
                   "msgpack strings must be UTF-8; send raw bytes as bin")
        else:
            why = (f"has a lone surrogate \\u{code:04x} at character {at}, which is not "
                   "Unicode text: a \\uD800-\\uDBFF escape must be followed by a "
                   "\\uDC00-\\uDFFF one")
        raise RequestInvalid([error(loc, f"string {why}", "string_unicode")])


async def read_model(request: Request, model: type[M], tenant: Tenant) -> M:
    """Read, decode and validate a request body under the tenant's body limit (a 413 names
    the setting that made it); errors carry the field path under 'body'."""
    body = await read_body(request, tenant.max_body_bytes, tenant.max_body_setting)
    # decoding and validating a large body takes seconds of CPU (a 10^5-group score: ~10 s
    # on the loop, /healthz stalled meanwhile): in a worker thread, like the answer's
    # encoding; a large one in the heavy lane (rewardd.service.heavy)
    heavy.mark(heavy.heavy_body(len(body)))
    return await heavy.offload(parse_model, body, request.headers.get("content-type", JSON),
                               model)


def parse_model(body: bytes, content_type: str, model: type[M]) -> M:
    """Decode and validate a request body (CPU-bound: the routes run it off the event loop)."""
    with gc_paused():
        return validate_model(model, decode(body, content_type))


def validate_model(model: type[M], data: Any) -> M:
    """Validate decoded data as ``model`` (CPU-bound: off the event loop; in the heavy lane
    a ``groups`` list is validated a chunk at a time); errors carry the path under 'body'."""
    with gc_paused():
        try:
            if heavy.in_lane():
                return _validate_in_chunks(model, data)
            return model.model_validate(data)
        except ValidationError as exc:
            raise RequestInvalid(pydantic_errors(exc, ("body",))) from None


def _validate_in_chunks(model: type[M], data: Any) -> M:
    """``model.model_validate(data)`` with ``data["groups"]`` validated
    :data:`~rewardd.service.heavy.VALIDATE_CHUNK_GROUPS` groups at a time, the GIL handed
    over between chunks: one pydantic call over 60,000 rollouts held the GIL for 0.3-1 s.
    The same model and the same first error (its loc counts groups from the request's
    start), since groups are validated one by one and in order either way."""
    size = heavy.VALIDATE_CHUNK_GROUPS
    groups = data.get("groups") if isinstance(data, dict) else None
    if "groups" not in model.model_fields or not isinstance(groups, list) or len(groups) <= size:
        return model.model_validate(data)
    head = model.model_validate({**data, "groups": groups[:size]})
    adapter = _groups_adapter(model)
    validated = list(getattr(head, "groups"))
    for start in range(size, len(groups), size):
        time.sleep(0)  # let a thread waiting for the GIL (the event loop) take it
        try:
            validated.extend(adapter.validate_python(groups[start:start + size]))
        except ValidationError as exc:
            raise RequestInvalid([_shifted(e, start)
                                  for e in pydantic_errors(exc, ("body", "groups"))]) from None
    return head.model_copy(update={"groups": validated})


def _shifted(error: dict[str, Any], start: int) -> dict[str, Any]:
    """An error of a slice of groups from ``start``, its loc counted from group 0."""
    loc = error["loc"]
    if len(loc) > 2 and isinstance(loc[2], int):
        return {**error, "loc": [*loc[:2], loc[2] + start, *loc[3:]]}
    return error


@functools.cache
def _groups_adapter(model: type[BaseModel]) -> TypeAdapter[Any]:
    """A validator of a slice of ``model``'s ``groups`` (its annotation, failing fast)."""
    field = model.model_fields["groups"]
    return TypeAdapter(Annotated[field.annotation, Field(fail_fast=True)])


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
