"""Issue #28, sessions: rows 2 (what one tenant's sessions store), 4 (the Redis sweep's cost
of an idle session) and 12 (concurrent resends with other content), replayed on a real
server by the hostile tenant while the other tenant's small requests are answered.

Row 4 runs with the sessions in Redis (database 11 of the test's Redis, emptied around the
test; run the suite under ``/work/wt/bin/isolated`` or any private Redis).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import redis

from tests.support.abuse import HOSTILE, MB, AbuseServer, Neighbour, abuse_server

REDIS_URL = "redis://127.0.0.1:6379/11"
KB = 1024
SPEC = {"rewards": [{"name": "same", "verifier": "exact_match"}], "group_size": 1,
        "advantage": {"estimator": "grpo"}}


def groups(first: int, count: int, size: int, prefix: str = "g") -> list[dict[str, Any]]:
    """``count`` groups of one rollout of about ``size`` bytes each."""
    text = "x" * size
    return [{"group_id": f"{prefix}{i}", "reference": {"answer": "y"}, "rollouts": [
        {"rollout_id": f"{prefix}{i}", "completion": text, "num_tokens": 3}]}
        for i in range(first, first + count)]


def open_session(http: httpx.Client, spec: dict[str, Any] | None = None) -> str:
    response = http.post("/v1/sessions", json=spec or SPEC)
    assert response.status_code in (200, 201), response.text
    return str(response.json()["session_id"])


def metric(http: httpx.Client, name: str) -> dict[str, float]:
    """Every series of ``name`` on /metrics: label text -> value."""
    found = {}
    for line in http.get("/metrics").text.splitlines():
        match = re.match(rf"{name}(\{{[^}}]*\}})? (\S+)$", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[tuple[AbuseServer, httpx.Client]]:
    with abuse_server(tmp_dir=tmp_path) as server:
        with httpx.Client(base_url=server.url, headers=HOSTILE, timeout=300) as http:
            yield server, http


def test_row_2_one_session_of_30000_groups_of_10_kb_is_refused_naming_the_bound(
        hostile: tuple[AbuseServer, httpx.Client]) -> None:
    server, http = hostile
    sid = open_session(http)
    before = server.rss_bytes()
    with Neighbour(server.url) as neighbour:
        neighbour.hostile_running.set()
        sent, refused = 0, None
        while sent < 30_000:
            response = http.post(f"/v1/sessions/{sid}/rollouts",
                                 json={"groups": groups(sent, 300, 10 * KB)})
            if response.status_code != 200:
                refused = response
                break
            sent += 300
        while neighbour.answered_during_hostile < 2:
            time.sleep(0.05)
        neighbour.hostile_running.clear()
    assert refused is not None and refused.status_code in (422, 429), refused
    assert "REWARDD_SESSION_MAX_GROUPS" in refused.text  # 4,096 groups of 10 KB: 40 MB
    assert sent < 30_000
    growth = server.rss_bytes() - before
    assert growth < 200 * MB, f"+{growth / MB:.0f} MB"
    assert set(neighbour.statuses) == {200}
    stored = metric(http, "rewardd_tenant_stored")
    assert stored['{bound="stored session groups",tenant="hostile"}'] == sent


def test_row_2_open_close_churn_keeps_a_bounded_number_of_ended_sessions(
        hostile: tuple[AbuseServer, httpx.Client]) -> None:
    server, http = hostile
    before = server.rss_bytes()
    ended = []
    with Neighbour(server.url) as neighbour:
        neighbour.hostile_running.set()
        for i in range(400):  # 400 sessions of 1 MB each, opened and closed
            sid = open_session(http)
            added = http.post(f"/v1/sessions/{sid}/rollouts",
                              json={"groups": groups(0, 1, MB, prefix=f"s{i}-")})
            assert added.status_code == 200, added.text
            assert http.post(f"/v1/sessions/{sid}/close").status_code == 200
            ended.append(sid)
        while neighbour.answered_during_hostile < 2:
            time.sleep(0.05)
        neighbour.hostile_running.clear()
    growth = server.rss_bytes() - before
    assert growth < 200 * MB, f"+{growth / MB:.0f} MB"
    kept = [sid for sid in ended if http.get(f"/v1/sessions/{sid}").status_code == 200]
    assert kept == ended[-32:]  # REWARDD_SESSION_TENANT_MAX_RETAINED, oldest deleted first
    stored = metric(http, "rewardd_tenant_stored")
    assert stored['{bound="retained ended sessions",tenant="hostile"}'] == 32
    assert stored['{bound="stored session bytes",tenant="hostile"}'] < 40 * MB
    assert set(neighbour.statuses) == {200}


def test_row_12_thirty_concurrent_pairs_of_resends_get_exactly_one_409_each(
        hostile: tuple[AbuseServer, httpx.Client]) -> None:
    server, http = hostile
    sid = open_session(http, {**SPEC, "group_size": 2})
    statuses: dict[int, list[int]] = {i: [] for i in range(30)}
    start = threading.Barrier(60)

    def send(i: int, completion: str) -> None:
        body = {"groups": [{"group_id": f"g{i}", "reference": {"answer": "y"}, "rollouts": [
            {"rollout_id": "r", "completion": completion, "num_tokens": 3}]}]}
        with httpx.Client(base_url=server.url, headers=HOSTILE, timeout=120) as own:
            start.wait()
            statuses[i].append(own.post(f"/v1/sessions/{sid}/rollouts", json=body)
                               .status_code)

    threads = [threading.Thread(target=send, args=(i, text)) for i in range(30)
               for text in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(sorted(pair) == [200, 409] for pair in statuses.values()), statuses


@pytest.fixture
def shared_state() -> Iterator[dict[str, str]]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    try:
        yield {"REWARDD_STATE_URL": REDIS_URL}
    finally:
        client.flushdb()
        client.close()


def idle_cpu_over_sweeps(server: AbuseServer, http: httpx.Client, sweeps: int) -> float:
    """API CPU seconds over the next ``sweeps`` sweeps of the sessions (counted by
    ``rewardd_session_sweeps_total``), idle but for the metrics reads that count them."""
    def count() -> float:
        return metric(http, "rewardd_session_sweeps_total")[""]

    first = count()
    cpu = server.api_cpu_s()
    while count() < first + sweeps:
        time.sleep(1.0)
    return server.api_cpu_s() - cpu


def test_row_4_an_idle_session_in_redis_costs_the_sweep_the_same_whatever_it_holds(
        tmp_path: Path, shared_state: dict[str, str]) -> None:
    with abuse_server(env=shared_state, tmp_dir=tmp_path) as server, \
            httpx.Client(base_url=server.url, headers=HOSTILE, timeout=300) as http:
        small = open_session(http)
        assert http.post(f"/v1/sessions/{small}/rollouts",
                         json={"groups": groups(0, 1, 10 * KB)}).status_code == 200
        idle_cpu_over_sweeps(server, http, 8)  # settled
        small_cpu = idle_cpu_over_sweeps(server, http, 40)

        big = open_session(http)
        per_batch = []
        with Neighbour(server.url) as neighbour:
            neighbour.hostile_running.set()
            for first in range(0, 4000, 500):  # 4,000 groups of 10 KB: 40 MB in Redis
                cpu = server.api_cpu_s()
                response = http.post(f"/v1/sessions/{big}/rollouts",
                                     json={"groups": groups(first, 500, 10 * KB)})
                assert response.status_code == 200, response.text
                per_batch.append(server.api_cpu_s() - cpu)
            while neighbour.answered_during_hostile < 2:
                time.sleep(0.05)
            neighbour.hostile_running.clear()
        assert set(neighbour.statuses) == {200}
        while http.get(f"/v1/sessions/{big}").json()["completed_groups"] < 4000:
            time.sleep(1.0)
        idle_cpu_over_sweeps(server, http, 8)  # settled
        big_cpu = idle_cpu_over_sweeps(server, http, 40)
    # storing is linear: the last 500 groups cost what the first 500 did
    assert per_batch[-1] < 2 * per_batch[0] + 0.5, per_batch
    # an idle 40 MB session costs the sweeps what a 10 KB one does (the sweep read and
    # decoded every group once a second before: ~0.2 s of CPU per second here)
    assert big_cpu < small_cpu + 0.5, (small_cpu, big_cpu)
