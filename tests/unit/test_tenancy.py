"""API keys, tenants and per-tenant limits, in one API process (state in memory).

The same behaviour with state in Redis, shared by several API pods, is tested in
tests/integration/test_shared_state.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from rewardd.service.app import create_app
from rewardd.service.limits import MemoryLimiter
from rewardd.service.runstate import MemoryRunStore
from rewardd.service.settings import Settings
from rewardd.service.tenancy import DEFAULT_TENANT, KeysInvalid, Tenant, load_keys
from tests.support.executors import GatedExecutor
from rewardd.workers.executor import Executor

KEYS = "key-alice=alice,key-alice-2=alice,key-bob=bob"
ALICE = {"Authorization": "Bearer key-alice"}
ALICE_2 = {"Authorization": "Bearer key-alice-2"}
BOB = {"Authorization": "Bearer key-bob"}

HA_DW = {"estimator": "dr_grpo", "reweight": [{"name": "ha_dw"}], "output": "scalar"}


def score_body(groups: int = 1) -> dict[str, Any]:
    return {"groups": [{"group_id": f"g{g}", "prompt": "p", "reference": {"answer": "1"},
                        "rollouts": [{"rollout_id": f"g{g}r{r}", "completion": "1",
                                      "num_tokens": 2} for r in range(2)]}
                       for g in range(groups)],
            "rewards": [{"name": "m", "verifier": "exact_match"}],
            "advantage": {"estimator": "grpo"}}


def advantages_body(rewards: list[float], run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "advantage": HA_DW,
            "groups": [{"group_id": "g", "rollouts": [
                {"rollout_id": f"r{i}", "reward": r} for i, r in enumerate(rewards)]}]}


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://rewardd")


def keyed_app(executor: Executor | None = None, **settings: Any) -> Any:
    return create_app(Settings(api_keys=KEYS, **settings), executor=executor or GatedExecutor())


# ---- key configuration ----------------------------------------------------------------


def test_inline_keys_map_to_tenants_with_the_default_limits() -> None:
    ring = load_keys(Settings(api_keys=KEYS, tenant_max_concurrent_jobs=3,
                              max_body_bytes=1000))
    assert ring.enabled
    assert ring.lookup("key-alice") == Tenant("alice", 3, 1000)
    assert ring.lookup("key-alice-2") == Tenant("alice", 3, 1000)
    assert ring.lookup("key-bob").name == "bob"
    assert ring.lookup("key-carol") is None
    assert not load_keys(Settings()).enabled


def test_key_file_sets_limits_per_tenant_and_never_above_the_server_body_limit(
        tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"tenants": {
        "alice": {"keys": ["ka"], "max_concurrent_jobs": 2, "max_body_bytes": 100},
        "bob": {"keys": ["kb1", "kb2"], "max_body_bytes": 10**12}}}))
    ring = load_keys(Settings(api_keys_file=str(path), api_keys="kc=carol",
                              tenant_max_concurrent_jobs=5, max_body_bytes=5000))
    assert ring.lookup("ka") == Tenant("alice", 2, 100)
    assert ring.lookup("kb2") == Tenant("bob", 5, 5000)
    assert ring.lookup("kc") == Tenant("carol", 5, 5000)


@pytest.mark.parametrize(("inline", "document", "message"), [
    ("just-a-key", None, "`key=tenant`"),
    ("k=alice,k=bob", None, "two tenants"),
    ("", {"tenants": {"a": {"keys": "k"}}}, "list of non-empty strings"),
    ("", {"tenants": {"a": {"keys": ["k"], "max_concurrent_jobs": 0}}},
     "max_concurrent_jobs must be a positive integer"),
    ("", {"tenants": {"a": {"keys": ["k"], "max_jobs": 3}}}, "unknown field"),
    ("", {"keys": ["k"]}, "expected"),
    ("", "not json", "REWARDD_API_KEYS_FILE"),
])
def test_bad_key_configuration_is_refused_with_the_reason(
        tmp_path: Path, inline: str, document: Any, message: str) -> None:
    file = None
    if document is not None:
        path = tmp_path / "keys.json"
        path.write_text(document if isinstance(document, str) else json.dumps(document))
        file = str(path)
    with pytest.raises(KeysInvalid, match=message):
        load_keys(Settings(api_keys=inline, api_keys_file=file))
    with pytest.raises(KeysInvalid, match=message):  # the server refuses to start with it
        create_app(Settings(api_keys=inline, api_keys_file=file), executor=GatedExecutor())


# ---- authentication ---------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"},
                                     {"Authorization": "key-alice"},
                                     {"Authorization": "Basic a2V5LWFsaWNl"}])
async def test_without_a_valid_key_every_v1_route_answers_401(headers: dict[str, str]) -> None:
    executor = GatedExecutor()
    async with client(keyed_app(executor)) as http:
        for method, path, body in (("POST", "/v1/score", score_body()),
                                   ("POST", "/v1/advantages", advantages_body([1, 0], "r")),
                                   ("POST", "/v1/verify/exact_match",
                                    {"completion": "1", "reference": {"answer": "1"}}),
                                   ("GET", "/v1/verifiers", None),
                                   ("GET", "/v1/runs/r", None),
                                   ("DELETE", "/v1/runs/r", None)):
            resp = await http.request(method, path, json=body, headers=headers)
            assert resp.status_code == 401, (path, resp.text)
            assert resp.headers["www-authenticate"] == "Bearer"
            assert "API key" in resp.json()["detail"]
    assert executor.entered == 0


async def test_probes_need_no_key_and_valid_keys_pass() -> None:
    async with client(keyed_app()) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/metrics")).status_code == 401  # tests/unit/test_metric_labels.py
        assert (await http.get("/metrics", headers=ALICE)).status_code == 200
        assert (await http.get("/v1/verifiers", headers=ALICE)).status_code == 200
        assert (await http.get("/v1/verifiers",
                               headers={"Authorization": "bearer  key-bob "})).status_code == 200


async def test_without_configured_keys_everyone_is_the_default_tenant() -> None:
    app = create_app(Settings(), executor=GatedExecutor())
    async with client(app) as http:
        resp = await http.post("/v1/advantages", json=advantages_body([1, 0], "run"))
        assert resp.status_code == 200
    assert app.state.services.runs.view(f"{DEFAULT_TENANT}/run") is not None


# ---- run state isolation ------------------------------------------------------------------


async def test_run_state_is_visible_only_to_its_tenant() -> None:
    app = keyed_app()
    async with client(app) as http:
        assert (await http.post("/v1/advantages", json=advantages_body([1, 0, 0, 0], "run-1"),
                                headers=ALICE)).status_code == 200
        mine = await http.get("/v1/runs/run-1", headers=ALICE_2)  # same tenant, other key
        assert mine.status_code == 200
        assert mine.json()["state"]["ha_dw"]["batches"] == 1
        assert (await http.get("/v1/runs/run-1", headers=BOB)).status_code == 404
        # bob's run of the same name is his own: it starts from scratch ...
        bob = await http.post("/v1/advantages", json=advantages_body([1, 1, 1, 1], "run-1"),
                              headers=BOB)
        assert bob.json()["report"]["ha_dw"]["batches"] == 1
        # ... his reset does not touch alice's
        reset = await http.delete("/v1/runs/run-1", headers=BOB)
        assert reset.json() == {"run_id": "run-1", "reset": True}
        alice = (await http.get("/v1/runs/run-1", headers=ALICE)).json()
        assert alice["state"]["ha_dw"] == {"anchor": 0.25, "batches": 1}


def test_tenant_views_of_one_store_do_not_overlap() -> None:
    store = MemoryRunStore()
    alice, bob = store.for_tenant("alice"), store.for_tenant("bob")
    alice.put("r", "k", {"v": 1})
    bob.put("r", "k", {"v": 2})
    assert alice.get("r", "k") == {"v": 1} and bob.get("r", "k") == {"v": 2}
    assert alice.reset("r") and alice.view("r") is None
    assert bob.view("r") == {"k": {"v": 2}}


# ---- limits -----------------------------------------------------------------------------


async def test_a_tenant_at_its_limit_gets_429_with_retry_after_and_others_do_not() -> None:
    executor = GatedExecutor()
    app = keyed_app(executor, tenant_max_concurrent_jobs=1, retry_after_s=7)
    async with client(app) as http:
        first = asyncio.create_task(http.post("/v1/score", json=score_body(), headers=ALICE))
        while executor.entered < 1:
            await asyncio.sleep(0.01)
        busy = await http.post("/v1/score", json=score_body(), headers=ALICE_2)
        assert busy.status_code == 429
        assert busy.headers["retry-after"] == "7"
        assert "'alice'" in busy.json()["detail"] and "retry after 7 s" in busy.json()["detail"]
        assert executor.entered == 1  # the refused request started nothing
        rewards_only = {k: v for k, v in score_body().items() if k != "advantage"}
        other = asyncio.create_task(http.post("/v1/rewards", json=rewards_only, headers=BOB))
        while executor.entered < 2:
            assert not other.done(), other.result().text  # bob must not be refused
            await asyncio.sleep(0.01)
        executor.gate.set()
        assert (await first).status_code == 200
        assert (await other).status_code == 200
        # the slot was released: alice may score again
        again = await http.post("/v1/score", json=score_body(), headers=ALICE)
        assert again.status_code == 200
        assert again.json()["summary"]["rollouts"] == 2


async def test_a_failed_request_gives_its_slot_back() -> None:
    app = keyed_app(tenant_max_concurrent_jobs=1)
    async with client(app) as http:
        bad = score_body()
        bad["rewards"][0]["verifier"] = "no_such_verifier"
        for _ in range(3):
            assert (await http.post("/v1/score", json=bad, headers=ALICE)).status_code == 422
    assert await app.state.services.limiter.in_use(Tenant("alice", 1, 1)) == 0


async def test_body_limit_is_per_tenant(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"tenants": {"small": {"keys": ["ks"], "max_body_bytes": 200},
                                            "big": {"keys": ["kb"]}}}))
    app = create_app(Settings(api_keys_file=str(path)), executor=GatedExecutor())
    body = advantages_body([1.0, 0.0, 0.0, 1.0], "r")
    async with client(app) as http:
        small = await http.post("/v1/advantages", json=body,
                                headers={"Authorization": "Bearer ks"})
        assert small.status_code == 413
        assert "max_body_bytes of tenant 'small'" in small.json()["detail"]
        big = await http.post("/v1/advantages", json=body, headers={"Authorization": "Bearer kb"})
        assert big.status_code == 200


async def test_memory_limiter_counts_slots_and_force_ignores_the_limit() -> None:
    limiter = MemoryLimiter(retry_after_s=1)
    tenant = Tenant("t", 2, 1)
    assert await limiter.acquire(tenant, "a") and await limiter.acquire(tenant, "b")
    assert not await limiter.acquire(tenant, "c")
    assert await limiter.acquire(tenant, "a")  # renewing a held slot always succeeds
    assert await limiter.acquire(tenant, "c", force=True)
    assert await limiter.in_use(tenant) == 3
    await limiter.release(tenant, "a")
    await limiter.release(tenant, "c")
    assert await limiter.in_use(tenant) == 1
    async with limiter.hold(tenant) as slot:
        assert await limiter.in_use(tenant) == 2 and slot
    assert await limiter.in_use(tenant) == 1
