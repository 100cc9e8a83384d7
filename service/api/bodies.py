"""OpenAPI description of bodies the routes read themselves (JSON or msgpack).

Routes read bodies with :func:`rewardd.service.codec.read_model`, so FastAPI cannot infer their
schemas; these helpers state them, and :mod:`rewardd.service.openapi` adds the models to the
document's components.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from rewardd.service.codec import JSON, MSGPACK, VND_MSGPACK
from rewardd.service.models import ErrorResponse


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def msgpack_content(model: type[BaseModel]) -> dict[str, Any]:
    """``model`` in the documented msgpack media types (``application/x-msgpack`` is read
    and answered too, but not advertised)."""
    return {media: {"schema": _ref(model)} for media in (MSGPACK, VND_MSGPACK)}


BODY_MODELS: dict[str, type[BaseModel]] = {}
"""Every model :func:`body` was given: :mod:`rewardd.service.openapi` puts them in the
document's components, where the routes' ``$ref`` point."""


def body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose body is ``model`` in JSON or msgpack."""
    BODY_MODELS[model.__name__] = model
    return {"requestBody": {"required": True, "content": {
        JSON: {"schema": _ref(model)}, **msgpack_content(model)}}}


def responses(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The 200 body (JSON or msgpack by Accept) and the documented error bodies."""
    return {
        200: {"model": model, "content": msgpack_content(model)},
        400: {"model": ErrorResponse, "description": "Body is not valid JSON or msgpack."},
        413: {"model": ErrorResponse, "description": "Body over REWARDD_MAX_BODY_BYTES or the tenant's max_body_bytes."},
        415: {"model": ErrorResponse, "description": "Unsupported Content-Type."},
        422: {"model": ErrorResponse, "description": "Invalid field: loc names it, msg says why."},
    }


BUSY_RESPONSE: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorResponse, "description": "The tenant already runs as many requests "
          "(score, rewards, advantages, verify) and jobs as it may; retry after the "
          "`Retry-After` header's seconds.",
          "headers": {"Retry-After": {"schema": {"type": "integer"},
                                      "description": "Seconds to wait before retrying."}}}}
