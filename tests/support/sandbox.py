"""Helpers shared by the sandbox tests: run a program, find a run's processes on the host."""

from __future__ import annotations

import os
import textwrap

from rewardd.verifiers.code.sandbox import Sandbox
from rewardd.verifiers.code.types import Limits, Program
from rewardd.verifiers.code.types import TestResult as Result
from rewardd.verifiers.code.types import TestRun as Case

FAST = Limits(cpu_s=1.0, wall_s=2.0, memory_mb=256)
"""Tight limits, so attacks and limit tests end quickly."""


def run(box: Sandbox, source: str, *tests: Case, language: str = "python",
        limits: Limits = FAST) -> list[Result]:
    """Run ``source`` (dedented) with ``tests`` (one empty stdio test by default)."""
    return box.run(Program(language, textwrap.dedent(source), tuple(tests) or (Case(),),
                           limits))


def processes_of(uid: int) -> list[int]:
    """Host pids whose real uid is ``uid`` (from the host's /proc: every namespace shows)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids
