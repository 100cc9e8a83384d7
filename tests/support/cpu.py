"""The CPU time another process has spent, for tests that must hold on a machine of any speed
and load.

A wall-clock bound measures the machine as much as the code: beside busy processes a request
waits for a core, and so does the test's own thread that times it. The CPU time a process
spent does not grow while it waits, so a share of it (what a server did while one answer
waited, against what it did for a whole request) is the same on an idle machine and a busy
one. Read through the kernel's per-process CPU clock (``clock_getcpuclockid``: nanoseconds,
every thread of the process, live or ended) rather than ``/proc/<pid>/stat``, whose clock
ticks (10 ms) are too coarse for one answer, or a sum over ``/proc/<pid>/task/*``, which
loses the threads that ended in between. The standard library wraps the clock but not the
call that names it, hence ``ctypes``; psutil reads the ticks.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Callable

_libc = ctypes.CDLL(None, use_errno=True)


def process_cpu_clock(pid: int) -> Callable[[], float]:
    """A function returning the CPU seconds process ``pid`` has spent so far (all its
    threads, user and system time). Linux lets any process read another's clock."""
    clock = ctypes.c_int()  # clockid_t
    failed = _libc.clock_getcpuclockid(pid, ctypes.byref(clock))
    if failed:  # the error number itself, not -1 and errno
        raise OSError(failed, f"clock_getcpuclockid({pid}): {os.strerror(failed)}")
    clock_id = clock.value
    return lambda: time.clock_gettime(clock_id)
