"""What this machine can isolate with, and the bubblewrap command line of the zygote.

Detection runs once per process (:func:`isolation`) and costs one short-lived sandbox
(~50 ms): bubblewrap must be present *and* work here (containers often forbid namespaces),
the network namespace must really leave only loopback, and per-run uids need root.

Levels (see :class:`rewardd.verifiers.code.types.Isolation`):

- ``full``: root, bubblewrap works: namespaces, a per-run uid, private tmpfs, rlimits.
- ``namespaces``: not root, bubblewrap works with a user namespace: the same namespaces
  and private tmpfs, no per-run uid (the untrusted code keeps the sandbox's one uid, with
  no capabilities; the run's driver is pid 1 of its namespace, so it cannot be signalled).
- ``none``: no isolation. Code runs only with REWARDD_SANDBOX_UNSAFE=1 (rlimits, seccomp and
  no_new_privs only, on the host's filesystem and network).

Why the interpreter is re-bound: the base interpreter may live under a private directory
(pyenv under ``/root``, mode 700), which the per-run uid could not read; the sandbox shows
its prefix read-only at :data:`PYTHON_MOUNT`. Only the base prefix goes in: the untrusted
code gets the standard library and no site-packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

from rewardd.verifiers.code.settings import sandbox_settings
from rewardd.verifiers.code.types import Isolation

PYTHON_MOUNT = "/opt/rewardd-python"
ZYGOTE_MOUNT = "/opt/rewardd/zygote.py"
ZYGOTE_SOURCE = Path(__file__).with_name("zygote.py")
INCLUDE_MOUNT = "/opt/rewardd/include"
"""Where REWARDD_SANDBOX_INCLUDE_DIR (headers such as testlib.h) is shown in the sandbox."""
PROBE_TIMEOUT_S = 20.0

CAPABILITIES = {
    # mounts of the run (/proc, /tmp), its namespaces, uid drop, killing the run's processes,
    # reading their smaps_rollup (the run's memory as a whole); every test drops them all
    "full": ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_PTRACE"),
    "namespaces": ("CAP_SYS_ADMIN", "CAP_SYS_PTRACE"),
}


def unsafe_allowed() -> bool:
    """REWARDD_SANDBOX_UNSAFE is on (read with the other sandbox settings)."""
    return sandbox_settings().sandbox_unsafe


@dataclass(frozen=True, slots=True)
class PythonLayout:
    """Where the base interpreter is on the host and where the sandbox shows it."""

    host_prefix: str
    host_executable: str
    sandbox_executable: str
    library_path: str | None
    """LD_LIBRARY_PATH for a shared-libpython build whose RUNPATH names the host prefix."""
    binds: tuple[tuple[str, str], ...]


def python_layout() -> PythonLayout:
    prefix = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    executable = os.path.realpath(sys.executable)
    if not executable.startswith(prefix + os.sep):
        executable = os.path.join(prefix, "bin", version)
    if prefix == "/usr" or prefix.startswith("/usr/"):  # /usr is bound as it is
        return PythonLayout(prefix, executable, executable, None, ())
    inside = PYTHON_MOUNT + executable[len(prefix):]
    shared = bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))
    return PythonLayout(prefix, executable, inside, f"{PYTHON_MOUNT}/lib" if shared else None,
                        ((prefix, PYTHON_MOUNT),))


def bwrap_command(level: str, *, info_fd: int | None = None) -> list[str]:
    """The bubblewrap command line that starts the zygote (``level``: full or namespaces)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    layout = python_layout()
    argv = [bwrap, "--ro-bind", "/usr", "/usr"]
    # directories bubblewrap would otherwise create mode 0700 (unreadable for the run's uid)
    for path in ("/etc", "/opt", os.path.dirname(ZYGOTE_MOUNT)):
        argv += ["--perms", "0755", "--dir", path]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    if os.path.exists("/etc/ld.so.cache"):
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for host, inside in layout.binds:
        argv += ["--ro-bind", host, inside]
    include = sandbox_settings().sandbox_include_dir
    if include is not None:
        argv += ["--ro-bind", include, INCLUDE_MOUNT]
    argv += ["--ro-bind", str(ZYGOTE_SOURCE), ZYGOTE_MOUNT,
             "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--hostname", "sandbox",
             "--die-with-parent", "--new-session", "--as-pid-1", "--chdir", "/tmp",
             "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
             "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", "/tmp"]
    if layout.library_path:
        argv += ["--setenv", "LD_LIBRARY_PATH", layout.library_path]
    if level == "namespaces":
        argv += ["--unshare-user"]
    for cap in CAPABILITIES[level]:
        argv += ["--cap-add", cap]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    return argv + [layout.sandbox_executable, "-I", "-S", ZYGOTE_MOUNT,
                   *(["--include", INCLUDE_MOUNT] if include is not None else []),
                   "--level", level]


def unsafe_command() -> list[str]:
    """The zygote without bubblewrap (level none, REWARDD_SANDBOX_UNSAFE=1 only)."""
    include = sandbox_settings().sandbox_include_dir
    return [python_layout().host_executable, "-I", "-S", str(ZYGOTE_SOURCE),
            *(["--include", include] if include is not None else []), "--level", "none"]


def unsafe_env() -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


def _probe(level: str) -> tuple[dict | None, str]:
    """Run the zygote's ``--probe`` under ``level``; (its report, or None and why not)."""
    try:
        argv = bwrap_command(level)
    except FileNotFoundError:
        return None, "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run(argv[:-2] + ["--probe", "--level", level], capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bubblewrap failed to start: {exc}"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()[-500:]
        return None, f"bubblewrap failed (exit {done.returncode}): {why}"
    try:
        return json.loads(done.stdout.decode().strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, f"unexpected probe output: {done.stdout[-200:]!r}"


MEMORY_ACCOUNTED = (
    "a run's processes together: the run's driver sums their anonymous and shared memory "
    "(proportional shares, so pages shared after fork count once) and the files in the run's "
    "tmpfs every 10 ms, and kills every process of the run past memory_mb; the run can "
    "overshoot by what it faults in within one interval (tens of MiB). Each process's "
    "address space is also held to memory_mb (RLIMIT_AS). Kernel memory (pipe and socket "
    "buffers) is bounded only per process; memfd and System V shared memory are refused")
MEMORY_ACCOUNTED_UNSAFE = MEMORY_ACCOUNTED.replace(" and the files in the run's tmpfs", "") + (
    "; without isolation the driver sees only its own descendants (a daemon that leaves "
    "its process tree escapes the count)")


_lock = threading.Lock()
_cached: tuple[Isolation, dict[str, str | None]] | None = None


def _detect() -> tuple[Isolation, dict[str, str | None]]:
    levels = ["full", "namespaces"] if os.geteuid() == 0 else ["namespaces"]
    reasons = []
    for level in levels:
        report, why = _probe(level)
        if report is None:
            reasons.append(f"{level}: {why}")
            continue
        interfaces = report.get("interfaces", [])
        if any(name != "lo" for name in interfaces):
            reasons.append(f"{level}: the network namespace still shows {interfaces}")
            continue
        found = report.get("runtimes", {})
        detail = (f"bubblewrap; seccomp filter: {report.get('seccomp')}; runtimes: "
                  + ", ".join(f"{k}={v}" for k, v in found.items() if v))
        return Isolation(level=level, network=True, per_run_uid=level == "full",
                         filesystem="private", detail=detail,
                         memory_detail=MEMORY_ACCOUNTED), found
    install = ("install bubblewrap (apt-get install bubblewrap) and allow it namespaces"
               + ("" if os.geteuid() == 0 else ", or run as root for per-run uids"))
    detail = f"no isolation: {install}; " + "; ".join(reasons)
    found = {"python": python_layout().host_executable, "cpp": shutil.which("g++"),
             "javascript": shutil.which("node")}
    return Isolation(level="none", network=False, per_run_uid=False, filesystem="host",
                     detail=detail, memory_detail=MEMORY_ACCOUNTED_UNSAFE), found


def _detected() -> tuple[Isolation, dict[str, str | None]]:
    global _cached
    with _lock:
        if _cached is None:
            _cached = _detect()
        return _cached


def isolation() -> Isolation:
    """What the sandbox enforces on this machine; detected on the first call, then cached."""
    return _detected()[0]


def runtimes() -> dict[str, str | None]:
    """Language -> the interpreter or compiler the sandbox runs it with (None: missing)."""
    return dict(_detected()[1])
