"""Jobs in one API process: the memory store, the runner and the routes, with a real
embedded executor (real worker processes) and the faulty test verifiers.

The Redis store, real Celery workers and API pod restarts: tests/integration/test_jobs.py.
Waits poll with a generous bound that only guards against a hang; no assertion is on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any, AsyncIterator, Iterator

import httpx
import msgpack
import orjson
import pytest

from rewardd.service.app import create_app
from rewardd.service.jobs.store import MemoryJobStore
from rewardd.service.models import JobStatus, JobSubmitted, ScoreResponse
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant
from tests.support.jobs import final, wait_until
from rewardd.workers.embedded import EmbeddedExecutor

PLUGINS = "tests.plugins.faulty"
KEYS = "ka=alice,kb=bob"
ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}


@pytest.fixture(scope="module")
def executor() -> Iterator[EmbeddedExecutor]:
    pool = EmbeddedExecutor(2, (PLUGINS,))
    assert asyncio.run(pool.ready(wait_s=120.0))
    yield pool
    pool.close()


@contextlib.asynccontextmanager
async def serving(executor: EmbeddedExecutor, **settings: Any
                  ) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The app with its lifespan (the job runner is closed at the end) and a client."""
    app = create_app(Settings(plugins=PLUGINS, **settings), executor=executor)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://rewardd") as http:
            yield app, http


def echo_body(groups: int = 3, values: tuple[str, ...] = ("0", "1", "0.25")) -> dict[str, Any]:
    """Groups whose rewards are the completions (test_echo), plus a precomputed component on
    one group only (so a group event must see the batch's precomputed columns)."""
    body = {"groups": [{"group_id": f"g{g}", "prompt": "p", "rollouts": [
        {"rollout_id": f"g{g}r{r}", "completion": v, "num_tokens": 3}
        for r, v in enumerate(values)]} for g in range(groups)],
        "rewards": [{"name": "echo", "verifier": "test_echo"},
                    {"name": "half", "verifier": "test_echo", "weight": 0.5}],
        "advantage": {"estimator": "grpo", "output": "dense"}}
    body["groups"][0]["rollouts"][0]["rewards"] = {"bonus": 1.0}
    return body


def slow_body(seconds: float = 60.0, groups: int = 2, fast_group: bool = False
              ) -> dict[str, Any]:
    """Groups whose first rollout sleeps ``seconds`` (test_sleep, limit 100 s); with
    ``fast_group`` one more group answers at once."""
    body = {"groups": [{"group_id": f"slow{g}", "rollouts": [
        {"rollout_id": f"slow{g}r{r}", "completion": c} for r, c in enumerate(["zz", "1"])]}
        for g in range(groups)],
        "rewards": [{"name": "s", "verifier": "test_sleep", "timeout_s": 100,
                     "params": {"seconds": seconds, "when": ["zz"]}}],
        "advantage": {"estimator": "grpo", "output": "scalar"}}
    if fast_group:
        body["groups"].insert(0, {"group_id": "fast", "rollouts": [
            {"rollout_id": "fast0", "completion": "1"}, {"rollout_id": "fast1",
                                                         "completion": "0"}]})
    return body


async def state_of(http: httpx.AsyncClient, job_id: str, headers: dict | None = None) -> str:
    return (await http.get(f"/v1/jobs/{job_id}", headers=headers)).json()["state"]


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Events of an event stream: {"id", "event", "data"} (comments dropped)."""
    out = []
    for block in text.split("\n\n"):
        event: dict[str, Any] = {"id": None}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            event[name] = int(value) if name == "id" else value
        if "event" in event:
            event["data"] = orjson.loads(event["data"])
            out.append(event)
    return out


def pool_workers(executor: EmbeddedExecutor) -> set[int]:
    return set(executor._pool._pool_manager.worker_manager.workers)


def pool_started_tasks(executor: EmbeddedExecutor) -> int:
    tasks = executor._pool._pool_manager.task_manager.tasks
    return sum(1 for task in list(tasks.values()) if task.started)


# ---- submit, poll, result ---------------------------------------------------------------


async def test_a_job_gives_exactly_the_score_response(executor: EmbeddedExecutor) -> None:
    body = echo_body()
    async with serving(executor) as (app, http):
        assert isinstance(app.state.services.jobs.store, MemoryJobStore)
        resp = await http.post("/v1/jobs", json=body)
        assert resp.status_code == 202, resp.text
        submitted = JobSubmitted.model_validate(resp.json())
        assert len(submitted.id) == 32 and int(submitted.id, 16) >= 0
        assert resp.headers["location"] == f"/v1/jobs/{submitted.id}"
        assert submitted.links.events == f"/v1/jobs/{submitted.id}/events"
        job = await final(http, submitted.id)
        assert job["state"] == "succeeded", job
        JobStatus.model_validate(job)
        assert job["progress"] == {"done": 3 * 3 * 2, "total": 3 * 3 * 2}
        assert job["error"] is None and job["attempts"] == 1
        assert job["created_at"] <= job["started_at"] <= job["finished_at"]
        direct = await http.post("/v1/score", json=body)
        assert direct.status_code == 200
        assert job["result"] == direct.json()
        ScoreResponse.model_validate(job["result"])
        packed = await http.get(f"/v1/jobs/{submitted.id}",
                                headers={"Accept": "application/msgpack"})
        assert packed.headers["content-type"] == "application/msgpack"
        assert msgpack.unpackb(packed.content)["result"] == direct.json()
        assert app.state.services.jobs.store.counts()["succeeded"] == 1
        assert await app.state.services.limiter.in_use(Tenant("default", 1, 1)) == 0


async def test_a_job_body_in_msgpack_is_read_like_score(executor: EmbeddedExecutor) -> None:
    async with serving(executor) as (_, http):
        resp = await http.post("/v1/jobs", content=msgpack.packb(echo_body(1)),
                               headers={"Content-Type": "application/msgpack"})
        assert resp.status_code == 202
        job = await final(http, resp.json()["id"])
        assert job["state"] == "succeeded"
        assert job["result"]["summary"]["rollouts"] == 3


async def test_an_invalid_body_is_a_422_at_submit_and_no_job(executor: EmbeddedExecutor) -> None:
    async with serving(executor, tenant_max_concurrent_jobs=1) as (app, http):
        unknown = echo_body(1)
        unknown["rewards"][0]["verifier"] = "no_such_verifier"
        resp = await http.post("/v1/jobs", json=unknown)
        assert resp.status_code == 422
        assert resp.json()["detail"][0]["loc"][:3] == ["body", "rewards", 0]
        typo = echo_body(1)
        typo["groups"][0]["rollouts"][0]["completon"] = "1"
        assert (await http.post("/v1/jobs", json=typo)).status_code == 422
        assert (await http.post("/v1/jobs", content=b"{nope")).status_code == 400
        assert sum(app.state.services.jobs.store.counts().values()) == 0
        assert await app.state.services.limiter.in_use(Tenant("default", 1, 1)) == 0


# ---- idempotency ------------------------------------------------------------------------


async def test_a_retried_submit_with_the_same_key_returns_the_same_job(
        executor: EmbeddedExecutor) -> None:
    async with serving(executor) as (app, http):
        slow = slow_body(seconds=60)
        first = await http.post("/v1/jobs", json=slow, headers={"Idempotency-Key": "batch-7"})
        assert first.status_code == 202
        job_id = first.json()["id"]
        # while it runs: same key, same request (other key order, explicit default) -> same
        same = dict(reversed(list(slow.items())))
        same["rewards"] = [{**slow["rewards"][0], "weight": 1.0}]
        again = await http.post("/v1/jobs", json=same, headers={"Idempotency-Key": "batch-7"})
        assert again.status_code == 200
        assert again.json()["id"] == job_id
        assert again.headers["location"] == f"/v1/jobs/{job_id}"
        # same key, another body: refused, and nothing new is created
        other = await http.post("/v1/jobs", json=slow_body(seconds=59),
                                headers={"Idempotency-Key": "batch-7"})
        assert other.status_code == 422
        [detail] = other.json()["detail"]
        assert detail["loc"] == ["header", "Idempotency-Key"]
        assert detail["type"] == "idempotency_key_reused"
        assert job_id in detail["msg"]
        counts = app.state.services.jobs.store.counts()
        assert sum(counts.values()) == 1
        # another key is another job
        fresh = await http.post("/v1/jobs", json=echo_body(1),
                                headers={"Idempotency-Key": "batch-8"})
        assert fresh.status_code == 202 and fresh.json()["id"] != job_id
        await http.delete(f"/v1/jobs/{job_id}")
        # after it finished (here: cancelled) the key still names it
        after = await http.post("/v1/jobs", json=slow, headers={"Idempotency-Key": "batch-7"})
        assert after.status_code == 200
        assert after.json() == {"id": job_id, "state": "cancelled",
                                "links": {"status": f"/v1/jobs/{job_id}",
                                          "events": f"/v1/jobs/{job_id}/events"}}


async def test_concurrent_submits_with_one_key_make_one_job(executor: EmbeddedExecutor) -> None:
    async with serving(executor) as (app, http):
        answers = await asyncio.gather(*(http.post("/v1/jobs", json=echo_body(1),
                                                   headers={"Idempotency-Key": "k"})
                                         for _ in range(4)))
        assert sorted(a.status_code for a in answers) == [200, 200, 200, 202]
        assert len({a.json()["id"] for a in answers}) == 1
        await final(http, answers[0].json()["id"])
        assert sum(app.state.services.jobs.store.counts().values()) == 1


async def test_an_overlong_idempotency_key_is_a_422(executor: EmbeddedExecutor) -> None:
    async with serving(executor) as (_, http):
        resp = await http.post("/v1/jobs", json=echo_body(1),
                               headers={"Idempotency-Key": "k" * 256})
        assert resp.status_code == 422


# ---- cancel -----------------------------------------------------------------------------


async def test_cancelling_a_running_job_stops_its_calls_and_frees_the_pool(
        executor: EmbeddedExecutor) -> None:
    async with serving(executor, tenant_max_concurrent_jobs=1) as (app, http):
        before = pool_workers(executor)
        resp = await http.post("/v1/jobs", json=slow_body(seconds=60, groups=2))
        job_id = resp.json()["id"]
        await wait_until(lambda: pool_started_tasks(executor) == 2, "both slow calls to run")
        assert await state_of(http, job_id) == "running"
        cancelled = await http.delete(f"/v1/jobs/{job_id}")
        assert cancelled.status_code == 200
        body = cancelled.json()
        assert body["state"] == "cancelled" and body["finished_at"] is not None
        assert body["result"] is None
        assert await state_of(http, job_id) == "cancelled"
        # the workers sleeping for the job were stopped and replaced, well before the 60 s
        # sleep or the 100 s limit would have freed them
        await wait_until(lambda: not pool_workers(executor) & before,
                         "the job's workers to be replaced")
        await wait_until(lambda: len(pool_workers(executor)) == 2, "the pool to refill")
        # the slot is free again and the pool serves the next job
        await wait_until(lambda: _free(app), "the tenant slot to be released")
        nxt = await http.post("/v1/jobs", json=echo_body(1))
        assert nxt.status_code == 202
        assert (await final(http, nxt.json()["id"]))["state"] == "succeeded"
        # cancelling again is harmless
        again = await http.delete(f"/v1/jobs/{job_id}")
        assert again.status_code == 200 and again.json()["state"] == "cancelled"
        assert app.state.services.jobs.store.counts()["cancelled"] == 1


async def _free(app: Any) -> bool:
    return await app.state.services.limiter.in_use(Tenant("default", 1, 1)) == 0


async def test_cancelling_a_finished_job_keeps_its_final_state(
        executor: EmbeddedExecutor) -> None:
    async with serving(executor) as (_, http):
        job_id = (await http.post("/v1/jobs", json=echo_body(1))).json()["id"]
        done = await final(http, job_id)
        resp = await http.delete(f"/v1/jobs/{job_id}")
        assert resp.status_code == 200
        assert resp.json()["state"] == "succeeded"
        assert resp.json()["finished_at"] == done["finished_at"]
        assert (await http.get(f"/v1/jobs/{job_id}")).json()["result"] == done["result"]


# ---- events -------------------------------------------------------------------------------


async def test_the_event_stream_has_every_group_then_the_end(executor: EmbeddedExecutor) -> None:
    async with serving(executor) as (_, http):
        job_id = (await http.post("/v1/jobs", json=echo_body(4))).json()["id"]
        job = await final(http, job_id)
        stream = await http.get(f"/v1/jobs/{job_id}/events")
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(stream.text)
        stored = [e for e in events if e["id"] is not None]
        assert [e["id"] for e in stored] == list(range(1, 6))
        assert [e["event"] for e in stored] == ["group"] * 4 + ["succeeded"]
        assert stored[-1]["data"] == {"id": job_id, "state": "succeeded", "error": None}
        groups = {e["data"]["group_id"]: e["data"] for e in stored[:-1]}
        assert set(groups) == {"g0", "g1", "g2", "g3"}
        # a group event says what the result will say about that group's rewards
        for result_group in job["result"]["groups"]:
            event = groups[result_group["group_id"]]
            assert event["group_index"] == int(result_group["group_id"][1:])
            for mine, theirs in zip(event["rollouts"], result_group["rollouts"], strict=True):
                for name in ("rollout_id", "reward", "rewards", "status", "excluded"):
                    assert mine[name] == theirs[name], (name, mine, theirs)
        # g0's first rollout carries a precomputed component the others lack
        assert groups["g0"]["rollouts"][0]["reward"] == 0 + 0.5 * 0 + 1.0
        assert groups["g1"]["rollouts"][0]["excluded"] is True
        assert groups["g1"]["rollouts"][0]["status"]["bonus"]["error"] == "missing"

        resumed = await http.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "3"})
        assert [(e["id"], e["event"]) for e in parse_sse(resumed.text)] == [
            (4, "group"), (5, "succeeded")]
        past = await http.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "5"})
        assert past.status_code == 200 and parse_sse(past.text) == []


async def test_groups_are_published_before_the_job_ends(executor: EmbeddedExecutor) -> None:
    async with serving(executor) as (app, http):
        job_id = (await http.post("/v1/jobs", json=slow_body(60, groups=1,
                                                             fast_group=True))).json()["id"]

        async def fast_group_published() -> bool:
            events = await app.state.services.jobs.store.events(job_id)
            return any(e.kind == "group" and orjson.loads(e.data)["group_id"] == "fast"
                       for e in events)

        await wait_until(fast_group_published, "the fast group's event")
        assert await state_of(http, job_id) == "running"
        status = (await http.get(f"/v1/jobs/{job_id}")).json()
        assert status["progress"]["done"] >= 2 and status["progress"]["total"] == 4
        await http.delete(f"/v1/jobs/{job_id}")
        events = parse_sse((await http.get(f"/v1/jobs/{job_id}/events")).text)
        assert [(e["event"], e["data"].get("group_id")) for e in events] == [
            ("group", "fast"), ("cancelled", None)]
        fast = events[0]["data"]
        assert [r["reward"] for r in fast["rollouts"]] == [1.0, 0.0]


# ---- tenants and limits -------------------------------------------------------------------


async def test_another_tenants_job_does_not_exist_for_you(executor: EmbeddedExecutor) -> None:
    async with serving(executor, api_keys=KEYS) as (_, http):
        resp = await http.post("/v1/jobs", json=echo_body(1),
                               headers={**ALICE, "Idempotency-Key": "shared"})
        job_id = resp.json()["id"]
        await final(http, job_id, ALICE)
        missing = uuid.uuid4().hex
        for method, suffix in (("GET", ""), ("GET", "/events"), ("DELETE", "")):
            theirs = await http.request(method, f"/v1/jobs/{job_id}{suffix}", headers=BOB)
            nobody = await http.request(method, f"/v1/jobs/{missing}{suffix}", headers=BOB)
            assert theirs.status_code == nobody.status_code == 404
            assert theirs.json()["detail"].replace(job_id, "X") == \
                nobody.json()["detail"].replace(missing, "X")
        assert (await http.get(f"/v1/jobs/{job_id}", headers=ALICE)).json()["state"] == \
            "succeeded"  # bob's DELETE did nothing
        # bob's idempotency key equal to alice's is his own: a new job
        bobs = await http.post("/v1/jobs", json=echo_body(1),
                               headers={**BOB, "Idempotency-Key": "shared"})
        assert bobs.status_code == 202 and bobs.json()["id"] != job_id
        await final(http, bobs.json()["id"], BOB)
        assert (await http.get(f"/v1/jobs/{bobs.json()['id']}",
                               headers=ALICE)).status_code == 404


async def test_job_routes_need_a_key(executor: EmbeddedExecutor) -> None:
    async with serving(executor, api_keys=KEYS) as (app, http):
        job_id = uuid.uuid4().hex
        for method, path, body in (("POST", "/v1/jobs", echo_body(1)),
                                   ("GET", f"/v1/jobs/{job_id}", None),
                                   ("GET", f"/v1/jobs/{job_id}/events", None),
                                   ("DELETE", f"/v1/jobs/{job_id}", None)):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                resp = await http.request(method, path, json=body, headers=headers)
                assert resp.status_code == 401, (method, path)
                assert resp.headers["www-authenticate"] == "Bearer"
        assert sum(app.state.services.jobs.store.counts().values()) == 0


async def test_jobs_count_toward_the_tenant_limit(executor: EmbeddedExecutor) -> None:
    async with serving(executor, api_keys=KEYS, tenant_max_concurrent_jobs=1,
                       retry_after_s=5) as (app, http):
        slow = (await http.post("/v1/jobs", json=slow_body(60, groups=1),
                                headers=ALICE)).json()["id"]
        busy = await http.post("/v1/jobs", json=echo_body(1), headers=ALICE)
        assert busy.status_code == 429
        assert busy.headers["retry-after"] == "5"
        assert "'alice'" in busy.json()["detail"]
        scoring = await http.post("/v1/score", json=echo_body(1), headers=ALICE)
        assert scoring.status_code == 429  # a job and a scoring request share the limit
        assert sum(app.state.services.jobs.store.counts().values()) == 1  # the refused submit made nothing
        other = await http.post("/v1/jobs", json=echo_body(1), headers=BOB)
        assert other.status_code == 202  # bob has his own limit
        await http.delete(f"/v1/jobs/{slow}", headers=ALICE)
        alice = Tenant("alice", 1, 1)
        await wait_until(lambda: _zero(app, alice), "alice's slot to be released")
        again = await http.post("/v1/jobs", json=echo_body(1), headers=ALICE)
        assert again.status_code == 202
        assert (await final(http, again.json()["id"], ALICE))["state"] == "succeeded"


async def test_a_retry_at_the_limit_returns_the_running_job(executor: EmbeddedExecutor) -> None:
    async with serving(executor, tenant_max_concurrent_jobs=1) as (_, http):
        key = {"Idempotency-Key": "only"}
        first = await http.post("/v1/jobs", json=slow_body(60, groups=1), headers=key)
        retry = await http.post("/v1/jobs", json=slow_body(60, groups=1), headers=key)
        assert retry.status_code == 200 and retry.json()["id"] == first.json()["id"]
        await http.delete(f"/v1/jobs/{first.json()['id']}")


async def _zero(app: Any, tenant: Tenant) -> bool:
    return await app.state.services.limiter.in_use(tenant) == 0


# ---- the store ----------------------------------------------------------------------------


async def test_memory_store_expires_finished_jobs() -> None:
    from rewardd.service.jobs.store import Job

    store = MemoryJobStore(ttl_s=1)
    job = Job(id=uuid.uuid4().hex, tenant="t", tenant_limit=1, total=2, idempotency="d")
    await store.create(job, b"{}", "me")
    assert (await store.start(job.id)).state == "running"
    assert await store.record(job.id, 1, [b"group\n{}"])
    done = await store.finish(job, "succeeded", result=b"{}", done=2)
    assert done.state == "succeeded" and done.done == 2
    # a final job never changes again
    assert (await store.finish(job, "cancelled")).state == "succeeded"
    assert not await store.record(job.id, 0, [b"group\n{}"])
    assert [e.kind for e in await store.events(job.id)] == ["group", "succeeded"]
    assert await store.get_for("other", job.id) is None
    assert await store.get_for("t", "not-an-id") is None
    store._jobs[job.id].expires = 0.0  # as if job_ttl_s had passed
    assert await store.get(job.id) is None
    assert await store.find("t", "d") is None
    assert store.counts() == dict.fromkeys(
        ("queued", "running", "succeeded", "failed", "cancelled"), 0)


async def test_a_quiet_stream_sends_progress_then_keep_alives(
        executor: EmbeddedExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    from rewardd.service import events
    from rewardd.service.jobs import service as jobs_service

    monkeypatch.setattr(events, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(jobs_service, "STREAM_POLL_S", 0.02)
    async with serving(executor) as (_, http):
        job_id = (await http.post("/v1/jobs", json=slow_body(60, groups=1))).json()["id"]
        await wait_until(lambda: pool_started_tasks(executor) == 1, "the slow call to run")
        stream = asyncio.create_task(http.get(f"/v1/jobs/{job_id}/events"))
        await asyncio.sleep(0.5)  # nothing happens meanwhile: the stream keeps itself alive
        await http.delete(f"/v1/jobs/{job_id}")
        text = (await stream).text
        assert ": keep-alive\n\n" in text
        events = parse_sse(text)
        assert events[0] == {"id": None, "event": "progress", "data": {"done": 0, "total": 2}}
        assert events[-1]["event"] == "cancelled" and events[-1]["id"] == 1
