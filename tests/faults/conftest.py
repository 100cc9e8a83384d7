"""Fault tests: a private redis-server per test (restartable), real ``rewardd worker``
processes (the fleet of tests/integration/conftest.py) and a real CeleryExecutor."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.integration.conftest import WorkerFleet, make_settings, worker_env
from tests.support.redis_server import RedisServer


@pytest.fixture
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A private Redis without persistence (``@pytest.mark.parametrize("redis_server",
    [True], indirect=True)`` for AOF everysec)."""
    server = RedisServer(aof=getattr(request, "param", False)).start()
    yield server
    server.close()


@pytest.fixture
def fleet(redis_server: RedisServer) -> Iterator[Any]:
    """``fleet(**settings)``: (settings, WorkerFleet) on the private Redis; every worker is
    SIGKILLed at the end."""
    fleets: list[WorkerFleet] = []

    def make(**overrides: Any) -> tuple[Any, WorkerFleet]:
        settings = make_settings(broker_url=redis_server.url(), **overrides)
        env = worker_env(settings)
        for name in ("worker_heartbeat_s", "worker_lost_after_s", "queue_routes", "verifier_timeout_s"):
            env[f"REWARDD_{name.upper()}"] = str(getattr(settings, name))
        fleets.append(WorkerFleet(env))
        return settings, fleets[-1]

    yield make
    for each in fleets:
        each.stop()
