"""Issue 15, the API process's own share: a valid, huge /v1/score of one tenant must not
stall the event loop that serves every other tenant.

A real ``rewardd serve`` (embedded pool of 1, two tenants) gets a valid 48,000-rollout
/v1/score from tenant t2 (3,000 groups of 16, ~3 MB in, ~12 MB out; cheap ``exact_match``
checks in the pool's process, so the API's own work, not the verifiers', is most of the
request's time), sent by ``curl`` in a process of its own so that the test's threads never
wait for a client that encodes or decodes megabytes. Meanwhile the test pings /healthz and
sends tenant t1's small requests back to back.

Before the heavy lane (service/heavy.py), validating the body in one pydantic call, the
collector's full scans of the request's ~600,000 objects and the answer's encoding on the
loop each held the GIL for 0.1-1 s, and /healthz stalled for up to 1 s.

What is checked, in order and in the API process's CPU time, never in wall-clock time:

* order: small requests keep completing while the big one runs, every one answered 200
  (at least :data:`MIN_PINGS` pings and :data:`MIN_SMALLS` small requests are sent after
  the big one was sent and answered before it was);
* the stalls: for each of those answers, the CPU time the API process spent between its
  request and its answer (read from the process's CPU clock, tests/support/cpu.py), that is
  the work the answer waited behind; of each kind (pings, small requests) the third-worst
  answer (:data:`TOLERATED_OUTLIERS`) is under :data:`MAX_STALL_SHARE` of the CPU time the
  process spent during the big request.

The wall-clock version of the second check (the worst answer's duration against the big
request's) failed on a busy machine: a ping's wall time also counts the time its own thread
in the test, and the server's event loop, wait for a core, which the big request's duration
does not grow with alike. The CPU the server spends does not grow while it waits.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from tests.support.cpu import process_cpu_clock
from tests.support.server import ServerFailed, server_process

pytestmark = pytest.mark.e2e

GROUPS, GROUP_SIZE = 3_000, 16
MAX_STALL_SHARE = 0.055
"""The most API-process CPU time spent while one /healthz or small request waited (the
third-worst of each kind, see TOLERATED_OUTLIERS), as a share of the API process's CPU time
during the big request. Measured on the shared 2-core machine beside six other test runs,
six runs each way: 2.2-4.1% with the heavy lane as shipped, 6.6-9.1% with the lane turned
off (``heavy.mark`` a no-op), so the bound fails without the lane in every run seen. (An
earlier bound of 6% on the single worst answer, from 2.1-3.8% measured on an idle machine,
failed CI at 7.1%: on a loaded machine the worst answer with the lane reached 3.3-6.7% here,
against 9.6-11.7% without it.)"""
TOLERATED_OUTLIERS = 2
"""Answers of each kind allowed past the bound. One answer can be unlucky in a way no code
here causes (a garbage-collector pass or the scheduler's GIL hand-off lands inside it);
a step that blocks the event loop stalls every answer that arrives while it runs, and the
request without the lane has several such steps (validation, the collector's scans, the
answer's encoding), so its third-worst answers still stall (above)."""
MIN_PINGS, MIN_SMALLS = 10, 3
"""Answers that must complete while the big request runs (seen: 150 to 800 of each, idle or
busy): the big request stalls nobody for its whole duration."""
HANG_S = 600.0  # bounds against hangs, never measurements


def big_body() -> bytes:
    groups = [{"group_id": f"u{g}", "reference": {"answer": str(g % 7)}, "rollouts": [
        {"rollout_id": f"u{g}r{r}", "completion": str((g + r) % 7), "num_tokens": 8}
        for r in range(GROUP_SIZE)]} for g in range(GROUPS)]
    return json.dumps({"rewards": [{"name": "c", "verifier": "exact_match"}],
                       "advantage": {"output": "scalar"}, "groups": groups}).encode()


def small_body(seed: int) -> dict:
    return {"rewards": [{"name": "c", "verifier": "exact_match"}], "groups": [
        {"group_id": f"s{seed}g{g}", "reference": {"answer": "1"}, "rollouts": [
            {"rollout_id": f"s{seed}g{g}r{r}", "completion": str(r % 2), "num_tokens": 8}
            for r in range(GROUP_SIZE)]} for g in range(2)]}


@dataclass(frozen=True, slots=True)
class Answer:
    """One request answered while the test ran: when it was sent and answered (the test's
    monotonic clock, used for order only) and the API process's CPU seconds in between."""

    sent: float
    answered: float
    server_cpu_s: float
    status: int

    def within(self, began: float, ended: float) -> bool:
        return began <= self.sent and self.answered <= ended


@dataclass(frozen=True, slots=True)
class Server:
    url: str
    cpu: Callable[[], float]
    """The API process's CPU seconds so far (every thread; the pool's process is another)."""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    try:
        with server_process("--pool-size", "1",
                            env={"REWARDD_API_KEYS": "key1=t1,key2=t2"}) as (url, proc):
            yield Server(url, process_cpu_clock(proc.pid))
    except ServerFailed as exc:
        pytest.fail(str(exc))


def timed(server: Server, send: Callable[[], httpx.Response]) -> Answer:
    sent, cpu = time.monotonic(), server.cpu()
    status = send().status_code
    return Answer(sent, time.monotonic(), server.cpu() - cpu, status)


def test_a_huge_valid_request_does_not_stall_other_tenants(server: Server,
                                                           tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(big_body())
    t1 = {"Authorization": "Bearer key1"}
    with httpx.Client(base_url=server.url, timeout=HANG_S, headers=t1) as client:
        for seed in range(3):  # warm: the worker's first checks, the first requests
            assert client.post("/v1/score", json=small_body(seed)).status_code == 200

    stop = threading.Event()
    pings: list[Answer] = []
    smalls: list[Answer] = []

    def pinger() -> None:
        with httpx.Client(base_url=server.url, timeout=HANG_S) as client:
            while not stop.is_set():
                pings.append(timed(server, lambda: client.get("/healthz")))
                time.sleep(0.01)

    def trainer() -> None:
        with httpx.Client(base_url=server.url, timeout=HANG_S, headers=t1) as client:
            seed = 100
            while not stop.is_set():
                smalls.append(timed(server, lambda: client.post(
                    "/v1/score", json=small_body(seed))))
                seed += 1

    threads = [threading.Thread(target=pinger, daemon=True),
               threading.Thread(target=trainer, daemon=True)]
    for thread in threads:
        thread.start()
    while not (pings and smalls):  # both clients connected and answered once
        assert all(thread.is_alive() for thread in threads), "a client thread failed"
        time.sleep(0.05)
    began, cpu_before = time.monotonic(), server.cpu()
    done = subprocess.run(
        ["curl", "-sS", "-o", str(tmp_path / "answer.json"), "-w", "%{http_code}",
         "-H", "Authorization: Bearer key2", "-H", "Content-Type: application/json",
         "--data-binary", f"@{path}", f"{server.url}/v1/score"],
        capture_output=True, text=True, timeout=HANG_S)
    ended, big_cpu_s = time.monotonic(), server.cpu() - cpu_before
    stop.set()
    for thread in threads:
        thread.join(HANG_S)

    assert done.stdout == "200", (done.stdout, done.stderr)
    answer = json.loads((tmp_path / "answer.json").read_bytes())
    assert answer["summary"]["rollouts"] == GROUPS * GROUP_SIZE
    during_pings = [a for a in pings if a.within(began, ended)]
    during_smalls = [a for a in smalls if a.within(began, ended)]
    assert len(during_pings) >= MIN_PINGS and len(during_smalls) >= MIN_SMALLS, (
        f"{len(during_pings)} pings and {len(during_smalls)} small requests completed during "
        f"the big request")
    assert all(a.status == 200 for a in during_pings + during_smalls)

    worst_ping, worst_small = (
        sorted(answers, key=lambda a: a.server_cpu_s)[-1 - TOLERATED_OUTLIERS]
        for answers in (during_pings, during_smalls))
    took = ended - began
    print(f"big {took:.1f} s, API CPU {big_cpu_s:.2f} s; {len(during_pings)} pings, third-worst "
          f"{worst_ping.server_cpu_s * 1e3:.0f} ms of API CPU "
          f"({worst_ping.server_cpu_s / big_cpu_s:.1%}); {len(during_smalls)} small "
          f"requests, third-worst {worst_small.server_cpu_s * 1e3:.0f} ms "
          f"({worst_small.server_cpu_s / big_cpu_s:.1%}); wall-clock shares, for reference: "
          f"{max(a.answered - a.sent for a in during_pings) / took:.1%} and "
          f"{max(a.answered - a.sent for a in during_smalls) / took:.1%}")
    for name, worst in (("/healthz", worst_ping), ("a small request of t1", worst_small)):
        assert worst.server_cpu_s <= MAX_STALL_SHARE * big_cpu_s, (
            f"{name} (the third-worst) waited while the API process spent "
            f"{worst.server_cpu_s * 1e3:.0f} ms of "
            f"CPU, {worst.server_cpu_s / big_cpu_s:.1%} of its {big_cpu_s:.2f} s during the "
            f"big request (bound {MAX_STALL_SHARE:.0%})")
