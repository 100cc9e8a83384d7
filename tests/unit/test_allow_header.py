"""A 405 names every method of its path in ``Allow`` (RFC 9110 15.5.6), also where two routes
serve one path (GET and DELETE /v1/jobs/{id}, /v1/runs/{id}): Starlette's own 405 names only
the first route's methods, which schemathesis's allow_header_conformance found
(tests/fuzz/test_schemathesis.py)."""

from __future__ import annotations

from typing import Iterator

import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as c:
        yield c


@pytest.mark.parametrize(("path", "allow"), [
    ("/v1/jobs/j-1", "DELETE, GET"),
    ("/v1/runs/exp-42", "DELETE, GET"),
    ("/v1/score", "POST"),
    ("/healthz", "GET"),
])
def test_a_405_names_every_method_of_the_path(client: TestClient, path: str, allow: str) -> None:
    response = client.request("PATCH", path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json() == {"detail": "Method Not Allowed"}


def test_other_http_errors_are_unchanged(client: TestClient) -> None:
    response = client.get("/v1/no-such-route")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not Found"}
    assert "allow" not in response.headers
