"""Jobs with state in Redis (database 11) and verifiers on real ``rewardd worker`` processes.

In-process apps stand for API pods: two apps on the same Redis see the same jobs. The last
test runs real ``rewardd serve`` processes and SIGKILLs the one running a job: a second
server resumes it from Redis and it succeeds with the result of an uninterrupted run.
Waits poll with a generous bound that only guards against a hang; no assertion is on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterator

import httpx
import orjson
import pytest
import redis
import redis.asyncio

import tests.plugins.faulty  # noqa: F401 - registers the test verifiers here (validation)
from rewardd.service.app import create_app
from rewardd.service.jobs.store import (ACTIVE_SET, Job, RedisJobStore, idem_key, key_digest,
                                state_key)
from rewardd.service.tenancy import Tenant
from tests.integration.conftest import make_settings, worker_env
from tests.support.jobs import HANG_GUARD_S, final, wait_until
from tests.support.server import REPO_ROOT, free_port

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}


@pytest.fixture(scope="module")
def workers(fleet_for: Any) -> Any:
    fleet = fleet_for(make_settings())
    fleet.start(1, concurrency=2)
    return fleet


@contextlib.asynccontextmanager
async def pod(**overrides: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """One API pod: an app with the Celery executor and Redis state (its own lifespan)."""
    app = create_app(make_settings(**overrides))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://rewardd", timeout=60) as http:
            yield app, http


def echo_body(groups: int = 3) -> dict[str, Any]:
    return {"groups": [{"group_id": f"g{g}", "rollouts": [
        {"rollout_id": f"g{g}r{r}", "completion": v, "num_tokens": 2}
        for r, v in enumerate(["0", "1", "0.5"])]} for g in range(groups)],
        "rewards": [{"name": "echo", "verifier": "test_echo"}],
        "advantage": {"estimator": "grpo", "output": "rle"}}


def sleepy_body(groups: int, seconds: float, timeout_s: float) -> dict[str, Any]:
    """Each group: one rollout that sleeps ``seconds`` (then 1.0, or a timeout past
    ``timeout_s``) and two echoes, so the rewards differ and advantages are not all 0."""
    return {"groups": [{"group_id": f"s{g}", "rollouts": [
        {"rollout_id": f"s{g}r{r}", "completion": c} for r, c in enumerate(["zz", "0", "1"])]}
        for g in range(groups)],
        "rewards": [{"name": "s", "verifier": "test_sleep", "timeout_s": timeout_s,
                     "params": {"seconds": seconds, "when": ["zz"]}}],
        "advantage": {"estimator": "grpo", "output": "scalar"}}


def job_keys(client: redis.Redis, job_id: str) -> dict[str, int]:
    return {key.decode(): client.ttl(key) for key in client.scan_iter(f"rewardd:job:{job_id}*")}


# ---- submit, poll, result, TTL ----------------------------------------------------------


async def test_a_job_in_redis_gives_the_score_response_and_expires(
        workers: Any, redis_db: redis.Redis) -> None:
    body = echo_body()
    async with pod(job_ttl_s=600) as (app, http), pod() as (_, other):
        assert isinstance(app.state.services.jobs.store, RedisJobStore)
        resp = await http.post("/v1/jobs", json=body, headers={"Idempotency-Key": "ttl"})
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
        assert job_id.encode() in redis_db.smembers(ACTIVE_SET)
        job = await final(other, job_id)  # any pod answers
        assert job["state"] == "succeeded", job
        assert job["progress"] == {"done": 9, "total": 9}
        direct = await http.post("/v1/score", json=body)
        assert job["result"] == direct.json()
        keys = job_keys(redis_db, job_id)
        assert set(keys) == {f"rewardd:job:{job_id}", f"rewardd:job:{job_id}:result",
                             f"rewardd:job:{job_id}:events"}  # body and lease deleted
        assert all(0 < ttl <= 600 for ttl in keys.values()), keys
        idem = idem_key("default", key_digest("ttl"))
        assert 0 < redis_db.ttl(idem) <= 600
        assert redis_db.get(idem).decode() == job_id
        assert job_id.encode() not in redis_db.smembers(ACTIVE_SET)
        assert redis_db.zscore(state_key("succeeded"), job_id) is not None
        assert app.state.services.jobs.store.counts()["succeeded"] >= 1
        assert await app.state.services.limiter.in_use(Tenant("default", 1, 1)) == 0


async def test_idempotency_and_isolation_hold_across_pods(workers: Any) -> None:
    keys = "ka=alice,kb=bob"
    async with pod(api_keys=keys) as (_, one), pod(api_keys=keys) as (_, two):
        body = echo_body(2)
        first = await one.post("/v1/jobs", json=body, headers={**ALICE, "Idempotency-Key": "k"})
        assert first.status_code == 202
        job_id = first.json()["id"]
        again = await two.post("/v1/jobs", json=body, headers={**ALICE, "Idempotency-Key": "k"})
        assert again.status_code == 200 and again.json()["id"] == job_id
        changed = echo_body(3)
        reused = await two.post("/v1/jobs", json=changed,
                                headers={**ALICE, "Idempotency-Key": "k"})
        assert reused.status_code == 422
        assert reused.json()["detail"][0]["type"] == "idempotency_key_reused"
        bobs = await two.post("/v1/jobs", json=body, headers={**BOB, "Idempotency-Key": "k"})
        assert bobs.status_code == 202 and bobs.json()["id"] != job_id
        for method, suffix in (("GET", ""), ("GET", "/events"), ("DELETE", "")):
            resp = await two.request(method, f"/v1/jobs/{job_id}{suffix}", headers=BOB)
            assert resp.status_code == 404
            assert resp.json() == {"detail": f"no job {job_id!r}"}
        assert (await final(two, job_id, ALICE))["state"] == "succeeded"
        assert (await final(one, bobs.json()["id"], BOB))["state"] == "succeeded"


# ---- cancel -----------------------------------------------------------------------------


async def test_a_cancel_through_another_pod_stops_the_job_and_revokes_its_tasks(
        workers: Any, redis_db: redis.Redis) -> None:
    (worker,) = workers.workers
    body = sleepy_body(groups=4, seconds=30.0, timeout_s=2.0)  # 2 run, 2 wait in the queue
    async with pod() as (owner, one), pod() as (_, two):
        job_id = (await one.post("/v1/jobs", json=body)).json()["id"]
        await wait_until(lambda: len(owner.state.services.executor.collector.waiters) == 4,
                         "the job's four tasks to be published")
        resp = await two.delete(f"/v1/jobs/{job_id}")
        assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
        # the owning pod notices at its next lease renewal and stops waiting
        await wait_until(lambda: not owner.state.services.jobs.runner.running(),
                         "the owning pod to stop the job")
        # the executor dropped the job's waiters as the job stopped (not as results came)
        assert not owner.state.services.executor.collector.waiters
        await wait_until(lambda: "Tasks flagged as revoked" in worker.output(),
                         "the worker to hear the revoke")
        assert (await one.get(f"/v1/jobs/{job_id}")).json()["state"] == "cancelled"
        events = [line for line in (await two.get(f"/v1/jobs/{job_id}/events")).text.split("\n")
                  if line.startswith("event: ")]
        assert events[-1] == "event: cancelled"
        assert set(job_keys(redis_db, job_id)) == {f"rewardd:job:{job_id}",
                                                   f"rewardd:job:{job_id}:events"}
        assert all(ttl > 0 for ttl in job_keys(redis_db, job_id).values())
        await wait_until(lambda: _free(owner), "the tenant slot to be released")
        # the worker still serves (the two running sleeps end at their 2 s limits)
        nxt = (await two.post("/v1/jobs", json=echo_body(1))).json()["id"]
        assert (await final(one, nxt))["state"] == "succeeded"


async def _free(app: Any) -> bool:
    return await app.state.services.limiter.in_use(Tenant("default", 1, 1)) == 0


# ---- the store's transitions, as two pods see them ---------------------------------------


async def test_exactly_one_pod_claims_an_orphan_and_a_cancel_is_final(
        redis_db: redis.Redis) -> None:
    client = redis.asyncio.Redis.from_url(make_settings().broker_url)
    try:
        # a lease long enough to outlast the checks made while pod-a holds it on a machine
        # of any speed; the test then waits for it to lapse
        pods = [RedisJobStore(client, ttl_s=60, lease_s=2.0) for _ in range(3)]
        job = Job(id=uuid.uuid4().hex, tenant="t", tenant_limit=1, total=2)
        await pods[0].create(job, b"{}", "pod-a")
        assert await pods[0].start(job.id) is not None
        assert await pods[1].orphans() == []  # pod-a holds the lease
        assert not await pods[1].claim(job.id, "pod-b")
        async def orphaned() -> bool:
            return job.id in await pods[1].orphans()

        await wait_until(orphaned, "pod-a's lease to expire")
        wins = await asyncio.gather(*(store.claim(job.id, f"pod-{n}")
                                      for n, store in enumerate(pods[1:], start=1)
                                      for _ in range(5)))
        assert sum(wins) == 1
        assert await pods[0].renew(job.id, "pod-a") == "lost"  # pod-a learns it lost the job
        winner = "pod-1" if redis_db.get(f"rewardd:job:{job.id}:lease") == b"pod-1" else "pod-2"
        assert await pods[0].renew(job.id, winner) == "ok"
        cancelled = await pods[2].finish(job, "cancelled")
        assert cancelled.state == "cancelled"
        late = await pods[1].finish(job, "succeeded", result=b"{}", done=2)
        assert late.state == "cancelled"  # a late success never overwrites the cancel
        assert await pods[1].result(job.id) is None
        assert not await pods[1].record(job.id, 2, [b"group\n{}"])
        assert await pods[1].renew(job.id, winner) == "cancelled"
        assert [e.kind for e in await pods[1].events(job.id)] == ["cancelled"]
        assert not await pods[1].claim(job.id, "pod-x")
    finally:
        await client.aclose()


# ---- an API pod dies --------------------------------------------------------------------


@contextlib.contextmanager
def server_process() -> Iterator[tuple[str, subprocess.Popen]]:
    """A real ``rewardd serve`` on the test broker (Redis state), SIGKILLed at the end."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = worker_env(make_settings())
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rewardd.service.cli", "serve", "--host", "127.0.0.1", "--port",
             str(port)], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"rewardd serve exited:\n{log.read().decode(errors='replace')}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                        break
                assert time.monotonic() < deadline, "rewardd serve was not ready in 90 s"
                time.sleep(0.25)
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


def wait_sync(predicate: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def test_a_job_survives_the_death_of_its_api_pod(workers: Any, redis_db: redis.Redis) -> None:
    body = sleepy_body(groups=6, seconds=1.5, timeout_s=10.0)
    with server_process() as (url, first):
        job_id = httpx.post(f"{url}/v1/jobs", json=body, timeout=30).json()["id"]

        def some_progress() -> bool:
            job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
            assert job["state"] in ("queued", "running"), job
            return job["progress"]["done"] > 0

        wait_sync(some_progress, "the job to make progress")
        first.send_signal(signal.SIGKILL)  # the pod dies mid-job: no cleanup at all
        first.wait(timeout=10)
    assert redis_db.hget(f"rewardd:job:{job_id}", "state") == b"running"
    with server_process() as (url, _):
        def finished() -> dict[str, Any] | None:
            job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
            return job if job["state"] in ("succeeded", "failed", "cancelled") else None

        job = wait_sync(finished, "the resumed job to finish")
        assert job["state"] == "succeeded", job
        assert job["attempts"] == 2
        uninterrupted = httpx.post(f"{url}/v1/score", json=body, timeout=120)
        assert uninterrupted.status_code == 200
        assert job["result"] == uninterrupted.json()
        assert job["result"]["summary"]["failed_cells"] == 0
        # the stream, read for real: every group once (the resumed run does not repeat the
        # groups published before the crash), then the end
        events = []
        with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", timeout=30) as stream:
            kind = None
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line[len("event: "):]
                elif line.startswith("data: ") and kind != "progress":
                    events.append((kind, orjson.loads(line[len("data: "):])))
        groups = [data["group_id"] for kind, data in events if kind == "group"]
        assert sorted(groups) == [f"s{g}" for g in range(6)]
        assert events[-1][0] == "succeeded"
        by_id = {g["group_id"]: g for g in job["result"]["groups"]}
        for kind, data in events[:-1]:
            assert [r["reward"] for r in data["rollouts"]] == \
                [r["reward"] for r in by_id[data["group_id"]]["rollouts"]]
    assert not redis_db.sismember(ACTIVE_SET, job_id)
