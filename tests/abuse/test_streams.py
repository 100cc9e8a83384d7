"""Issue 28, rows 3 and 8: event streams and long polls, replayed on a real server.

Row 3: ten clients opened ``/v1/sessions/{id}/events`` late on a session with a long history
and never read; each stream copied the whole history after its position and held it (+157 MB
per stream). Streams now read their history in pages, the next only once the client took
the last, so a stalled reader holds one page: the API's memory grows less than 200 MB and
the streams cost it under 2 s of CPU, while the other tenant is answered normally.

Row 8: 1,000 gRPC WatchJob streams on one job took 74% of the API's CPU, each polling the
store every 0.25 s, and nothing bounded a tenant's streams. The watchers of a job now share
one probe per tick, and a tenant's streams and long polls are bounded per process
(``REWARDD_TENANT_MAX_STREAMS``, ``REWARDD_TENANT_MAX_LONG_POLLS``): past the bound a typed
429 (gRPC ``RESOURCE_EXHAUSTED``) before the stream starts.

No wall-clock bound: the figures are the server's memory, its CPU seconds (row 8: CPU over a
window of idle watching, at most a tenth of the window whatever the window's length: the old
polls spent most of it), counts and typed refusals.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import grpc
import httpx
import redis

from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc import rewardd_pb2_grpc as pb_grpc
from tests.support.abuse import (HOSTILE, HOSTILE_KEY, MB, OTHER, OTHER_KEY, Neighbour,
                                 abuse_server)
from tests.support.server import free_port

FAULTY = ("--plugins", "tests.plugins.faulty")
GROUPS, GROUP_SIZE = 5000, 16
"""Row 3's history: 5,000 group events of about 6 KB (31 MB stored)."""
LATE_STREAMS = 10
WATCHERS = 1000
STATE_DB = 8
"""Row 8's jobs live in Redis, as on a shared deployment (each old poll was two round trips);
a database of its own (see tests/unit/test_last_event_id.py for the others)."""
STATE_URL = f"redis://127.0.0.1:6379/{STATE_DB}"


def session_groups(start: int, count: int) -> list[dict[str, Any]]:
    """Whole groups with long ids (as a trainer's may be): about 6 KB per group event."""
    return [{"group_id": f"g{g}-" + "x" * 200, "prompt": "p", "reference": {"answer": "1"},
             "rollouts": [{"rollout_id": f"g{g}r{i}-" + "y" * 200, "completion": "1.0",
                           "num_tokens": 3} for i in range(GROUP_SIZE)]}
            for g in range(start, start + count)]


def long_session(http: httpx.Client) -> str:
    """A session whose GROUPS groups all completed: GROUPS stored events."""
    spec = {"rewards": [{"name": "r", "verifier": "test_echo"}], "group_size": GROUP_SIZE,
            "advantage": {"estimator": "grpo", "output": "scalar"}}
    sid = http.post("/v1/sessions", json=spec).json()["session_id"]
    for start in range(0, GROUPS, 250):
        sent = http.post(f"/v1/sessions/{sid}/rollouts",
                         json={"groups": session_groups(start, 250)})
        assert sent.status_code == 200, sent.text[:300]
    while http.get(f"/v1/sessions/{sid}").json()["completed_groups"] < GROUPS:
        time.sleep(0.5)
    return sid


@contextlib.contextmanager
def stalled_stream(url: str, path: str, key: str = HOSTILE_KEY) -> Iterator[socket.socket]:
    """A client that opens ``path`` as an event stream, reads the response's head, and then
    never reads again."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer "
                     f"{key}\r\nAccept: text/event-stream\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            assert chunk, "the server closed the stream"
            head += chunk
        assert head.startswith(b"HTTP/1.1 200"), head
        yield sock
    finally:
        sock.close()


def test_late_streams_that_never_read_hold_one_page_each(tmp_path: Path) -> None:
    # the history's size needs more groups than one session holds by default (4096)
    env = {"REWARDD_SESSION_MAX_INFLIGHT": "1000000", "REWARDD_SESSION_MAX_GROUPS": str(GROUPS)}
    with abuse_server(*FAULTY, env=env, tmp_dir=tmp_path) as server, \
            httpx.Client(base_url=server.url, headers=HOSTILE, timeout=600) as http:
        sid = long_session(http)
        rss, cpu = server.rss_bytes(), server.api_cpu_s()
        peak = rss
        with Neighbour(server.url) as neighbour, contextlib.ExitStack() as streams:
            neighbour.hostile_running.set()
            for _ in range(LATE_STREAMS):
                streams.enter_context(stalled_stream(server.url, f"/v1/sessions/{sid}/events"))
            # the old streams copied the history at their first read; sample the memory
            # until the neighbour has been answered a few times with every stream open
            while neighbour.answered_during_hostile < 4:
                peak = max(peak, server.rss_bytes())
                time.sleep(0.1)
            peak = max(peak, server.rss_bytes())
            spent = server.api_cpu_s() - cpu
            neighbour.hostile_running.clear()
        print(f"row 3: +{(peak - rss) / MB:.0f} MB, {spent:.2f} s API CPU")
        assert peak - rss < 200 * MB, f"+{(peak - rss) / MB:.0f} MB for {LATE_STREAMS} streams"
        assert spent < 2.0, f"{spent:.2f} s of API CPU"
        assert neighbour.statuses and set(neighbour.statuses) == {200}
        # a reader that reads gets every event, in order, page after page
        seqs: list[int] = []
        with http.stream("GET", f"/v1/sessions/{sid}/events",
                         headers={"Last-Event-ID": "7"}) as response:
            for line in response.iter_lines():
                if line.startswith("id: "):
                    seqs.append(int(line[4:]))
                    if len(seqs) == GROUPS - 7:
                        break
        assert seqs == list(range(8, GROUPS + 1))


def sleeping_job(http: httpx.Client) -> str:
    """A job whose one check sleeps until the job is cancelled."""
    body = {"groups": [{"group_id": "g", "reference": {"answer": "1"}, "rollouts": [
        {"rollout_id": "r", "completion": "1"}]}],
        "rewards": [{"name": "s", "verifier": "test_sleep", "params": {"seconds": 600}}],
        "advantage": {"output": "scalar"}}
    submitted = http.post("/v1/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    return str(submitted.json()["id"])


def test_a_thousand_watchers_of_one_job_share_one_poll_and_the_next_is_refused(
        tmp_path: Path) -> None:
    redis.Redis.from_url(STATE_URL, socket_connect_timeout=3).flushdb()
    port = free_port()
    metadata = (("authorization", f"Bearer {HOSTILE_KEY}"),)
    with abuse_server(*FAULTY, "--grpc-port", str(port), "--max-verifier-timeout-s", "600",
                      env={"REWARDD_TENANT_MAX_STREAMS": str(WATCHERS),
                           "REWARDD_STATE_URL": STATE_URL},
                      tmp_dir=tmp_path) as server, \
            httpx.Client(base_url=server.url, headers=HOSTILE, timeout=600) as http, \
            contextlib.ExitStack() as stack:
        job = sleeping_job(http)
        channels = [stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{port}"))
                    for _ in range(10)]
        watches = []
        for index in range(WATCHERS):
            stub = pb_grpc.RewarddStub(channels[index % len(channels)])
            watch = stub.WatchJob(pb.WatchJobRequest(id=job), metadata=metadata)
            stack.callback(watch.cancel)
            watches.append(watch)
        for watch in watches:  # each stream started: its first progress message came
            assert next(watch).WhichOneof("event") == "progress"
        # idle watching: the old one poll per watcher every 0.25 s spent most of the API's
        # CPU; one shared probe of the job per tick spends a sliver of the window
        cpu, start = server.api_cpu_s(), time.monotonic()
        time.sleep(3.0)
        spent, window = server.api_cpu_s() - cpu, time.monotonic() - start
        print(f"row 8: {WATCHERS} watchers: {spent:.2f} s API CPU in {window:.1f} s")
        assert spent < 0.1 * window, f"{spent:.2f} s of API CPU in {window:.1f} s of watching"
        with Neighbour(server.url) as neighbour:
            neighbour.hostile_running.set()
            while neighbour.answered_during_hostile < 3:
                time.sleep(0.1)
            neighbour.hostile_running.clear()
        assert set(neighbour.statuses) == {200}
        # past the bound: refused before the stream starts, naming the bound
        refused = pb_grpc.RewarddStub(channels[0]).WatchJob(pb.WatchJobRequest(id=job),
                                                           metadata=metadata, timeout=60)
        try:
            next(refused)
            raise AssertionError("a watcher past REWARDD_TENANT_MAX_STREAMS was let in")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "REWARDD_TENANT_MAX_STREAMS" in (exc.details() or "")
        rest = http.get(f"/v1/jobs/{job}/events")
        assert rest.status_code == 429 and "REWARDD_TENANT_MAX_STREAMS" in rest.text
        assert int(rest.headers["Retry-After"]) >= 1
        assert http.delete(f"/v1/jobs/{job}").json()["state"] == "cancelled"
        ends = [list(watch) for watch in watches[:5]]
        assert all(seen[-1].end.state == "cancelled" for seen in ends)


def held(http: httpx.Client, bound: str) -> float:
    """``rewardd_tenant_held`` of the hostile tenant for ``bound`` (0 when absent)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("rewardd_tenant_held{") and 'tenant="hostile"' in line \
                and f'bound="{bound}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_streams_and_long_polls_past_their_bounds_are_refused_and_given_back(
        tmp_path: Path) -> None:
    env = {"REWARDD_TENANT_MAX_STREAMS": "2", "REWARDD_TENANT_MAX_LONG_POLLS": "1"}
    with abuse_server(*FAULTY, env=env, tmp_dir=tmp_path) as server, \
            httpx.Client(base_url=server.url, headers=HOSTILE, timeout=600) as http:
        spec = {"rewards": [{"name": "r", "verifier": "test_echo"}], "group_size": 2,
                "advantage": {"estimator": "grpo", "output": "scalar"}}
        sid = http.post("/v1/sessions", json=spec).json()["session_id"]
        path = f"/v1/sessions/{sid}/events"
        with stalled_stream(server.url, path), stalled_stream(server.url, path):
            third = http.get(path)
            assert third.status_code == 429, third.text
            assert third.json()["detail"].count("REWARDD_TENANT_MAX_STREAMS") == 1
            assert int(third.headers["Retry-After"]) >= 1
            other = http.post("/v1/sessions", json=spec, headers=OTHER).json()["session_id"]
            with stalled_stream(server.url, path.replace(sid, other), OTHER_KEY):
                pass  # another tenant's streams are its own
        # the closed streams gave their places back
        while held(http, "open event streams") > 0:
            time.sleep(0.05)
        with stalled_stream(server.url, path), stalled_stream(server.url, path):
            assert held(http, "open event streams") == 2
        # long polls: one in flight, the next refused, a poll that does not wait is free
        sent = http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
            {"group_id": "g", "prompt": "p", "reference": {"answer": "1"},
             "rollouts": [{"rollout_id": "r0", "completion": "1.0", "num_tokens": 3}]}]})
        assert sent.status_code == 200, sent.text
        waiting = threading.Thread(target=http.get, args=(f"/v1/sessions/{sid}/groups/g",),
                                   kwargs={"params": {"wait_s": 60}})
        waiting.start()
        while held(http, "long polls") < 1:  # the first one is in
            time.sleep(0.05)
        refused = http.get(f"/v1/sessions/{sid}/groups/g", params={"wait_s": 60})
        assert refused.status_code == 429, refused.text
        assert "REWARDD_TENANT_MAX_LONG_POLLS" in refused.json()["detail"]
        assert http.get(f"/v1/sessions/{sid}/groups/g").json()["complete"] is False
        assert http.post(f"/v1/sessions/{sid}/close").status_code == 429  # a wait too
        http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
            {"group_id": "g", "prompt": "p", "reference": {"answer": "1"},
             "rollouts": [{"rollout_id": "r1", "completion": "0.0", "num_tokens": 3}]}]})
        waiting.join(timeout=120)
        assert not waiting.is_alive()
        assert http.post(f"/v1/sessions/{sid}/close").status_code == 200
