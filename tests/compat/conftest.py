"""Fixtures of the trainer-protocol tests: one real embedded verifier pool for the session, and
apps over it with the compat configuration each test names (the routes, the pipeline and the
verifiers are all real; requests go through httpx's ASGI transport)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Iterator

import httpx
import pytest

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.workers.embedded import EmbeddedExecutor


@pytest.fixture(scope="session")
def executor() -> Iterator[EmbeddedExecutor]:
    pool = EmbeddedExecutor(1)
    assert asyncio.run(pool.ready(wait_s=120.0))
    yield pool
    pool.close()


def make_app(executor: Any, config: dict[str, Any] | None = None, **settings: Any) -> Any:
    """An app whose REWARDD_COMPAT_CONFIG is ``config`` (inline JSON; None: unset)."""
    compat = json.dumps(config) if config is not None else None
    return create_app(Settings(compat_config=compat, **settings), executor=executor)


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://rewardd",
                             timeout=120)
