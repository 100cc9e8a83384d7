"""A worker pinned to one CPU forks one child, not one per CPU of the node (issue 20).

A real ``rewardd worker`` under ``taskset -c 0`` with no ``--concurrency``: its prefork pool
is sized from the CPUs it may use (workers/cpus.py), counted from /proc.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis

from tests.support.server import REPO_ROOT, child_env

pytestmark = pytest.mark.faults

BROKER_URL = "redis://127.0.0.1:6379/3"  # this scope's database; the worker only consumes


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_worker_pinned_to_one_cpu_runs_one_child() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine gives the tests one CPU: nothing to tell apart")
    env = {**child_env(), "REWARDD_BROKER_URL": BROKER_URL, "REWARDD_LOG_LEVEL": "info"}
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        proc = subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, "-m", "rewardd.service.cli", "worker",
             "--queues", "rewardd-affinity-test"], cwd=REPO_ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while "ready." not in Path(log.name).read_text(errors="replace"):
                assert proc.poll() is None, Path(log.name).read_text(errors="replace")
                assert time.monotonic() < deadline, "worker not ready within 90 s"
                time.sleep(0.2)
            time.sleep(1.0)  # a pool that forked too many would have them all by now
            assert len(children(proc.pid)) == 1, Path(log.name).read_text(errors="replace")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            redis.Redis.from_url(BROKER_URL).flushdb()  # the worker's bindings and census
