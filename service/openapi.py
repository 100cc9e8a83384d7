"""The OpenAPI document: FastAPI's, plus the request models the routes read themselves."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from rewardd.service.api.bodies import BODY_MODELS as READ_BY_ROUTES
from rewardd.service.models import AdvantagesRequest, RewardsRequest, ScoreRequest, VerifyRequest

BODY_MODELS = (ScoreRequest, RewardsRequest, AdvantagesRequest, VerifyRequest)


def build_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description,
                      routes=app.routes)
    models = [*BODY_MODELS, *(READ_BY_ROUTES[name] for name in sorted(READ_BY_ROUTES))]
    _, defs = models_json_schema([(m, "validation") for m in dict.fromkeys(models)],
                                 ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in defs.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    app.openapi_schema = doc
    return doc
