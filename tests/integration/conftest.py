"""Real Redis, real ``rewardd worker`` processes: fixtures for the distributed executor.

Redis must run at 127.0.0.1:6379 (``make test`` sees to it); the tests use database
:data:`DB` only and flush nothing else. Where Redis is not reachable they fail, never skip:
a green run must mean the distributed path was exercised.

Workers are module-scoped: each module starts the workers it needs with the settings it
needs, and stops them (and flushes the database) when it is done, so modules do not see each
other's workers or leftover messages.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis

from rewardd.service.settings import Settings
from tests.support.server import REPO_ROOT, child_env

REDIS_HOST, DB = "127.0.0.1", 11
REDIS_PORT = int(os.environ.get("INTEGRATION_REDIS_PORT", "6379"))  # e.g. a private 6390
BROKER_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{DB}"
PLUGINS = "tests.plugins.faulty"
WORKER_READY_S = 90.0  # a cold start imports celery and sympy; generous on a loaded machine


def redis_client() -> redis.Redis:
    return redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=DB, socket_connect_timeout=3,
                       socket_timeout=10)


@pytest.fixture(scope="session", autouse=True)
def redis_db() -> redis.Redis:
    """Our own Redis database, emptied; fails the run with a clear message without Redis."""
    client = redis_client()
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"the integration tests need Redis at {REDIS_HOST}:{REDIS_PORT} "
                    f"(database {DB}), and it is not reachable ({str(exc).rstrip('.')}). Start it "
                    "(`redis-server --daemonize yes`, or `make test`) and run again.",
                    pytrace=False)
    client.flushdb()
    return client


def make_settings(**overrides: Any) -> Settings:
    """Settings of the in-process executors (the workers get the same through the env)."""
    values: dict[str, Any] = {"broker_url": BROKER_URL, "plugins": PLUGINS,
                              "result_ttl_s": 300, **overrides}
    return Settings(**values)


class Worker:
    """One ``rewardd worker`` process (its own process group, so it dies with its children)."""

    def __init__(self, proc: subprocess.Popen, log: Any) -> None:
        self.proc = proc
        self.log = log
        self.hostname = f"rewardd-{proc.pid}@{socket.gethostname()}"

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def children(self) -> list[int]:
        """Pids of the prefork pool's children."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            return [int(pid) for pid in path.read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL the worker and its children at once, as when its machine dies."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Tests end with SIGKILL (Celery's cold shutdown takes seconds, and the module's
        database is flushed afterwards anyway)."""
        self.kill()
        self.log.close()


class WorkerFleet:
    """Starts workers for one module and stops them all at the end."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.workers: list[Worker] = []

    def start(self, count: int = 1, queues: str = "cpu", concurrency: int = 2) -> list[Worker]:
        started = []
        for _ in range(count):
            log = tempfile.NamedTemporaryFile("w+", prefix="rewardd-worker-", suffix=".log",
                                              delete=True)
            proc = subprocess.Popen(
                [sys.executable, "-m", "rewardd.service.cli", "worker", "--queues", queues,
                 "--concurrency", str(concurrency)],
                cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            started.append(Worker(proc, log))
        self.workers.extend(started)
        wait_ready(started)
        return started

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers.clear()


def wait_ready(workers: list[Worker]) -> None:
    """Poll until every worker logs that it consumes its queues; fail with its log if one
    exits or takes longer than WORKER_READY_S."""
    deadline = time.monotonic() + WORKER_READY_S
    pending = list(workers)
    while pending:
        for worker in list(pending):
            if worker.proc.poll() is not None:
                pytest.fail(f"rewardd worker exited with {worker.proc.returncode}:\n"
                            f"{worker.output()}")
            if f"{worker.hostname} ready." in worker.output():
                pending.remove(worker)
        if pending and time.monotonic() > deadline:
            pytest.fail(f"rewardd worker not ready within {WORKER_READY_S:g} s:\n"
                        f"{pending[0].output()}")
        time.sleep(0.1)


def worker_env(settings: Settings) -> dict[str, str]:
    """The environment of worker processes sharing ``settings`` with the test's executor."""
    env = child_env()
    for name in ("broker_url", "plugins", "result_ttl_s", "visibility_timeout_s",
                 "max_verifier_timeout_s", "worker_lost_retries", "task_max_samples"):
        env[f"REWARDD_{name.upper()}"] = str(getattr(settings, name))
    env["REWARDD_LOG_LEVEL"] = "info"
    return env


@pytest.fixture(scope="module")
def fleet_for(redis_db: redis.Redis) -> Iterator[Any]:
    """``fleet_for(settings, env=None)``: a WorkerFleet for this module (``env`` added to its
    workers' environment); stopped and the database flushed afterwards."""
    redis_db.flushdb()
    fleets: list[WorkerFleet] = []

    def make(settings: Settings, env: dict[str, str] | None = None) -> WorkerFleet:
        fleet = WorkerFleet({**worker_env(settings), **(env or {})})
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop()
    redis_db.flushdb()


def result_keys(client: redis.Redis) -> dict[str, int]:
    """Every Celery result key in our database and its TTL in seconds (-1: none)."""
    return {key.decode(): client.ttl(key) for key in client.scan_iter("celery-task-meta-*")}
