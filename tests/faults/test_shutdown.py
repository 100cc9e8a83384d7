"""Bounded shutdown (issue 20): a client that leaves cancels its request's work, and SIGTERM
drains within REWARDD_SHUTDOWN_GRACE_S, then cancels what is left and exits.

A real ``rewardd serve`` (embedded pool of one worker) runs ``test_sleep`` calls of 100 s:
with one worker, a second request can only be answered quickly if the first one's call was
really cancelled.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
import pytest

from tests.support.server import REPO_ROOT, child_env, free_port

pytestmark = pytest.mark.faults

GRACE_S = 3
MARGIN_S = 30.0
"""Exit after the grace: the lifespan's own shutdown (pool stop, jobs handed over) on a busy
machine; far below the 100 s the sleeping calls would take."""
SLEEP_S = 100


def body(verifier: str, params: dict[str, Any], timeout_s: float | None = None) -> dict:
    reward = {"name": "r", "verifier": verifier, "params": params}
    if timeout_s is not None:
        reward["timeout_s"] = timeout_s
    return {"groups": [{"group_id": "g", "reference": {"answer": "1"}, "rollouts": [
        {"rollout_id": "a", "completion": "1", "num_tokens": 2}]}], "rewards": [reward]}


SLOW = body("test_sleep", {"seconds": SLEEP_S}, timeout_s=110)
QUICK = body("exact_match", {})


def start_server() -> tuple[subprocess.Popen, str, Any]:
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewardd.service.cli", "serve", "--host", "127.0.0.1",
         "--port", str(port), "--pool-size", "1", "--plugins", "tests.plugins.faulty",
         "--max-verifier-timeout-s", "120", "--shutdown-grace-s", str(GRACE_S)],
        cwd=REPO_ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"rewardd serve exited: {log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("rewardd serve was not ready within 90 s")
        time.sleep(0.25)


def test_a_client_that_leaves_frees_the_pool_and_sigterm_exits_within_the_grace() -> None:
    proc, url, log = start_server()
    try:
        # 1. the client gives up after 2 s: its call is cancelled, the one worker is free
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/score", json=SLOW, timeout=httpx.Timeout(60, read=2))
        started = time.monotonic()
        quick = httpx.post(f"{url}/v1/score", json=QUICK, timeout=90)
        assert quick.status_code == 200, quick.text
        assert quick.json()["groups"][0]["rollouts"][0]["reward"] == 1.0
        assert time.monotonic() - started < SLEEP_S / 2  # not behind the abandoned call

        # 2. a request still connected at SIGTERM, and one abandoned: exit within the grace
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/score", json=SLOW, timeout=httpx.Timeout(60, read=1))
        outcome: dict[str, Any] = {}

        def waiting_client() -> None:
            try:
                outcome["status"] = httpx.post(f"{url}/v1/score", json=SLOW,
                                               timeout=SLEEP_S * 2).status_code
            except httpx.HTTPError as exc:
                outcome["error"] = type(exc).__name__

        client = threading.Thread(target=waiting_client)
        client.start()
        time.sleep(2)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=GRACE_S + MARGIN_S)
        took = time.monotonic() - signalled
        client.join(timeout=30)
        assert not client.is_alive()
        assert outcome, "the waiting client got neither an answer nor an error"
        assert outcome.get("status") != 200  # its 100 s call was cancelled, not finished
        assert took >= GRACE_S - 0.5  # the connected request got its grace
        assert took < GRACE_S + MARGIN_S
        log.seek(0)
        text = log.read().decode(errors="replace")
        # uvicorn re-raises the signal after its clean shutdown: exit status -SIGTERM
        assert code in (0, -signal.SIGTERM), text
        assert "Application shutdown complete" in text, text
        print(f"SIGTERM to exit: {took:.1f} s (grace {GRACE_S} s)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
