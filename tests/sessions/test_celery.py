"""Streaming sessions whose checks go through real ``rewardd worker`` processes (issue #18):
one worker (two prefork children) on Redis database 4, the API in process over a real
CeleryExecutor, its sessions stored in the same Redis (as in distributed mode).

* rollouts of several groups arriving out of order, in partial groups, interleaved; a
  resent rollout is a duplicate (not checked again), a conflicting one a 409 that stores
  nothing of its request;
* the group events equal ``/v1/score`` on the same batch bit for bit (grpo), and a close
  with batch-level estimators (grpo over the batch's std; reinforce_pp with a filter)
  equals ``/v1/score`` too;
* a group timing out completes from what arrived, flagged ``timeout``, with the numbers
  ``/v1/score`` gives those rollouts.

The slow cases (a worker or a pod SIGKILLed) are in tests/faults/test_session_faults.py;
the same flows on the embedded pool in test_embedded.py.
"""

from __future__ import annotations

import re
import time
from typing import Any, AsyncIterator, Iterator, Sequence

import httpx
import pytest
import redis

from rewardd.service.app import create_app
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.executor import CallDoneCallback, CallResult, ProgressCallback, VerifyCall
from tests.integration.conftest import Worker, WorkerFleet, make_settings, worker_env
from tests.sessions.support import (ECHO, groups_of, rollout, score_groups, spec,
                                    without_diagnostics)
from tests.sessions.test_shared import events_of

URL = "redis://127.0.0.1:6379/4"  # this module's database; no other test uses it
SETTINGS = make_settings(broker_url=URL, state_url=URL)
REWARDS = {"a": [1.0, 0.0, 0.5], "b": [0.25, 0.75, 0.0], "c": [1.0, 1.0, 0.0],
           "d": [0.5, 0.0, 0.0], "e": [0.0, 1.0, 0.0]}


def tasks_of(worker: Worker, sid: str) -> int:
    """Tasks of session ``sid`` the worker ran: Celery's line at info, with the flow id
    (the session's id; ``!urgent`` for a group's last checks) the worker's logging adds."""
    return len(re.findall(rf"flow_id={sid}(?:!urgent)? [^\n]* succeeded in", worker.output()))


class CountingExecutor:
    """The module's CeleryExecutor, counting the samples the API hands it: a resent
    rollout must not be among them. Everything else is the real executor's."""

    def __init__(self, inner: CeleryExecutor) -> None:
        self.inner = inner
        self.samples = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def run(self, calls: Sequence[VerifyCall], progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        self.samples += sum(len(call.samples) for call in calls)
        return await self.inner.run(calls, progress, on_call_done)


@pytest.fixture(scope="module")
def db() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(URL, socket_connect_timeout=3, socket_timeout=10)
    try:
        client.ping()
    except redis.RedisError as exc:  # fail, never skip: green must mean workers ran
        pytest.fail(f"these tests need Redis at {URL} ({exc}); `make test` starts it",
                    pytrace=False)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture(scope="module")
def worker(db: redis.Redis) -> Iterator[Worker]:
    fleet = WorkerFleet(worker_env(SETTINGS))
    try:
        yield fleet.start(1, concurrency=2)[0]
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def celery(worker: Worker) -> Iterator[CeleryExecutor]:
    executor = CeleryExecutor(SETTINGS)
    yield executor
    executor.close()


@pytest.fixture
async def http(celery: CeleryExecutor) -> AsyncIterator[httpx.AsyncClient]:
    """An API over the workers (``http.executor``: its counting executor)."""
    executor = CountingExecutor(celery)
    app = create_app(SETTINGS, executor=executor)  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://rewardd", timeout=120) as client:
            client.executor = executor  # type: ignore[attr-defined]
            yield client


async def open_session(http: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await http.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


async def send(http: httpx.AsyncClient, sid: str, groups: list[dict[str, Any]]
               ) -> httpx.Response:
    return await http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": groups})


def part(gid: str, *indices: int, first: bool = False) -> dict[str, Any]:
    """Rollouts ``indices`` of group ``gid`` of REWARDS (prompt and reference on ``first``)."""
    whole = groups_of({gid: REWARDS[gid]})[0]
    out = {"group_id": gid, "rollouts": [whole["rollouts"][i] for i in indices]}
    if first:
        out.update(prompt=whole["prompt"], reference=whole["reference"])
    return out


# (group, rollout indices, first sight?) per request: groups interleaved, each arriving in
# parts and out of its own order; groups first seen in the order c, a, b, d
ARRIVALS: list[list[tuple[str, tuple[int, ...], bool]]] = [
    [("c", (2,), True), ("a", (1,), True)],
    [("b", (0, 2), True)],
    [("a", (2, 0), False), ("c", (0,), False)],
    [("d", (1,), True), ("b", (1,), False)],
    [("c", (1,), False), ("d", (2, 0), False)],
]
ORDER = ["c", "a", "b", "d"]


def as_arrived(gids: list[str]) -> list[dict[str, Any]]:
    """Groups ``gids`` as the session holds them after ARRIVALS: rollouts by arrival."""
    arrival: dict[str, list[int]] = {}
    for request in ARRIVALS:
        for gid, indices, _ in request:
            arrival.setdefault(gid, []).extend(indices)
    return [part(gid, *arrival[gid], first=True) for gid in gids]


async def send_arrivals(http: httpx.AsyncClient, sid: str) -> None:
    for request in ARRIVALS:
        response = await send(http, sid, [part(gid, *indices, first=first)
                                          for gid, indices, first in request])
        assert response.status_code == 200, response.text
        assert response.json() == {"accepted": sum(len(i) for _, i, _ in request),
                                   "duplicates": 0}


async def score(http: httpx.AsyncClient, groups: list[dict[str, Any]],
                advantage: dict[str, Any]) -> dict[str, Any]:
    response = await http.post("/v1/score", json={"groups": groups, "rewards": [ECHO],
                                                  "advantage": advantage})
    assert response.status_code == 200, response.text
    return without_diagnostics(response.json())


async def wait_group(http: httpx.AsyncClient, sid: str, gid: str) -> dict[str, Any]:
    got = (await http.get(f"/v1/sessions/{sid}/groups/{gid}", params={"wait_s": 60})).json()
    assert got["complete"], got
    return got["group"]


async def test_out_of_order_parts_duplicates_and_conflicts(http: httpx.AsyncClient,
                                                           worker: Worker) -> None:
    sid = await open_session(http, spec(3))
    await send_arrivals(http, sid)
    # resent rollouts (a whole group, part of another): duplicates, not checked again
    again = await send(http, sid, [part("a", 0, 1, 2), part("d", 1)])
    assert again.status_code == 200, again.text
    assert again.json() == {"accepted": 0, "duplicates": 4}
    # a conflicting resend (same id, other completion) beside a valid part: 409, nothing kept
    changed = part("b", 1)
    original = changed["rollouts"][0]
    changed["rollouts"][0] = rollout(original["rollout_id"], 0.5, original["num_tokens"])
    conflict = await send(http, sid, [part("e", 0, first=True), changed])
    assert conflict.status_code == 409 and "'b#1'" in conflict.json()["detail"], conflict.text
    other_prompt = {**part("c", 0), "prompt": "another prompt"}
    assert (await send(http, sid, [other_prompt])).status_code == 409
    published = {gid: await wait_group(http, sid, gid) for gid in ORDER}
    status = (await http.get(f"/v1/sessions/{sid}")).json()
    assert status["rollouts"] == 12 and status["groups"] == 4  # nothing of e
    assert status["completed_groups"] == 4
    assert http.executor.samples == 12  # type: ignore[attr-defined] # each rollout once
    for gid, group in published.items():
        sent = as_arrived([gid])[0]["rollouts"]
        assert [r["rollout_id"] for r in group["rollouts"]] == [r["rollout_id"] for r in sent]
        assert [r["reward"] for r in group["rollouts"]] == [float(r["completion"])
                                                            for r in sent]
        assert group["reason"] == "full" and group["arrived"] == 3 and group["final"]
    assert sorted((g["index"], gid) for gid, g in published.items()) == list(enumerate(ORDER))
    closed = (await http.post(f"/v1/sessions/{sid}/close")).json()
    assert closed["state"] == "closed" and closed["summary"]["rollouts"] == 12
    assert http.executor.samples == 12  # type: ignore[attr-defined] # the close checks nothing
    # the checks ran on the worker, in tasks of one sample or more
    assert 1 <= tasks_of(worker, sid) <= 12, worker.output()[-3000:]


async def test_group_events_and_batch_close_equal_score(http: httpx.AsyncClient) -> None:
    grpo = spec(3)["advantage"]
    sid = await open_session(http, spec(3))
    await send_arrivals(http, sid)
    # each group is final before the close (grpo is group-level)
    for gid in ORDER:
        assert (await wait_group(http, sid, gid))["final"] is True
    closed = (await http.post(f"/v1/sessions/{sid}/close")).json()
    stream = await events_of(http, sid)
    assert [kind for _, kind, _ in stream] == ["group"] * 4 + ["closed"]
    assert [seq for seq, _, _ in stream] == [1, 2, 3, 4, 5]
    assert stream[-1][2] == closed
    expected = await score(http, as_arrived(ORDER), grpo)
    published = {data["group_id"]: data for _, kind, data in stream if kind == "group"}
    for group in expected["groups"]:  # bit for bit: JSON floats read back exactly
        assert score_groups(published[group["group_id"]]) == group
    assert closed["result"] == expected

    for advantage in ({"estimator": "grpo", "params": {"scale_rewards": "batch"},
                       "output": "dense"},
                      {"estimator": "reinforce_pp_baseline", "output": "dense",
                       "filters": [{"name": "dynamic_sampling"}]}):
        sid = await open_session(http, {**spec(3), "advantage": advantage})
        await send_arrivals(http, sid)
        for gid in ORDER:  # rewards are final before the close; advantages wait for it
            group = await wait_group(http, sid, gid)
            assert group["final"] is False
            assert all(r["advantages"] is None for r in group["rollouts"])
        closed = (await http.post(f"/v1/sessions/{sid}/close")).json()
        expected = await score(http, as_arrived(ORDER), advantage)
        assert closed["result"] == expected, advantage
        grouped = await events_of(http, sid)
        assert grouped[-1][2]["result"] == expected
    assert expected["advice"]["dynamic_sampling"]  # the filter ran over the whole batch


async def test_a_group_timing_out_completes_from_what_arrived(http: httpx.AsyncClient) -> None:
    timeout_s = 1.0
    sid = await open_session(http, spec(3, group_timeout_s=timeout_s))
    sent = time.monotonic()
    assert (await send(http, sid, [part("a", 2, 0, first=True), part("b", 1, first=True)])
            ).json() == {"accepted": 3, "duplicates": 0}
    assert (await send(http, sid, [part("b", 0, 2)])).json()["accepted"] == 2
    slow = await wait_group(http, sid, "a")
    assert time.monotonic() - sent >= timeout_s * 0.9
    assert slow["reason"] == "timeout" and slow["arrived"] == 2 and slow["final"] is True
    assert slow["failed"] is False
    whole = await wait_group(http, sid, "b")
    assert whole["reason"] == "full" and whole["arrived"] == 3
    late = await send(http, sid, [part("a", 1)])
    assert late.status_code == 409, late.text
    closed = (await http.post(f"/v1/sessions/{sid}/close")).json()
    expected = await score(http, [part("a", 2, 0, first=True), part("b", 1, 0, 2, first=True)],
                           spec(3)["advantage"])
    assert closed["result"] == expected
    assert score_groups(slow) == expected["groups"][0]
    lower, higher = (r["advantages"][0] for r in slow["rollouts"])  # rewards 0.5, 1.0
    assert lower < 0 < higher and lower == -higher
