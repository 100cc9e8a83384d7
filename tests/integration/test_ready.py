"""Readiness of the Celery executor, the API on Celery workers, and a broker that is down."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import redis

from rewardd_client.client import RewarddClient
from tests.integration.conftest import BROKER_URL, PLUGINS, make_settings, result_keys
from tests.support.server import ServerFailed, running_server
from rewardd.verifiers.base import Sample
from rewardd.workers.celery_app import redact_url
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.executor import VerifyCall

SETTINGS = make_settings()
HANG_S = 60.0  # bounds against a hang, never a measurement


async def test_ready_only_once_a_worker_answers(fleet_for: Any, redis_db: redis.Redis) -> None:
    executor = CeleryExecutor(SETTINGS)
    try:
        started = time.monotonic()
        assert await executor.ready(wait_s=1.0) is False  # no worker consumes "cpu"
        assert time.monotonic() - started < HANG_S  # gave up after its wait, no hang
        census = await executor.census()
        assert census["workers"] == 0
        [worker] = fleet_for(SETTINGS).start(1, concurrency=1)
        deadline = time.monotonic() + 60
        while not await executor.ready(wait_s=2.0):
            assert time.monotonic() < deadline, worker.output()
        census = await executor.census()
        assert census == {"workers": 1, "workers_by_queue": {"cpu": 1},
                          "slots_by_queue": {"cpu": 1}}
        body = executor.describe()
        assert body["kind"] == "celery" and body["broker"] == BROKER_URL
        assert body["workers"] == 1 and body["queues"] == ["cpu", "sandbox", "gpu"]
    finally:
        executor.close()
    # the unanswered ping expired in the queue: the worker discarded it, and what it stored
    # about that carries the TTL
    assert all(0 < ttl <= SETTINGS.result_ttl_s for ttl in result_keys(redis_db).values())


def test_serve_with_a_broker_runs_on_the_workers(fleet_for: Any) -> None:
    """`rewardd serve --broker-url` uses the Celery executor transparently."""
    fleet = fleet_for(SETTINGS)
    if not fleet.workers:
        fleet.start(1, concurrency=1)
    try:
        with running_server("--broker-url", BROKER_URL, "--plugins", PLUGINS) as url:
            ready = httpx.get(f"{url}/readyz", timeout=30).json()
            assert ready["status"] == "ready" and ready["executor"]["kind"] == "celery"
            with RewarddClient(url) as client:
                result = client.score({
                    "rewards": [{"name": "echo", "verifier": "test_echo"}],
                    "advantage": {"estimator": "grpo"},
                    "groups": [{"group_id": "g", "rollouts": [
                        {"rollout_id": "a", "completion": "1", "num_tokens": 4},
                        {"rollout_id": "b", "completion": "3", "num_tokens": 4}]}]})
    except ServerFailed as exc:
        pytest.fail(str(exc))
    rewards = [r["rewards"]["echo"] for r in result["groups"][0]["rollouts"]]
    assert rewards == [1.0, 3.0]


async def test_broker_down_is_unavailable_not_a_hang() -> None:
    executor = CeleryExecutor(make_settings(broker_url="redis://127.0.0.1:1/0"))
    try:
        started = time.monotonic()
        assert await executor.ready(wait_s=2.0) is False
        call = VerifyCall("test_echo", (Sample("1"), Sample("2")), {}, {}, 1.0)
        [result] = await executor.run([call])
        took = time.monotonic() - started
    finally:
        executor.close()
    assert [item.outcome.error.value for item in result.items] == ["unavailable"] * 2
    assert "broker" in result.items[0].outcome.detail["message"]
    assert not result.replayed
    assert took < HANG_S, took  # about 3 s


def test_passwords_stay_out_of_descriptions() -> None:
    assert redact_url("redis://:s3cret@redis.internal:6380/2") == \
        "redis://:***@redis.internal:6380/2"
    assert redact_url("redis://user:s3cret@h/0") == "redis://user:***@h/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
