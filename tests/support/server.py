"""Start a real ``rewardd serve`` process (for end-to-end tests and benchmarks) and stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServerFailed(RuntimeError):
    """The server exited or never became ready; the message carries its log."""


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict[str, str]:
    """Environment for rewardd child processes: no stray REWARDD_* settings, repo importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("REWARDD_") or k == "REWARDD_DATA_DIR"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


READY_WITHIN_S = 300.0
"""A guard against a server that never starts, not a measurement: a start imports torch and
the verifiers in every process (with ``--workers 2`` two API processes and two pools); on
the shared 2-core machine at load average 12 one took over 90 s."""


@contextlib.contextmanager
def running_server(*flags: str, ready_within_s: float = READY_WITHIN_S,
                   env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Yield the base URL of a fresh server started with ``flags`` (and ``env`` added to its
    environment); SIGTERM it on exit."""
    with server_process(*flags, ready_within_s=ready_within_s, env=env) as (url, _):
        yield url


@contextlib.contextmanager
def server_process(*flags: str, ready_within_s: float = READY_WITHIN_S,
                   env: Mapping[str, str] | None = None,
                   ready_path: str = "/readyz") -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`running_server`, also yielding the process (for tests that kill it); ready
    when ``ready_path`` answers 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "rewardd.service.cli", "serve", "--host", "127.0.0.1",
           "--port", str(port), *flags]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**child_env(), **(env or {})},
                                stdout=log,
                                stderr=subprocess.STDOUT)

        def failed(reason: str) -> ServerFailed:
            log.seek(0)
            return ServerFailed(f"rewardd serve {reason}:\n{log.read().decode(errors='replace')}")

        try:
            deadline = time.monotonic() + ready_within_s
            while True:
                if proc.poll() is not None:
                    raise failed(f"exited with {proc.returncode} before it was ready")
                try:
                    if httpx.get(f"{url}{ready_path}", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise failed(f"was not ready within {ready_within_s:g} s")
                time.sleep(0.25)
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
