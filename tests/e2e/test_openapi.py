"""The committed OpenAPI document and examples are the v1 contract; they must match the code.

No server is started (so no ``e2e`` marker): the document is rendered from the app in-process.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from rewardd.service.models import AdvantagesRequest, ScoreRequest
from rewardd.service.app import render_openapi
from tests.support.server import REPO_ROOT

OPENAPI = REPO_ROOT / "openapi" / "openapi.json"
EXAMPLES = REPO_ROOT / "openapi" / "examples"

V1_PATHS = ["/v1/score", "/v1/rewards", "/v1/advantages", "/v1/verify/{verifier}",
            "/v1/verifiers", "/v1/estimators", "/v1/runs/{run_id}", "/v1/jobs",
            "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/healthz", "/readyz", "/metrics"]
BODIES = {"/v1/score": "ScoreRequest", "/v1/rewards": "RewardsRequest",
          "/v1/advantages": "AdvantagesRequest", "/v1/verify/{verifier}": "VerifyRequest"}


@functools.cache
def rendered() -> str:
    return render_openapi()


def document() -> dict[str, Any]:
    return json.loads(rendered())


def test_committed_document_is_current() -> None:
    assert OPENAPI.read_text() == rendered(), "openapi/openapi.json is stale: run `make openapi`"


@pytest.mark.parametrize("path", V1_PATHS)
def test_contract_paths_present(path: str) -> None:
    assert path in document()["paths"]
    assert path in json.loads(OPENAPI.read_text())["paths"]


@pytest.mark.parametrize("path,model", list(BODIES.items()))
def test_request_bodies_reference_models_in_both_wires(path: str, model: str) -> None:
    doc = document()
    body = doc["paths"][path]["post"]["requestBody"]
    assert body["required"] is True
    for media in ("application/json", "application/msgpack"):
        assert body["content"][media]["schema"] == {"$ref": f"#/components/schemas/{model}"}
    assert model in doc["components"]["schemas"]
    response = doc["paths"][path]["post"]["responses"]
    assert {"200", "413", "422"} <= set(response)
    assert "application/msgpack" in response["200"]["content"]


def test_score_request_schema_names_core_fields() -> None:
    schemas = document()["components"]["schemas"]
    assert {"run_id", "groups", "rewards", "advantage"} <= set(
        schemas["ScoreRequest"]["properties"])
    assert {"rollout_id", "completion", "num_tokens", "token_ids", "mask", "segments",
            "reward", "rewards"} <= set(schemas["Rollout"]["properties"])
    assert {"name", "verifier", "weight", "params", "fallback", "timeout_s"} <= set(
        schemas["RewardSpec"]["properties"])


def test_math_batch_example_is_a_valid_score_request() -> None:
    from rewardd.service import pipeline
    from rewardd.service.settings import Settings

    data = json.loads((EXAMPLES / "math_batch.json").read_text())
    request = ScoreRequest.model_validate(data)
    pipeline.validate_score(request, Settings())  # cross-field rules too
    assert len(request.groups) >= 8
    assert all(len(g.rollouts) >= 4 for g in request.groups)


def test_split_examples_match_the_batch_example() -> None:
    """math_groups.jsonl + math_spec.json are math_batch.json in group-per-line form."""
    batch = json.loads((EXAMPLES / "math_batch.json").read_text())
    spec = json.loads((EXAMPLES / "math_spec.json").read_text())
    groups = [json.loads(line) for line in
              (EXAMPLES / "math_groups.jsonl").read_text().splitlines() if line.strip()]
    assert groups == batch["groups"]
    assert spec == {k: v for k, v in batch.items() if k != "groups"}


def test_advantages_example_is_valid() -> None:
    from rewardd.advantages.checks import validate_advantages

    request = AdvantagesRequest.model_validate(
        json.loads((EXAMPLES / "advantages.json").read_text()))
    validate_advantages(request)


def test_every_v1_route_documents_401_and_scoring_routes_429() -> None:
    paths = document()["paths"]
    for path, methods in paths.items():
        for method, op in methods.items():
            if path.startswith("/v1/"):
                assert "401" in op["responses"], (method, path)
    for path in ("/v1/score", "/v1/rewards", "/v1/jobs"):
        assert "429" in paths[path]["post"]["responses"], path
