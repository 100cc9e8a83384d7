"""Streaming sessions through process deaths (issue #18), with real ``rewardd serve`` pods
sharing a private Redis and real ``rewardd worker`` processes:

* an API pod SIGKILLed while its checks are in flight: the other pod notices its heartbeat
  stopped, checks those rollouts again, and the session completes there with the numbers
  ``/v1/score`` gives on the same batch (bit for bit, grpo);
* a worker SIGKILLed mid-session: every group still completes, every cell typed.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import httpx
import pytest

from tests.sessions.support import Stream, groups_of, score_groups, without_diagnostics
from tests.support.redis_server import RedisServer
from tests.support.server import server_process

pytestmark = pytest.mark.faults

PLUGINS = "tests.plugins.faulty,tests.plugins.stream"


@contextlib.contextmanager
def pod(redis_url: str) -> Iterator[tuple[str, Any]]:
    """A ``rewardd serve`` on the shared Redis: (base URL, its process)."""
    with server_process(ready_within_s=120, ready_path="/healthz", env={
            "REWARDD_BROKER_URL": redis_url, "REWARDD_PLUGINS": PLUGINS}) as started:
        yield started


def delay_spec(seconds: float, group_size: int) -> dict[str, Any]:
    return {"rewards": [{"name": "r", "verifier": "test_delay", "params": {"seconds": seconds}}],
            "group_size": group_size, "advantage": {"estimator": "grpo", "output": "dense"}}


REWARDS = {"a": [1.0, 0.0, 0.5], "b": [0.25, 0.75, 0.0], "c": [1.0, 1.0, 0.0]}


def test_an_api_pod_killed_mid_session_is_resumed_by_another(
        fleet: Any, redis_server: RedisServer) -> None:
    settings, workers = fleet(plugins=PLUGINS)
    workers.start(1, concurrency=2)
    groups = groups_of(REWARDS)
    body = delay_spec(1.0, 3)
    with pod(redis_server.url()) as (url_a, proc_a), pod(redis_server.url()) as (url_b, _):
        with httpx.Client(timeout=60) as http:
            sid = http.post(f"{url_a}/v1/sessions", json=body).json()["session_id"]
            stream = Stream(f"{url_b}/v1/sessions/{sid}/events").start()
            sent = http.post(f"{url_a}/v1/sessions/{sid}/rollouts",
                             json={"groups": groups[:2]})
            assert sent.json() == {"accepted": 6, "duplicates": 0}
            time.sleep(0.3)  # its checks are on the worker now (1 s each)
            proc_a.kill()
            proc_a.wait()
            killed = time.monotonic()
            # the same group sent again to the surviving pod: duplicates, nothing scored twice
            again = http.post(f"{url_b}/v1/sessions/{sid}/rollouts", json={"groups": groups})
            assert again.json() == {"accepted": 3, "duplicates": 6}
            first = http.get(f"{url_b}/v1/sessions/{sid}/groups/a", params={"wait_s": 60})
            assert first.json()["complete"], first.text
            assert time.monotonic() - killed < 60  # taken over, not left to the long poll
            closed = http.post(f"{url_b}/v1/sessions/{sid}/close").json()
            assert closed["state"] == "closed"
            stream.join()  # the stream ends at `closed`; its events are kept only then
            published = stream.groups()
            assert set(published) == {"a", "b", "c"}
            arrival = {g["group_id"]: [r["rollout_id"] for r in g["rollouts"]]
                       for g in closed["result"]["groups"]}
            order = sorted(published, key=lambda gid: published[gid]["index"])
            batch = [{**g, "rollouts": sorted(g["rollouts"], key=lambda r: arrival[gid].index(
                r["rollout_id"]))} for gid in order for g in groups if g["group_id"] == gid]
            expected = http.post(f"{url_b}/v1/score", json={
                "groups": batch, "rewards": body["rewards"], "advantage": body["advantage"]})
            assert expected.status_code == 200, expected.text
            assert closed["result"] == without_diagnostics(expected.json())
            for group in expected.json()["groups"]:
                assert score_groups(published[group["group_id"]]) == group


def test_a_worker_killed_mid_session_leaves_every_group_complete(
        fleet: Any, redis_server: RedisServer) -> None:
    settings, workers = fleet(plugins=PLUGINS, worker_lost_after_s=3.0)
    doomed, _ = workers.start(2, concurrency=2)
    groups = groups_of({f"g{i}": [1.0, 0.0, 0.5, 0.25] for i in range(6)})
    sent = {r["rollout_id"]: r["completion"] for g in groups for r in g["rollouts"]}
    with pod(redis_server.url()) as (url, _):
        with httpx.Client(base_url=url, timeout=120) as http:
            sid = http.post("/v1/sessions", json=delay_spec(0.5, 4)).json()["session_id"]
            stream = Stream(f"{url}/v1/sessions/{sid}/events").start()
            for group in groups:
                for one in group["rollouts"]:
                    http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
                        {**group, "rollouts": [one]}]})
            time.sleep(0.5)
            doomed.kill()
            closed = http.post(f"/v1/sessions/{sid}/close").json()
            assert closed["state"] == "closed"
            assert closed["summary"]["groups"] == 6 and closed["summary"]["rollouts"] == 24
            for group in closed["result"]["groups"]:
                for one in group["rollouts"]:
                    status = one["status"]["r"]
                    assert status["ok"] or status["error"] in ("crashed", "unavailable",
                                                               "timeout"), status
                    if status["ok"]:  # each result went to its own rollout
                        assert one["reward"] == float(sent[one["rollout_id"]])
            assert len(stream.join(120)) == 7
