"""How many CPUs this process may use: the default size of every verifier pool.

``os.cpu_count()`` counts the node's CPUs, not this process's: a worker pinned with
``taskset -c 0``, or a pod limited to one CPU on a 64-CPU node, forked 64 children (about
110 MB each) that then shared one CPU. Two limits bound a process, and the smaller wins:

* its CPU affinity (``os.sched_getaffinity``: taskset, cpusets, Kubernetes' static CPU
  manager);
* its cgroup v2 CPU quota (``cpu.max``: ``$QUOTA $PERIOD`` or ``max``), the form a pod's CPU
  limit takes; ``ceil(quota / period)`` CPUs' worth of time per period. The quota of every
  cgroup from the process's own up to the root applies, so the smallest is taken.

Hand-written because the libraries that do this (``psutil`` counts affinity only; ``loky``'s
``cpu_count`` reads cgroup v1 and v2 but pulls in joblib's process executor) either miss the
quota or bring far more than these thirty lines.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def quota_cpus(cpu_max: Path) -> int | None:
    """CPUs' worth of the quota in one ``cpu.max`` file (``"200000 100000"`` -> 2,
    ``"150000 100000"`` -> 2), or None when it sets none (``max``), is missing or unreadable."""
    try:
        fields = cpu_max.read_text().split()
    except OSError:
        return None
    if len(fields) < 1 or fields[0] == "max":
        return None
    try:
        quota = int(fields[0])
        period = int(fields[1]) if len(fields) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def own_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup")) -> str:
    """This process's cgroup v2 path (the ``0::/path`` line), ``/`` when there is none."""
    try:
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        pass
    return "/"


def cgroup_cpus(root: Path = CGROUP_ROOT, cgroup: str | None = None) -> int | None:
    """The smallest CPU quota of this process's cgroup and its ancestors, in whole CPUs (None:
    no quota anywhere). Inside a container the namespace's root is the pod's cgroup."""
    path = (cgroup if cgroup is not None else own_cgroup()).strip("/")
    parts = [p for p in path.split("/") if p]
    found = [quota_cpus(root.joinpath(*parts[:depth], "cpu.max"))
             for depth in range(len(parts), -1, -1)]
    quotas = [q for q in found if q is not None]
    return min(quotas) if quotas else None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity, bounded by its cgroup's CPU quota (at least
    1). The default of ``REWARDD_POOL_SIZE`` and ``REWARDD_WORKER_CONCURRENCY``."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    quota = cgroup_cpus()
    return max(1, min(count, quota) if quota is not None else count)
