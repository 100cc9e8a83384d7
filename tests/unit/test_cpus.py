"""The CPUs a process may use: affinity, bounded by the cgroup v2 quota (workers/cpus.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rewardd.workers.cpus import cgroup_cpus, own_cgroup, quota_cpus, usable_cpus
from tests.support.server import REPO_ROOT, child_env


@pytest.mark.parametrize(("text", "cpus"), [
    ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1),
    ("100000\n", 1), ("max 100000\n", None), ("", None), ("junk 100000", None),
    ("0 100000", None)])
def test_cpu_max_is_read_as_whole_cpus_rounded_up(tmp_path: Path, text: str,
                                                  cpus: int | None) -> None:
    (tmp_path / "cpu.max").write_text(text)
    assert quota_cpus(tmp_path / "cpu.max") == cpus


def test_a_missing_cpu_max_sets_no_quota(tmp_path: Path) -> None:
    assert quota_cpus(tmp_path / "cpu.max") is None


def test_the_smallest_quota_from_the_cgroup_up_to_the_root_wins(tmp_path: Path) -> None:
    pod = tmp_path / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000")
    (tmp_path / "kubepods" / "cpu.max").write_text("300000 100000")
    (pod / "cpu.max").write_text("800000 100000")
    assert cgroup_cpus(tmp_path, "/kubepods/pod1") == 3
    assert cgroup_cpus(tmp_path, "/") is None


def test_own_cgroup_reads_the_v2_line(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/system.slice/rewardd.service\n")
    assert own_cgroup(tmp_path / "cgroup") == "/system.slice/rewardd.service"
    assert own_cgroup(tmp_path / "missing") == "/"


def test_usable_cpus_never_exceeds_the_affinity() -> None:
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_process_pinned_to_one_cpu_defaults_both_pools_to_one() -> None:
    code = ("from rewardd.service.settings import Settings; s = Settings(); "
            "print(s.pool_size, s.worker_concurrency)")
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], cwd=REPO_ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.split() == ["1", "1"]
