"""State shared by API pods in Redis: tenant slots, run state, keys; and a Redis restart.

Two in-process apps on the same Redis database stand for two API pods. The restart test runs
its own redis-server on a free port (never the shared one) with a real ``rewardd worker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from typing import Any, AsyncIterator

import httpx
import pytest
import redis
import redis.asyncio

from rewardd.service.app import create_app
from rewardd.service.limits import RedisLimiter
from rewardd.service.runstate import RedisRunStore
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant
from tests.integration.conftest import (BROKER_URL, PLUGINS, WorkerFleet, make_settings,
                                        worker_env)
from tests.support.executors import GatedExecutor, RefusingExecutor
from tests.support.server import free_port
from rewardd.workers.distributed import CeleryExecutor

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
HA_DW = {"estimator": "dr_grpo", "reweight": [{"name": "ha_dw"}], "output": "scalar"}


@contextlib.asynccontextmanager
async def pod(executor: Any = None, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An API pod with state in Redis; ``executor`` given: no Celery executor of its own."""
    app = create_app(make_settings(api_keys="ka=alice,kb=bob", **overrides), executor=executor)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://rewardd", timeout=60) as http:
            yield http


def advantages_body(rewards: list[float], run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "advantage": HA_DW,
            "groups": [{"group_id": "g", "rollouts": [
                {"rollout_id": f"r{i}", "reward": r} for i, r in enumerate(rewards)]}]}


async def test_run_state_is_shared_by_pods_and_isolated_between_tenants(
        redis_db: redis.Redis) -> None:
    executor = RefusingExecutor()
    async with pod(executor) as first, pod(executor) as second:
        one = await first.post("/v1/advantages", json=advantages_body([1, 0, 0, 0], "run-a"),
                               headers=ALICE)
        assert one.json()["report"]["ha_dw"]["batches"] == 1
        # the next batch of the run lands on the other pod and continues the same state
        two = await second.post("/v1/advantages", json=advantages_body([1, 1, 0, 0], "run-a"),
                                headers=ALICE)
        assert two.json()["report"]["ha_dw"]["batches"] == 2
        assert two.json()["report"]["ha_dw"]["anchor_before"] == 0.25
        assert (await first.get("/v1/runs/run-a", headers=BOB)).status_code == 404
        seen = (await first.get("/v1/runs/run-a", headers=ALICE)).json()["state"]
        assert seen["ha_dw"]["batches"] == 2
        assert (await second.delete("/v1/runs/run-a", headers=BOB)).json()["reset"] is False
        assert (await second.delete("/v1/runs/run-a", headers=ALICE)).json()["reset"] is True
        assert (await first.get("/v1/runs/run-a", headers=ALICE)).status_code == 404
    # each run's hash expires on its own
    store = RedisRunStore(redis_db, ttl_s=50)
    store.for_tenant("t").put("r", "k", {"v": [1.5, None]})
    assert store.for_tenant("t").get("r", "k") == {"v": [1.5, None]}
    assert 0 < redis_db.ttl(f"{RedisRunStore.PREFIX}t/r") <= 50
    assert store.for_tenant("u").view("r") is None


async def test_slots_are_counted_across_pods_and_leases_of_a_dead_pod_expire() -> None:
    client = redis.asyncio.Redis.from_url(BROKER_URL)
    try:
        tenant = Tenant("lease-test", 2, 1)
        # long enough that no lease lapses before the checks that count it, however slow the
        # machine; the wait for the lapse below sleeps at least as long
        lease_s = 2.0
        pod_a = RedisLimiter(client, retry_after_s=1, lease_s=lease_s)
        pod_b = RedisLimiter(client, retry_after_s=1, lease_s=lease_s)
        assert await pod_a.acquire(tenant, "a1") and await pod_b.acquire(tenant, "b1")
        assert not await pod_a.acquire(tenant, "a2")  # the limit holds across pods
        # concurrent grabs for the last free slot: exactly one wins
        await pod_b.release(tenant, "b1")
        won = await asyncio.gather(*(RedisLimiter(client, 1, lease_s).acquire(tenant, f"c{i}")
                                     for i in range(8)))
        assert sum(won) == 1 and await pod_a.in_use(tenant) == 2
        assert await pod_a.acquire(tenant, "forced", force=True)
        assert await pod_a.in_use(tenant) == 3
        # pod a "dies": nobody renews; its leases lapse and the tenant is free again
        await asyncio.sleep(lease_s + 0.2)
        assert await pod_b.in_use(tenant) == 0
        assert await pod_b.acquire(tenant, "b2")
    finally:
        await client.aclose()


async def test_429_counts_requests_on_every_pod(redis_db: redis.Redis) -> None:
    gate = GatedExecutor()
    limits = {"tenant_max_concurrent_jobs": 1, "retry_after_s": 3}
    async with pod(gate, **limits) as first, pod(gate, **limits) as second:
        body = {"groups": [{"group_id": "g", "rollouts": [
                    {"rollout_id": "r", "completion": "1", "num_tokens": 1}]}],
                "rewards": [{"name": "m", "verifier": "exact_match"}]}
        held = asyncio.create_task(first.post("/v1/rewards", json=body, headers=ALICE))
        while gate.entered < 1:
            assert not held.done(), held.result().text
            await asyncio.sleep(0.01)
        busy = await second.post("/v1/rewards", json=body, headers=ALICE)
        assert busy.status_code == 429 and busy.headers["retry-after"] == "3"
        gate.gate.set()
        assert (await held).status_code == 200
        assert (await second.post("/v1/rewards", json=body, headers=ALICE)).status_code == 200
    assert redis_db.zcard("rewardd:slots:alice") == 0


# ---- Redis restarted between two requests ----------------------------------------------------


@pytest.fixture
def private_redis() -> Any:
    """A redis-server of our own on a free port (restartable without touching the shared one)."""
    binary = shutil.which("redis-server")
    assert binary, "the Redis restart test needs redis-server on PATH (make test installs it)"
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="rewardd-redis-", suffix=".log")

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"],
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=port, socket_connect_timeout=0.5).ping()
                return proc
            except redis.RedisError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read()
                time.sleep(0.05)

    server = {"proc": start()}

    def restart() -> None:
        server["proc"].terminate()
        server["proc"].wait(timeout=10)
        server["proc"] = start()

    yield port, restart
    server["proc"].terminate()
    server["proc"].wait(timeout=10)
    log.close()


async def test_requests_succeed_again_after_redis_restarts(private_redis: Any) -> None:
    port, restart = private_redis
    settings = Settings(broker_url=f"redis://127.0.0.1:{port}/0", plugins=PLUGINS,
                        result_ttl_s=300)
    fleet = WorkerFleet(worker_env(settings))
    try:
        fleet.start(1, concurrency=1)
        executor = CeleryExecutor(settings)
        app = create_app(settings, executor=executor)
        body = {"groups": [{"group_id": "g", "reference": {"answer": "2"}, "rollouts": [
                    {"rollout_id": f"r{i}", "completion": c, "num_tokens": 1}
                    for i, c in enumerate(["2", "3", "\\boxed{2}"])]}],
                "rewards": [{"name": "m", "verifier": "math"}],
                "advantage": {"estimator": "grpo"}}
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://rewardd", timeout=120) as http:
                before = await http.post("/v1/score", json=body)
                assert before.status_code == 200, before.text
                restart()  # queues, results and state are gone; connections are broken
                deadline = time.monotonic() + 90
                while True:  # a request may meet the broken connections: it must fail typed
                    after = await http.post("/v1/score", json=body)
                    assert after.status_code == 200, after.text
                    cells = [r["status"]["m"] for r in after.json()["groups"][0]["rollouts"]]
                    if all(cell["ok"] for cell in cells):
                        break
                    assert {cell["error"] for cell in cells} <= {None, "unavailable"}, cells
                    assert time.monotonic() < deadline, fleet.workers[0].output()
                    await asyncio.sleep(0.5)
                assert after.json()["groups"] == before.json()["groups"]
        executor.close()
    finally:
        fleet.stop()
