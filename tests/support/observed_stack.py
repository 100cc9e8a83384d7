"""A real distributed rewardd to observe: ``rewardd serve`` on a broker and one ``rewardd
worker`` with its exporter, both logging JSON lines to files the test can read, with two
configured tenants and a judge server. Used by tests/e2e/test_metrics_export.py (make test)
and tests/deploy/test_prometheus.py (a real Prometheus scrapes it).

Redis database :data:`DB` is this stack's own (flushed before and after)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import redis

from tests.support.judge_server import JudgeServer
from tests.support.server import REPO_ROOT, child_env, free_port

DB = 13
BROKER_URL = f"redis://127.0.0.1:6379/{DB}"
KEYS = {"alpha": "key-alpha", "beta": "key-beta"}
METRICS_TOKEN = "scrape-token"
READY_WITHIN_S = 120.0


@dataclass
class Stack:
    api: str
    worker_metrics: str
    api_log: Path
    worker_log: Path
    judge: JudgeServer
    procs: list[subprocess.Popen] = field(default_factory=list)

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEYS[tenant]}"}

    def scrape_api(self) -> str:
        resp = httpx.get(f"{self.api}/metrics", timeout=30,
                         headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        resp.raise_for_status()
        return resp.text

    def scrape_worker(self) -> str:
        resp = httpx.get(self.worker_metrics, timeout=30)
        resp.raise_for_status()
        return resp.text

    def log_lines(self, which: str) -> list[dict[str, Any]]:
        """The JSON lines of ``which`` (api or worker); other lines (a library's print)
        are skipped."""
        path = self.api_log if which == "api" else self.worker_log
        out = []
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    out.append(parsed)
        return out


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def observed_stack() -> Iterator[Stack]:
    """Start the stack, wait until the API is ready (a worker answers) and the worker's
    exporter answers; stop both and flush the database on exit."""
    client = redis.Redis.from_url(BROKER_URL)
    client.flushdb()
    judge = JudgeServer().start()
    with tempfile.TemporaryDirectory(prefix="rewardd-observed-") as tmp:
        keys_file = Path(tmp, "keys.json")
        keys_file.write_text(json.dumps(
            {"tenants": {name: {"keys": [key]} for name, key in KEYS.items()}}))
        api_port, worker_port = free_port(), free_port()
        env = {**child_env(), "REWARDD_BROKER_URL": BROKER_URL, "REWARDD_LOG_FORMAT": "json",
               "REWARDD_QUEUE_ROUTES": "rubric=cpu", "REWARDD_JUDGE_BASE_URL": judge.base_url,
               "REWARDD_JUDGE_MODEL": "rule-judge", "REWARDD_RESULT_TTL_S": "300"}
        stack = Stack(f"http://127.0.0.1:{api_port}",
                      f"http://127.0.0.1:{worker_port}/metrics",
                      Path(tmp, "api.log"), Path(tmp, "worker.log"), judge)
        try:
            with open(stack.worker_log, "wb") as log:
                stack.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "rewardd.service.cli", "worker",
                     "--queues", "cpu,sandbox", "--concurrency", "2"],
                    cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**env, "REWARDD_WORKER_METRICS_PORT": str(worker_port),
                         "REWARDD_WORKER_METRICS_HOST": "127.0.0.1"}))
            with open(stack.api_log, "wb") as log:
                stack.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "rewardd.service.cli", "serve", "--host",
                     "127.0.0.1", "--port", str(api_port), "--pool-size", "1"],
                    cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**env, "REWARDD_API_KEYS_FILE": str(keys_file),
                         "REWARDD_METRICS_TOKEN": METRICS_TOKEN}))
            _wait_ready(stack)
            yield stack
        finally:
            for proc in stack.procs:
                _stop(proc)
            judge.stop()
            client.flushdb()


def _wait_ready(stack: Stack) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while True:
        for proc, log in zip(stack.procs, (stack.worker_log, stack.api_log)):
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[3]} exited with {proc.returncode}:\n"
                                   f"{log.read_text(errors='replace')[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            ready = httpx.get(f"{stack.api}/readyz", timeout=5)
            # ready (a worker's heartbeat) and counted by the census the metrics read
            if ready.status_code == 200 and ready.json()["executor"].get("workers") and \
                    httpx.get(stack.worker_metrics, timeout=5).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {READY_WITHIN_S:g} s:\nAPI:\n"
                               f"{stack.api_log.read_text(errors='replace')[-3000:]}\nworker:\n"
                               f"{stack.worker_log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.25)
