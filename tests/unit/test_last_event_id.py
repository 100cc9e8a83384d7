"""``Last-Event-ID`` on a job's event stream (issue 15, row 9), for both job stores.

``99999999999999999999999`` answered 200 and then a cut-off stream on the Redis store (LRANGE
takes signed 64-bit indexes). The header must now be an id the stream has sent (0 to the
latest event's id); anything else is a 422 naming the header, before the stream starts.
The Redis store uses its own database (:data:`STATE_DB`), flushed before and after.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import httpx
import pytest
import redis

from rewardd.service.app import create_app
from rewardd.service.jobs.store import MemoryJobStore, RedisJobStore
from rewardd.service.settings import Settings
from tests.support.executors import GatedExecutor
from tests.support.jobs import final
from tests.unit.test_jobs import parse_sse

STATE_DB = 14
"""A Redis database of its own (integration tests use 11, judge fleet tests 12, e2e 7)."""
STATE_URL = f"redis://127.0.0.1:6379/{STATE_DB}"

BODY = {"groups": [{"group_id": f"g{g}", "reference": {"answer": "1"}, "rollouts": [
    {"rollout_id": f"g{g}r{r}", "completion": "1"} for r in range(2)]} for g in range(2)],
    "rewards": [{"name": "m", "verifier": "exact_match"}], "advantage": {"output": "scalar"}}


@contextlib.asynccontextmanager
async def serving(store: str) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    executor = GatedExecutor()
    executor.gate.set()  # every check answers at once
    settings = Settings(pool_size=1, state_url=STATE_URL if store == "redis" else None)
    flush = redis.Redis.from_url(STATE_URL, socket_connect_timeout=3).flushdb
    if store == "redis":
        flush()
    app = create_app(settings, executor=executor)
    try:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://rewardd") as http:
                yield app, http
    finally:
        if store == "redis":
            flush()


def refusal(last: int, shown: str) -> dict[str, Any]:
    return {"detail": [{"loc": ["header", "Last-Event-ID"], "type": "value_error", "msg": (
        f"must be the id of an event this job's stream has sent: an integer from 0 to {last} "
        f"(its latest event so far); got {shown!r}. Omit the header to read the stream from "
        "its start")}]}


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_last_event_id_must_name_an_event_the_stream_sent(store: str) -> None:
    async with serving(store) as (app, http):
        kind = RedisJobStore if store == "redis" else MemoryJobStore
        assert isinstance(app.state.services.jobs.store, kind)
        job_id = (await http.post("/v1/jobs", json=BODY)).json()["id"]
        assert (await final(http, job_id))["state"] == "succeeded"
        url = f"/v1/jobs/{job_id}/events"
        last = await app.state.services.jobs.store.last_event(job_id)
        assert last >= 1  # the end at least (this executor reports no finished group)
        every = list(range(1, last + 1))

        for header in ("99999999999999999999999", "9223372036854775808", str(last + 1),
                       "-1", "abc", "1.0", "\u00b2", "0x1"):
            resp = await http.get(url, headers={"Last-Event-ID": header.encode("latin-1")})
            assert resp.status_code == 422, (header, resp.text)
            assert resp.json() == refusal(last, header), header
        long = "9" * 60
        resp = await http.get(url, headers={"Last-Event-ID": long})
        assert resp.json() == refusal(last, long[:37] + "...")

        def ids(resp: httpx.Response) -> list[int]:
            assert resp.status_code == 200, resp.text
            return [e["id"] for e in parse_sse(resp.text)]

        assert ids(await http.get(url)) == every
        assert ids(await http.get(url, headers={"Last-Event-ID": "  "})) == every
        assert ids(await http.get(url, headers={"Last-Event-ID": "0"})) == every
        assert ids(await http.get(url, headers={"Last-Event-ID": " 1 "})) == every[1:]
        assert ids(await http.get(url, headers={"Last-Event-ID": str(last)})) == []


async def test_a_job_with_no_event_yet_accepts_only_zero() -> None:
    async with serving("memory") as (app, http):
        executor = app.state.services.executor
        executor.gate.clear()  # the checks wait: no group event is stored
        job_id = (await http.post("/v1/jobs", json=BODY)).json()["id"]
        url = f"/v1/jobs/{job_id}/events"
        resp = await http.get(url, headers={"Last-Event-ID": "1"})
        assert resp.json() == refusal(0, "1")
        await http.delete(f"/v1/jobs/{job_id}")
        resp = await http.get(url, headers={"Last-Event-ID": "0"})
        assert [e["event"] for e in parse_sse(resp.text)] == ["cancelled"]
