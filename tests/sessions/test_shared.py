"""Sessions in Redis shared by two API pods (two in-process apps on database 6, standing for
two pods behind a load balancer): rollouts, events, long polls and the close on either pod;
a group timeout fired by whichever pod sweeps; the per-tenant limits; an idle session
expired; a pod that stopped beating has its checks taken over. The executor here echoes
float(completion) in process (the checks themselves are not under test; the real workers
are, in tests/faults/test_session_faults.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator, Sequence

import httpx
import pytest
import redis

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.verifiers.base import Outcome
from rewardd.workers.executor import (CallDoneCallback, CallResult, ItemResult,
                                      ProgressCallback, VerifyCall)
from tests.sessions.support import (ECHO, groups_of, rollout, score_groups, spec,
                                    without_diagnostics)
from tests.support.executors import RefusingExecutor

URL = "redis://127.0.0.1:6379/6"


class EchoExecutor(RefusingExecutor):
    """Rewards float(completion) after ``delay_s``; ``hold`` keeps every check waiting."""

    kind = "echo"

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.hold = False
        self.checks = 0

    async def run(self, calls: Sequence[VerifyCall], progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        while self.hold:
            await asyncio.sleep(0.01)
        await asyncio.sleep(self.delay_s)
        self.checks += sum(len(call.samples) for call in calls)
        return [CallResult([ItemResult(Outcome.success(float(s.completion)), 0.0)
                            for s in call.samples]) for call in calls]


@pytest.fixture(autouse=True)
def db() -> redis.Redis:
    client = redis.Redis.from_url(URL)
    client.flushdb()
    yield client
    client.flushdb()


@contextlib.asynccontextmanager
async def pod(executor: Any, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(state_url=URL, plugins="tests.plugins.faulty", **overrides)
    app = create_app(settings, executor=executor)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://rewardd", timeout=60) as http:
            http.app = app  # type: ignore[attr-defined]
            yield http


async def events_of(http: httpx.AsyncClient, sid: str, last: str | None = None
                    ) -> list[tuple[int, str, dict[str, Any]]]:
    headers = {"Last-Event-ID": last} if last else {}
    response = await http.get(f"/v1/sessions/{sid}/events", headers=headers)
    out, event = [], {}
    for line in response.text.split("\n"):
        if not line:
            if "data" in event:
                out.append((int(event["id"]), event["event"], json.loads(event["data"])))
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            event[name] = value
    return out


async def test_two_pods_share_a_session() -> None:
    executor = EchoExecutor()
    groups = groups_of({"a": [1.0, 0.0], "b": [0.5, 0.25], "c": [1.0, 1.0]})
    async with pod(executor) as one, pod(executor) as two:
        sid = (await one.post("/v1/sessions", json=spec(2))).json()["session_id"]
        first = [{**g, "rollouts": g["rollouts"][:1]} for g in groups]
        again = [{"group_id": g["group_id"], "rollouts": g["rollouts"]} for g in groups]
        assert (await one.post(f"/v1/sessions/{sid}/rollouts",
                               json={"groups": first})).json()["accepted"] == 3
        assert (await two.post(f"/v1/sessions/{sid}/rollouts",
                               json={"groups": again})).json() == {"accepted": 3,
                                                                   "duplicates": 3}
        got = (await two.get(f"/v1/sessions/{sid}/groups/b", params={"wait_s": 10})).json()
        assert got["complete"] and got["group"]["final"]
        closed = (await two.post(f"/v1/sessions/{sid}/close")).json()
        assert executor.checks == 6  # the duplicates were not checked again
        events = await events_of(one, sid)
        assert [kind for _, kind, _ in events] == ["group"] * 3 + ["closed"]
        assert [kind for _, kind, _ in await events_of(two, sid, "3")] == ["closed"]
        expected = without_diagnostics((await one.post("/v1/score", json={
            "groups": groups, "rewards": [ECHO], "advantage": spec(2)["advantage"]})).json())
        assert closed["result"] == expected
        published = {data["group_id"]: data for _, kind, data in events if kind == "group"}
        for group in expected["groups"]:
            assert score_groups(published[group["group_id"]]) == group
        assert (await one.get(f"/v1/sessions/{sid}")).json()["state"] == "closed"


async def test_timeouts_limits_and_idle_expiry() -> None:
    executor = EchoExecutor()
    async with pod(executor, session_max_inflight=2, session_idle_timeout_s=1.0) as one, \
            pod(executor) as two:
        sid = (await one.post("/v1/sessions", json=spec(4, group_timeout_s=0.3))).json()[
            "session_id"]
        executor.hold = True
        three = {"group_id": "g", "prompt": "p",
                 "rollouts": [rollout("a", 1.0), rollout("b", 0.0), rollout("c", 1.0)]}
        busy = await one.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [three]})
        assert busy.status_code == 429 and "REWARDD_SESSION_MAX_INFLIGHT" in busy.text
        two_only = {**three, "rollouts": three["rollouts"][:2]}
        assert (await one.post(f"/v1/sessions/{sid}/rollouts",
                               json={"groups": [two_only]})).json()["accepted"] == 2
        executor.hold = False
        got = (await two.get(f"/v1/sessions/{sid}/groups/g", params={"wait_s": 10})).json()
        assert got["group"]["reason"] == "timeout" and got["group"]["arrived"] == 2
        # no request for 1 s: the session expires; its stream ends with the reason. A sweep
        # finds it (every 0.25 s, later on a busy machine): polled, reading does not touch it
        await asyncio.sleep(1.0)
        for _ in range(600):  # 60 s: a bound against a hang, not a measurement
            state = (await two.get(f"/v1/sessions/{sid}")).json()
            if state["state"] != "open":
                break
            await asyncio.sleep(0.1)
        assert state["state"] == "expired" and "REWARDD_SESSION_IDLE_TIMEOUT_S" in state["error"]
        events = await events_of(two, sid)
        assert events[-1][1] == "closed" and events[-1][2]["state"] == "expired"
        assert (await one.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
            {"group_id": "h", "rollouts": [rollout("x", 1.0)]}]})).status_code == 409


async def test_a_pod_that_stopped_beating_has_its_checks_taken_over() -> None:
    stuck, healthy = EchoExecutor(), EchoExecutor()
    stuck.hold = True  # its checks never return, as if its process had died
    async with pod(healthy) as survivor:
        async with pod(stuck) as doomed:
            sid = (await doomed.post("/v1/sessions", json=spec(2))).json()["session_id"]
            await doomed.post(f"/v1/sessions/{sid}/rollouts", json={"groups": groups_of(
                {"a": [1.0, 0.0]})})
            manager = doomed.app.state.services.sessions  # type: ignore[attr-defined]
            await manager.stop()  # no more heartbeats: its owner key expires
            manager.store.beat = _never  # type: ignore[method-assign]
        got = (await survivor.get(f"/v1/sessions/{sid}/groups/a",
                                  params={"wait_s": 30})).json()
        assert got["complete"], got
        assert [r["reward"] for r in got["group"]["rollouts"]] == [1.0, 0.0]
        assert healthy.checks == 2


async def _never(owner: str) -> None:
    return None
