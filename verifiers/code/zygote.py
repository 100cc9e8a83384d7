"""The zygote: a warm, stdlib-only Python inside bubblewrap that runs untrusted programs.

It runs as a script (``python -I -S zygote.py --level full``) inside the bubblewrap sandbox
that :mod:`rewardd.verifiers.code.sandbox` starts, and is also imported on the host, only for the
frame helpers below (importing it has no side effect). It may import nothing outside the
standard library: the sandbox holds the base interpreter's stdlib and no site-packages.

Isolation, outside in
---------------------
1. **bubblewrap** (once per zygote): a read-only view of ``/usr`` (and the ``/bin``,
   ``/lib*`` links into it), the interpreter's prefix, ``/etc/ld.so.cache`` and this file;
   nothing else of the host (no ``/etc/passwd``, ``/root``, ``/work``, ``/home``); its own
   network (loopback only), pid, ipc, uts and cgroup namespaces; an empty environment.
   The zygote keeps the few capabilities the steps below need (mounts, setuid, kill).
2. **The run** (one per :class:`Program`): the zygote forks D, the run's driver, straight
   into a new pid namespace (``unshare(CLONE_NEWPID)`` before the fork, ``setns`` back
   after it), where D is pid 1. D makes its own mount namespace and mounts a fresh
   ``/proc`` (only the run's processes are visible) and a fresh, size-limited tmpfs on
   ``/tmp`` (the run's only writable place, gone with the run). Because D is the
   namespace's init, the kernel kills every process of the run when D exits; D also kills
   and reaps every other process of the run after each test, and sends ``done`` only then.
   D stays root (trusted code), so the untrusted processes can neither signal nor ptrace
   it; it reads every pipe, so it alone decides what comes back.
3. **Each test**: D forks T; T starts a new session, closes every descriptor but its stdio
   and the result fd, drops to the run's unprivileged uid/gid (``full``; under
   ``namespaces`` it stays the sandbox's only uid and drops its capabilities instead), sets
   ``no_new_privs`` and a seccomp filter that refuses new namespaces, mounts, ptrace,
   keyrings, bpf, userfaultfd, perf, io_uring, memfd and System V shared memory, and sets
   the rlimits:

   - ``RLIMIT_CPU``: ceil(cpu_s) soft, +1 s hard (SIGXCPU, then SIGKILL);
   - ``RLIMIT_AS``: memory_mb (node: memory_mb + 1 GiB, V8 reserves ~0.7 GiB of address
     space at start; its heap is held to memory_mb by ``--max-old-space-size``; the
     compiler: 1 GiB);
   - ``RLIMIT_FSIZE``: file_size_mb (writes are also bounded by the run's tmpfs size);
   - ``RLIMIT_NOFILE``: 64; ``RLIMIT_CORE``: 0;
   - ``RLIMIT_STACK``: min(memory_mb, 256) MiB for deep recursion (a forked Python test's
     main stack can in fact grow ~128 MiB, the gap the kernel left below it at the
     zygote's start); node gets 8 MiB, since glibc gives every thread that much;
   - ``RLIMIT_NPROC``: ``processes``. The uid is the run's own, so the count is the run's
     and no other run's (node and the compiler get at least 32 and 16: their threads and
     helper processes count too).

   The wall clock is D's: past ``wall_s`` D kills every process of the run (``kill(-1)``
   from the namespace's init) — after every test, in fact, so no process outlives its test.
   So is the run's memory as a whole (:class:`MemoryMeter`): RLIMIT_AS bounds each process
   alone (6 forked children of 400 MiB each pass 512 MiB), so every 10 ms D sums what the
   run's processes hold (anonymous and shared memory, proportional shares, plus the files in
   the run's tmpfs) and kills the whole run past ``memory_mb`` (node: + 64 MiB; the
   compiler: 1 GiB): ``memory_exceeded``. The overshoot is what the run faults in within one
   interval (tens of MiB); the cost ~50 us per interval for a one-process run. Memory that
   no process maps (memfd, System V segments) is refused by the seccomp filter.

``level == "none"`` (only with REWARDD_SANDBOX_UNSAFE=1) skips the namespaces and the uid:
the same driver runs on the host with rlimits, no_new_privs and seccomp only, in a temporary
directory, and cleans up the test's processes by walking its own children (it is a child
subreaper) — best effort, documented as unsafe.

Python tests start no interpreter: T is a fork of this warm interpreter and executes the
program's source in a fresh ``__main__`` module, then the test (see :func:`python_test`).

Protocol (pipes: the grader writes the zygote's stdin, reads its stdout)
------------------------------------------------------------------------
Every message is a frame: a 4-byte big-endian length, then that many bytes of UTF-8 JSON
(an object with an ``op``); bytes travel as base64 strings.

- zygote -> grader, once at start: ``{"op": "ready", "runtimes": {...}, "seccomp": str}``
- grader -> zygote: ``{"op": "run", "uid", "language", "source", "limits": {...},
  "tests": [{"mode", "stdin" (b64), "fn_name", "args_json", "expr", "script", "files"},
  ...], "lockstep": bool, "binary" (b64 or null), "want_binary": bool}``. ``files``: a
  list of ``[name, data (b64)]``, written read-only into the run's ``/tmp`` before the test
  and removed after it; their paths are the program's command-line arguments, in order (a
  special judge's ``checker <input> <output> <answer>``). ``binary``: a C++ program's
  executable, compiled by an earlier run (no compilation); ``want_binary``: send the
  compiled executable back (``{"op": "binary", "data" (b64)}``, before the first result)
  so the grader can cache it.
- zygote -> grader, as soon as it has read a run: ``{"op": "started"}`` (a zygote that
  dies before saying so never ran it: the grader may retry on a fresh one)
- D -> grader, per test: ``{"op": "result", "i", "status", "stdout" (b64), "stderr_tail"
  (b64), "exit_code", "signal", "value_json", "completed", "truncated", "wall_s", "cpu_s",
  "message"}``; D -> grader on an internal error: ``{"op": "fatal", "message"}``
- grader -> D, after each result but the last when ``lockstep``: ``{"op": "next", "go":
  bool}`` (the judge's answer; ``go: false`` ends the run)
- grader -> D at any time: ``{"op": "cancel"}``: D kills the run and exits
- D -> grader, once every other process of the run is reaped: ``{"op": "done", "error":
  null}``; the zygote sends ``{"op": "done", "error": "..."}`` instead when D died
  without sending it
- grader -> zygote: ``{"op": "ping"}`` -> ``{"op": "pong"}`` (resynchronises after a
  cancel); a stray ``next``/``cancel`` reaching an idle zygote is ignored.

D inherits the zygote's stdin and stdout for the run's duration and the zygote writes
nothing until it has reaped D, so frames never interleave. The zygote serves one run at a
time; concurrency comes from one zygote per worker process.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import io
import json
import linecache
import math
import os
import platform
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from typing import Any, NoReturn

# ---- protocol ------------------------------------------------------------------------

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30
CONTROL_FD = 0
"""The grader's requests (and D's ``next``/``cancel``) arrive here."""
REPLY_FD = 1


def pack_frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, n: int) -> bytes:
    """Exactly ``n`` bytes (never more, so a forked D can take over the stream)."""
    parts = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("the grader closed the pipe")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int) -> dict[str, Any]:
    (size,) = HEADER.unpack(read_exact(fd, HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes")
    return json.loads(read_exact(fd, size))


def send(message: dict[str, Any]) -> None:
    write_all(REPLY_FD, pack_frame(message))


# ---- libc --------------------------------------------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                   | CLONE_NEWPID | CLONE_NEWNET)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP = 1, 4, 22
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 36, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
           f"mount {target}")


def prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, arg, arg3, 0, 0), f"prctl {option}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_CAP_HEADER = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
_CAP_NONE = (_CapData * 2)()


def drop_capabilities() -> None:
    """Clear the ambient, effective, permitted and inheritable sets of this process.

    After ``setuid`` to a non-root uid they are empty already; under ``namespaces`` (no
    uid change) this is what takes away the caps bubblewrap granted the zygote.
    """
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _check(_libc.capset(ctypes.byref(_CAP_HEADER), _CAP_NONE), "capset")


# ---- seccomp -----------------------------------------------------------------------------

_SYSCALLS = {
    # arch: (audit arch, has x32 bit, clone, clone3, {name: nr} refused with EPERM)
    "x86_64": (0xC000003E, True, 56, 435, {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323,
        "perf_event_open": 298, "memfd_create": 319, "shmget": 29}),
    "aarch64": (0xC00000B7, False, 220, 435, {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "userfaultfd": 282,
        "perf_event_open": 241, "memfd_create": 279, "shmget": 194}),
}
_COMMON_SYSCALLS = {  # same numbers on both (the unified table from 403 on)
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442}


def seccomp_filter() -> bytes | None:
    """A classic-BPF deny-list for this architecture, or None where there is no table.

    Why: an unprivileged uid may still create user namespaces on most kernels, and inside
    one it can mount tmpfs (memory no rlimit counts) and reach far more kernel code. Refused
    (EPERM): namespace creation (``unshare``, ``setns``, ``clone`` with a CLONE_NEW* flag),
    mounts, ptrace and process_vm_*, keyrings, bpf, userfaultfd, perf_event_open, io_uring,
    and the two kinds of memory no process need map (so no accounting of the run's memory
    sees them): ``memfd_create`` (written, never mapped) and System V ``shmget`` (a segment
    outlives its processes). Python, node and g++ call neither.
    ``clone3`` answers ENOSYS (its flags sit in memory a filter cannot read), so libc falls
    back to ``clone``. Other architectures' calls (int 0x80, x32) kill the process.
    """
    table = _SYSCALLS.get(platform.machine())
    if table is None:
        return None
    arch, x32, clone, clone3, denied = table
    numbers = sorted({*denied.values(), *_COMMON_SYSCALLS.values()})
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    # (code, jt label, jf label, k); labels resolve to relative jumps below
    prog: list[tuple[int, Any, Any, int]] = [(ld, 0, 0, 4), (jeq, None, "kill", arch),
                                             (ld, 0, 0, 0)]
    if x32:
        prog.append((jge, "kill", None, 0x40000000))
    prog += [(jeq, "clone", None, clone), (jeq, "enosys", None, clone3)]
    prog += [(jeq, "eperm", None, nr) for nr in numbers]
    labels: dict[str, int] = {}
    prog.append((ret, 0, 0, allow))
    # jump targets (BPF jumps only forward): clone's flags are args[0], low word at offset 16
    for name, insns in (("clone", [(ld, 0, 0, 16), (jset, "eperm", "allow", NAMESPACE_FLAGS)]),
                        ("allow", [(ret, 0, 0, allow)]), ("kill", [(ret, 0, 0, kill)]),
                        ("enosys", [(ret, 0, 0, enosys)]), ("eperm", [(ret, 0, 0, eperm)])):
        labels[name] = len(prog)
        prog += insns
    out = bytearray()
    for pc, (code, jt, jf, k) in enumerate(prog):
        rel = (lambda target: 0 if target in (0, None) else labels[target] - pc - 1)
        out += struct.pack("=HBBI", code, rel(jt), rel(jf), k)
    return bytes(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Seccomp:
    """A filter built once in the zygote, installed in each test process with one call."""

    def __init__(self, program: bytes) -> None:
        self.buffer = ctypes.create_string_buffer(program, len(program))
        self.fprog = _SockFprog(len(program) // 8, ctypes.addressof(self.buffer))
        self.address = ctypes.addressof(self.fprog)

    def install(self) -> None:
        _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self.address, 0, 0), "seccomp")


# ---- runtimes ------------------------------------------------------------------------------

EXEC_PATH = "/usr/local/bin:/usr/bin:/bin"
INCLUDE_DIR: str | None = None
"""``--include``: the operator's header directory (REWARDD_SANDBOX_INCLUDE_DIR, testlib.h),
on every C++ compilation's include path."""


def find_runtimes() -> dict[str, str | None]:
    """Interpreters and compilers visible in here (inside bubblewrap: what /usr holds)."""
    return {"python": sys.executable, "cpp": shutil.which("g++", path=EXEC_PATH),
            "javascript": shutil.which("node", path=EXEC_PATH)}


# ---- the test process ------------------------------------------------------------------------

RESULT_FD = 1023
"""Where a Python test reports its value; above RLIMIT_NOFILE, out of the program's way."""
SETUP_FAILED = 121
STDERR_TAIL = 4096
COMPILE_MEMORY_MB = 1024
"""The compiler's address space, and its processes' memory together (cc1plus on a template-heavy
program reaches a few hundred MiB; the program's own ``memory_mb`` is not the compiler's)."""
NODE_EXTRA_MB = 1024
NODE_RUN_EXTRA_MB = 64
"""Added to a node run's memory as a whole: V8 holds its old space to ``memory_mb`` and needs
its young generation, code and buffers beside it (~6 MiB of its own at start)."""
NODE_STACK_MB = 8
"""glibc sizes every thread's stack by RLIMIT_STACK at exec; node starts ~10 threads."""
MiB = 1 << 20


def _set_limits(limits: dict[str, Any], *, memory_mb: int, cpu_s: float, processes: int,
                stack_mb: int) -> None:
    cpu = max(1, math.ceil(cpu_s))
    stack = stack_mb * MiB
    for which, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                         (resource.RLIMIT_AS, (memory_mb * MiB,) * 2),
                         (resource.RLIMIT_FSIZE, (limits["file_size_mb"] * MiB,) * 2),
                         (resource.RLIMIT_NOFILE, (64, 64)),
                         (resource.RLIMIT_CORE, (0, 0)),
                         (resource.RLIMIT_STACK, (stack, stack)),
                         (resource.RLIMIT_NPROC, (processes, processes))):
        resource.setrlimit(which, value)


class Child:
    """How to set up one test process (T): fds, uid, rlimits, filters."""

    def __init__(self, run: "Run", *, memory_mb: int, cpu_s: float, processes: int,
                 stack_mb: int | None = None, total_mb: int | None = None) -> None:
        self.run = run
        self.memory_mb, self.cpu_s, self.processes = memory_mb, cpu_s, processes
        self.stack_mb = min(memory_mb, 256) if stack_mb is None else stack_mb
        self.total_mb = memory_mb if total_mb is None else total_mb
        """The memory of all the test's processes together (:class:`MemoryMeter`)."""

    def enter(self, stdin_fd: int, out_w: int, err_w: int, res_w: int | None) -> None:
        """In T, before any untrusted code: everything that makes it a sandboxed test."""
        os.setsid()
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        if res_w is not None:
            os.dup2(res_w, RESULT_FD)
            os.closerange(3, RESULT_FD)
            os.closerange(RESULT_FD + 1, 1 << 20)
        else:
            os.closerange(3, 1 << 20)
        os.chdir(self.run.workdir)
        os.umask(0o022)
        run = self.run
        if run.level == "full":
            os.setgroups([])
            os.setresgid(run.uid, run.uid, run.uid)
            os.setresuid(run.uid, run.uid, run.uid)
        if run.level != "none":  # setresuid clears the permitted set, not the inheritable
            drop_capabilities()
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        _set_limits(run.limits, memory_mb=self.memory_mb, cpu_s=self.cpu_s,
                    processes=self.processes, stack_mb=self.stack_mb)
        if run.seccomp is not None:
            run.seccomp.install()


def exec_program(argv: list[str], workdir: str) -> NoReturn:
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):  # Python ignores these
        signal.signal(sig, signal.SIG_DFL)
    env = {"PATH": EXEC_PATH, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    os.execve(argv[0], argv, env)
    raise AssertionError("unreachable")


def python_test(source: str, test: dict[str, Any]) -> NoReturn:
    """In T: run the program's source, then the test's call, expression or script.

    The value goes back as JSON text on RESULT_FD, tagged by its first byte: ``V`` a value,
    ``C`` completed (script), ``J`` a value JSON cannot hold, ``M`` an uncaught MemoryError,
    ``E`` any other uncaught exception. A program that exits (``sys.exit(0)``,
    ``os._exit(0)``) before that leaves no report, hence no value and ``completed`` false.
    """
    import builtins
    import types

    memory_report = b"M"  # preallocated: no allocation needed to report a MemoryError
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8",
        errors="surrogateescape", newline="\n")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16), encoding="utf-8",
        errors="surrogateescape", newline="\n")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
        errors="backslashreplace", newline="\n", line_buffering=True)
    sys.argv = ["solution.py", *(test.get("argv") or ())]
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    namespace = module.__dict__
    test_code = test.get("script") or test.get("expr")
    for name, text in (("<solution>", source), ("<test>", test_code)):  # source lines in
        if text:  # tracebacks, as for a file
            linecache.cache[name] = (len(text), None, text.splitlines(True), name)

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # a closed or broken stream loses only its own output
                pass

    report: bytes = b""
    gc.freeze()  # the program's collections scan its own objects, not the driver's
    try:
        exec(compile(source, "<solution>", "exec"), namespace)
        mode = test["mode"]
        if mode == "script":
            exec(compile(test["script"] or "", "<test>", "exec"), namespace)
            report = b"C"
        elif mode in ("call", "expr"):
            if mode == "call":
                value = _call(namespace, test["fn_name"] or "", json.loads(test["args_json"]))
            else:
                value = eval(compile(test["expr"] or "None", "<test>", "eval"), namespace)
            try:
                sys.set_int_max_str_digits(0)  # a big int is a value like any other
                report = b"V" + json.dumps(value, allow_nan=False).encode()
            except (TypeError, ValueError, RecursionError) as exc:
                report = b"J" + f"{type(exc).__name__}: {exc}".encode(errors="replace")
    except SystemExit as exc:
        flush()
        code = exc.code
        if code is None:
            os._exit(0)
        if isinstance(code, int):
            os._exit(code & 0xFF)
        print(code, file=sys.stderr)
        flush()
        os._exit(1)
    except MemoryError:
        os.write(RESULT_FD, memory_report)
        try:
            sys.stderr.write("MemoryError\n")
        except BaseException:
            pass
        flush()
        os._exit(1)
    except BaseException as exc:
        try:  # as python would print it: from the program's frames on, with source lines
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            traceback.print_exception(type(exc), exc, tb)
            report = b"E" + f"{type(exc).__name__}: {exc}".encode(errors="replace")[:1000]
        except BaseException:
            report = b"E"
        flush()
        write_all(RESULT_FD, report)
        os._exit(1)
    flush()
    if report:
        write_all(RESULT_FD, report)
    os._exit(0)


def _call(namespace: dict[str, Any], name: str, args: Any) -> Any:
    """``name(*args)``, or ``Solution().name(*args)`` when only the class defines it.

    ``args`` from JSON: a list spreads into positional arguments, an object into keyword
    arguments, anything else is the single argument.
    """
    fn = namespace.get(name)
    if not callable(fn) and isinstance(namespace.get("Solution"), type):
        fn = getattr(namespace["Solution"](), name, None)
    if not callable(fn):
        raise NameError(f"the program defines no function {name!r}")
    if isinstance(args, list):
        return fn(*args)
    if isinstance(args, dict):
        return fn(**args)
    return fn(args)


# ---- the run's memory, as a whole ------------------------------------------------------------

MEMORY_POLL_S = 0.01
"""How often D sums the run's memory. What a run can fault in within one interval is how far it
can pass its limit before it is killed (~20-40 MiB per busy core on a 2024 server)."""
PRECISE_SPACING = 20
"""A precise pass that took t seconds is not repeated for 20 t: it costs D at most ~5% of a core
(~2 us per MiB mapped: ~1 ms for a 512 MiB run)."""


def _kib_fields(text: bytes, names: tuple[bytes, ...]) -> int:
    """The sum of ``names`` (lines ``Name:   123 kB``) in a /proc file, in bytes."""
    total = 0
    for line in text.split(b"\n"):
        key, _, rest = line.partition(b":")
        if key in names:
            total += int(rest.split()[0])
    return total * 1024


def _descendants() -> list[int]:
    """Every descendant of this process (level ``none``, where /proc is the host's)."""
    found, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = [int(p) for p in f.read().split()]
        except OSError:
            continue
        found += children
        todo += children
    return found


class MemoryMeter:
    """The memory of a run's processes together, which D holds to one limit.

    RLIMIT_AS bounds each process alone: 6 forked children of 400 MiB pass a 512 MiB limit.
    Without a cgroup, D sums what the run's processes hold every :data:`MEMORY_POLL_S` and
    kills the whole run past the limit. Two passes keep it cheap and exact enough:

    - the bound: ``RssAnon + RssShmem`` of every process (/proc/<pid>/status, ~6 us each),
      plus the bytes in the run's tmpfs. An upper bound: a page shared after ``fork`` counts
      once per process that maps it (every Python test shares ~9 MiB of the zygote's heap).
    - only when the bound is over the limit, the precise pass: ``Pss_Anon + Pss_Shmem`` from
      /proc/<pid>/smaps_rollup (a page shared by n processes counts 1/n), plus the tmpfs.
      It needs CAP_SYS_PTRACE (D has it; the tests drop every capability); where it cannot
      be read the bound decides, which can only err towards a kill.

    Not counted (bounded by the per-process limits instead): kernel memory such as pipe and
    socket buffers and page tables, a few MiB per process under RLIMIT_NOFILE 64.
    """

    def __init__(self, limit_mb: int, level: str) -> None:
        self.limit_mb = limit_mb
        self.limit = limit_mb * MiB
        self.level = level
        self.next_check = 0.0
        self.next_precise = 0.0
        self.shared = 0
        """What the last precise pass found the bound to overcount (pages shared by fork)."""
        self.held = 0
        """Bytes the run held when it was found over its limit."""

    def _pids(self) -> list[int]:
        if self.level == "none":
            return _descendants()
        own = os.getpid()  # D is pid 1 of the run's namespace: /proc shows the run alone
        return [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != own]

    def _tmpfs(self) -> int:
        if self.level == "none":
            return 0
        st = os.statvfs("/tmp")
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    @staticmethod
    def _sum(pids: list[int], name: str, fields: tuple[bytes, ...]) -> int | None:
        """``fields`` summed over ``pids`` (a process gone meanwhile counts 0); None where
        a file cannot be read."""
        total = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    total += _kib_fields(f.read(), fields)
            except (FileNotFoundError, ProcessLookupError):
                continue
            except OSError:
                return None
        return total

    def over(self, now: float) -> bool:
        """True when the run holds more than its limit (checked at most every poll)."""
        if now < self.next_check:
            return False
        self.next_check = now + MEMORY_POLL_S
        pids = self._pids()
        tmpfs = self._tmpfs()
        bound = self._sum(pids, "status", (b"RssAnon", b"RssShmem"))
        if bound is not None and tmpfs + bound <= self.limit:
            return False
        # between precise passes, the bound less the sharing the last one found decides
        # whether one is due now: the spacing only spares D a run over by sharing alone
        if (now < self.next_precise and bound is not None
                and tmpfs + bound - self.shared <= self.limit):
            return False
        started = time.monotonic()
        precise = self._sum(pids, "smaps_rollup", (b"Pss_Anon", b"Pss_Shmem"))
        self.next_precise = started + PRECISE_SPACING * (time.monotonic() - started)
        if precise is not None and bound is not None:
            self.shared = max(0, bound - precise)
        held = tmpfs + (precise if precise is not None else bound or 0)
        if held <= self.limit:
            return False
        self.held = held
        return True


# ---- the driver (D) ------------------------------------------------------------------------


class Cancelled(Exception):
    """The grader asked to stop the run (or went away)."""


class Run:
    """The driver of one run: D, pid 1 of the run's pid namespace (see the module docstring)."""

    def __init__(self, request: dict[str, Any], level: str, stdin_fds: list[int],
                 seccomp: Seccomp | None) -> None:
        self.level = level
        self.uid = int(request["uid"])
        self.language = request["language"]
        self.source: str = request["source"]
        self.limits: dict[str, Any] = request["limits"]
        self.tests: list[dict[str, Any]] = request["tests"]
        self.lockstep = bool(request.get("lockstep"))
        self.stdin_fds = stdin_fds
        self.seccomp = seccomp
        self.workdir = "/tmp"
        self.binary: str | None = None
        self.compile_error: str | None = None
        self.prebuilt: str | None = request.get("binary")
        self.want_binary = bool(request.get("want_binary"))

    # -- setup

    def setup(self) -> None:
        prctl(PR_SET_DUMPABLE, 0)
        if self.level == "none":
            prctl(PR_SET_CHILD_SUBREAPER, 1)
            self.workdir = tempfile.mkdtemp(prefix="rewardd-run-")
            return
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        size_mb = 64 + 2 * int(self.limits["file_size_mb"])
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={size_mb}m,nr_inodes=4096,mode=1777")

    def cleanup(self) -> None:
        if self.level == "none":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def write_source(self, name: str) -> str:
        path = os.path.join(self.workdir, name)
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(self.source)
        os.chmod(path, 0o644)
        return path

    # -- the run

    def drive(self) -> None:
        self.setup()
        try:
            if self.language == "cpp" and self.prebuilt:
                self.install_binary()
            elif self.language == "cpp":
                self.compile_cpp()
                if self.want_binary and self.binary is not None:
                    with open(self.binary, "rb") as f:
                        send({"op": "binary", "data": b64(f.read())})
            elif self.language == "javascript":
                self.binary = self.write_source("main.js")
            last = len(self.tests) - 1
            for i, test in enumerate(self.tests):
                result = self.one_test(i, test)
                send({"op": "result", "i": i, **result})
                if i == last:
                    break
                if self.lockstep:
                    message = read_frame(CONTROL_FD)
                    if message.get("op") != "next" or not message.get("go"):
                        break
                else:
                    self.check_cancel(0)
        except Cancelled:
            self.reap_all()
        finally:
            self.cleanup()

    def check_cancel(self, timeout_ms: int) -> None:
        if select.select([CONTROL_FD], [], [], timeout_ms / 1000)[0]:
            self.on_control()

    def on_control(self) -> None:
        try:
            message = read_frame(CONTROL_FD)
        except EOFError:
            raise Cancelled() from None
        if message.get("op") == "cancel":
            raise Cancelled()

    def one_test(self, i: int, test: dict[str, Any]) -> dict[str, Any]:
        limits = self.limits
        if self.compile_error is not None:
            return failure("compile_error", self.compile_error)
        if self.language != "python" and test["mode"] != "stdio":
            return failure("compile_error",
                           f"mode {test['mode']!r} not supported for {self.language}")
        memory_mb, processes = int(limits["memory_mb"]), int(limits["processes"])
        stack_mb, total_mb = None, memory_mb
        if self.language not in ("python", "cpp", "javascript"):
            return failure("compile_error", f"unsupported language {self.language!r}")
        if self.language == "javascript":
            node = shutil.which("node", path=EXEC_PATH)
            if node is None:
                return failure("compile_error", "node is not installed in the sandbox")
            argv = [node, f"--max-old-space-size={memory_mb}", self.binary or ""]
            total_mb = memory_mb + NODE_RUN_EXTRA_MB
            memory_mb, processes = memory_mb + NODE_EXTRA_MB, max(processes, 32)
            stack_mb = NODE_STACK_MB
        elif self.language == "cpp":
            argv = [self.binary or ""]
        else:
            argv = []
        paths = self.write_files(test.pop("files", None) or [])
        test["argv"] = paths  # a Python test's sys.argv[1:]; an executable's arguments:
        argv = argv + paths if argv else argv
        child = Child(self, memory_mb=memory_mb, cpu_s=float(limits["cpu_s"]),
                      processes=processes, stack_mb=stack_mb, total_mb=total_mb)
        stdin_fd = self.stdin_fds[i]
        try:
            outcome = self.spawn(child, stdin_fd, argv, test, wall_s=float(limits["wall_s"]),
                                 output_bytes=int(limits["output_bytes"]))
        finally:
            os.close(stdin_fd)
            self.stdin_fds[i] = -1
            for path in paths:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        return classify(outcome, cpu_s=float(limits["cpu_s"]), mode=test["mode"],
                        language=self.language)

    def install_binary(self) -> None:
        """A C++ program compiled by an earlier run (the grader's cache): no compilation."""
        path = os.path.join(self.workdir, "main")
        with open(path, "wb") as f:
            f.write(unb64(self.prebuilt or ""))
        os.chmod(path, 0o755)
        self.prebuilt = None
        self.binary = path

    def write_files(self, files: list[list[str]]) -> list[str]:
        """A test's argument files, read-only in the run's tmp (owned by D: the program can
        read them, not change or remove them); their paths, in order."""
        paths = []
        for name, data in files:
            if not name or "/" in name or name in (".", "..", "main", "main.cpp", "main.js"):
                raise ValueError(f"bad argument file name {name!r}")
            path = os.path.join(self.workdir, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o444)
            try:
                write_all(fd, unb64(data))
            finally:
                os.close(fd)
            os.chmod(path, 0o444)
            paths.append(path)
        return paths

    def compile_cpp(self) -> None:
        compiler = shutil.which("g++", path=EXEC_PATH)
        if compiler is None:
            self.compile_error = "g++ is not installed in the sandbox"
            return
        source = self.write_source("main.cpp")
        binary = os.path.join(self.workdir, "main")
        argv = [compiler, "-O2", "-std=c++17", "-pipe",
                *(["-I", INCLUDE_DIR] if INCLUDE_DIR else []), "-o", binary, source]
        compile_s = float(self.limits["compile_s"])
        child = Child(self, memory_mb=COMPILE_MEMORY_MB, cpu_s=compile_s,
                      processes=max(int(self.limits["processes"]), 16), stack_mb=64)
        null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        try:
            outcome = self.spawn(child, null, argv, None, wall_s=compile_s,
                                 output_bytes=64 * 1024)
        finally:
            os.close(null)
        if outcome["reason"] == "memory":
            self.compile_error = f"compilation used more than {COMPILE_MEMORY_MB} MiB"
        elif outcome["reason"] == "wall" or outcome["signal"] in (signal.SIGXCPU,
                                                                   signal.SIGKILL):
            self.compile_error = f"compilation ran past its {compile_s:g}s limit"
        elif outcome["exit_code"] != 0:
            tail = outcome["stderr"].decode(errors="replace")
            self.compile_error = "compilation failed:\n" + tail
        else:
            self.binary = binary

    def spawn(self, child: Child, stdin_fd: int, argv: list[str], test: dict[str, Any] | None,
              *, wall_s: float, output_bytes: int) -> dict[str, Any]:
        """Fork T, feed and watch it until it exits or a limit hits; then kill the rest."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe() if not argv else (-1, -1)
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                child.enter(stdin_fd, out_w, err_w, res_w if res_w >= 0 else None)
            except BaseException as exc:
                try:
                    os.write(2, f"rewardd sandbox setup failed: {exc!r}\n".encode())
                finally:
                    os._exit(SETUP_FAILED)
            try:
                if argv:
                    exec_program(argv, self.workdir)
                assert test is not None
                for other in self.tests:  # this test's code only, not the run's other tests
                    if other is not test:
                        other.clear()
                python_test(self.source, test)
            finally:
                os._exit(SETUP_FAILED)
        for fd in (out_w, err_w, res_w):
            if fd >= 0:
                os.close(fd)
        try:
            markers = MEMORY_MARKERS.get(self.language, ()) if test is not None else ()
            watched = Watch(out_r, err_r, res_r, output_bytes, markers)
            meter = MemoryMeter(child.total_mb, self.level)
            reason = self.watch(pid, watched, started + wall_s, meter)
            self.kill_all()
            _, status, usage = os.wait4(pid, 0)
            self.reap_all()
            watched.drain()
        finally:
            for fd in (out_r, err_r, res_r):
                if fd >= 0:
                    os.close(fd)
        reason = reason or watched.over
        return {"reason": reason, "wall_s": time.monotonic() - started,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "stdout": bytes(watched.stdout), "stderr": bytes(watched.stderr[-STDERR_TAIL:]),
                "report": bytes(watched.report), "truncated": watched.truncated,
                "out_of_memory": watched.out_of_memory,
                # rounded up, so a run killed just over its limit never reads as held at it
                "memory_held_mb": -(-meter.held // MiB), "memory_limit_mb": meter.limit_mb,
                "output_bytes": output_bytes}

    def watch(self, pid: int, watched: "Watch", deadline: float,
              meter: MemoryMeter) -> str | None:
        """Poll T's pipes, its pidfd and the control pipe until T exits or a limit hits
        (``wall``, ``memory``: the run's processes together, ``output``, ``report``)."""
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        try:
            for fd in watched.fds:
                poller.register(fd, select.POLLIN)
            poller.register(pidfd, select.POLLIN)
            poller.register(CONTROL_FD, select.POLLIN)
            while True:
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    return "wall"
                if meter.over(now):
                    return "memory"
                left = min(left, MEMORY_POLL_S)
                for fd, _ in poller.poll(max(1, math.ceil(left * 1000))):
                    if fd == pidfd:
                        return None
                    if fd == CONTROL_FD:
                        self.on_control()  # raises Cancelled on cancel or EOF
                    elif not watched.read(fd):
                        poller.unregister(fd)
                if watched.over:
                    return watched.over
        finally:
            os.close(pidfd)

    def kill_all(self) -> None:
        """Kill every process of the run but D (or, unsafe, every descendant of D)."""
        if self.level != "none":
            try:
                os.kill(-1, signal.SIGKILL)  # from the namespace's init: all but itself
            except ProcessLookupError:
                pass
            return
        for pid in _children():
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def reap_all(self) -> None:
        """Wait until D has no child left; kill again before each wait, so none escapes."""
        while True:
            self.kill_all()
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return


def _children() -> list[int]:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


MEMORY_MARKERS = {
    # what an uncaught allocation failure prints, looked for in all of stderr (not the tail)
    "python": (b"MemoryError",),
    "cpp": (b"std::bad_alloc",),
    "javascript": (b"heap out of memory", b"Array buffer allocation failed",
                   b"Fatal process out of memory"),
}


class Watch:
    """The pipes of one test and what came back on them, with the caps applied."""

    def __init__(self, out_r: int, err_r: int, res_r: int, output_bytes: int,
                 markers: tuple[bytes, ...] = ()) -> None:
        self.out_r, self.err_r, self.res_r = out_r, err_r, res_r
        self.fds = [fd for fd in (out_r, err_r, res_r) if fd >= 0]
        self.cap = output_bytes
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.report = bytearray()
        self.truncated = False
        self.over: str | None = None
        self.markers = markers
        self.out_of_memory = False

    def read(self, fd: int) -> bool:
        """Read what is there; False at end of file."""
        data = os.read(fd, 1 << 16)
        if not data:
            return False
        if fd == self.out_r:
            room = self.cap - len(self.stdout)
            if len(data) > room:
                self.stdout += data[:max(room, 0)]
                self.truncated, self.over = True, "output"
            else:
                self.stdout += data
        elif fd == self.err_r:
            if self.markers and not self.out_of_memory:
                window = bytes(self.stderr[-64:]) + data  # a marker split across reads
                self.out_of_memory = any(marker in window for marker in self.markers)
            self.stderr += data
            if len(self.stderr) > 2 * STDERR_TAIL:
                del self.stderr[:-STDERR_TAIL]
        else:
            self.report += data
            if len(self.report) > self.cap + 1:
                self.over = "report"
        return True

    def drain(self) -> None:
        """After every writer is dead: read to end of file (what T wrote before exiting)."""
        for fd in self.fds:
            while self.read(fd):
                pass


def failure(status: str, message: str) -> dict[str, Any]:
    return {"status": status, "stdout": "", "stderr_tail": "", "exit_code": None,
            "signal": None, "value_json": None, "completed": False, "truncated": False,
            "wall_s": 0.0, "cpu_s": 0.0, "message": message}


def classify(o: dict[str, Any], *, cpu_s: float, mode: str, language: str) -> dict[str, Any]:
    """A test's status from how it ended, in order of precedence.

    ``timeout``: past the wall clock, killed by SIGXCPU (or by SIGKILL at RLIMIT_CPU's hard
    limit), or more CPU than ``cpu_s``. ``output_limit``: more than ``output_bytes`` of
    stdout (or of return value). ``memory_exceeded``: the run's processes together held more
    than its limit (D killed them, :class:`MemoryMeter`); the Python driver reported an uncaught
    MemoryError; heuristically, a failing process whose stderr (all of it, not only the
    tail) holds its language's allocation-failure text (:data:`MEMORY_MARKERS`: a C++
    ``std::bad_alloc`` abort, node's heap or ArrayBuffer failures). A C++ program whose
    ``malloc`` returns NULL usually segfaults instead: that stays a runtime_error.
    ``ok``: exit status 0 and, for Python's call/expr/script modes, the driver's report came
    back (a program that exits 0 before it, or whose value JSON cannot hold, is a
    ``runtime_error``). Anything else: ``runtime_error``.
    """
    sig, code, report, stderr = o["signal"], o["exit_code"], o["report"], o["stderr"]
    value_json, completed, status, message = None, False, "runtime_error", ""
    tag, body = report[:1], report[1:]
    if tag == b"V":
        value_json = body.decode("utf-8", errors="replace")
    elif tag == b"C":
        completed = True
    if o["reason"] == "memory":  # D killed the run: its signal says nothing more
        status = "memory_exceeded"
        message = (f"the run's processes held {o['memory_held_mb']} MiB together, over its "
                   f"limit of {o['memory_limit_mb']} MiB")
    elif o["reason"] == "wall":
        status, message = "timeout", "wall-clock limit"
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and o["cpu_s"] >= math.floor(cpu_s)):
        status, message = "timeout", "CPU time limit"
    elif o["cpu_s"] > cpu_s:
        status, message = "timeout", f"used {o['cpu_s']:.2f}s of CPU, limit {cpu_s:g}s"
    elif o["reason"] == "output":
        status, message = "output_limit", f"more than {o['output_bytes']} bytes of stdout"
    elif o["reason"] == "report":
        status, message = "output_limit", f"return value over {o['output_bytes']} bytes"
        value_json = None
    elif tag == b"M" or (code != 0 and o["out_of_memory"]):
        status, message = "memory_exceeded", "out of memory"
    elif code == 0:
        status = "ok"
        if language == "python" and mode in ("call", "expr") and value_json is None:
            status = "runtime_error"
            message = ("return value is not JSON data: " + body.decode(errors="replace")
                       if tag == b"J" else "the program exited before returning a value")
        elif language == "python" and mode == "script" and not completed:
            status, message = "runtime_error", "the program exited before the test script ended"
    elif code == SETUP_FAILED:
        message = "sandbox setup of the test process failed"
    elif sig is not None:
        message = f"killed by signal {sig} ({_signal_name(sig)})"
    else:
        message = f"exit status {code}"
        if tag == b"E":
            message += ": " + body.decode(errors="replace")
    return {"status": status, "stdout": b64(o["stdout"]), "stderr_tail": b64(stderr),
            "exit_code": code, "signal": sig, "value_json": value_json,
            "completed": completed, "truncated": o["truncated"],
            "wall_s": round(o["wall_s"], 6), "cpu_s": round(o["cpu_s"], 6), "message": message,
            "exception": status == "runtime_error" and tag == b"E"}


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown"


# ---- the zygote's loop ------------------------------------------------------------------------


def stdin_memfds(tests: list[dict[str, Any]]) -> list[int]:
    """Each test's stdin as a memfd: no feeding loop, and no copy in D's address space."""
    fds = []
    for i, test in enumerate(tests):
        fd = os.memfd_create(f"stdin{i}")
        write_all(fd, unb64(test.pop("stdin", "") or ""))
        os.lseek(fd, 0, os.SEEK_SET)
        fds.append(fd)
    return fds


def start_run(request: dict[str, Any], level: str, seccomp: Seccomp | None,
              own_pid_ns: int | None) -> dict[str, Any] | None:
    """Fork the run's driver D and wait for it; a ``done`` frame if D could not send one.

    D is forked straight into a new pid namespace (``unshare(CLONE_NEWPID)`` applies to the
    zygote's next child; ``setns`` back to the zygote's own namespace undoes that), then
    makes its own mount namespace. D sends ``done`` itself once every other process of the
    run is reaped, so the grader need not wait for D's own exit (the zygote reaps it before
    it reads the next request).
    """
    fds = stdin_memfds(request["tests"])
    pid = -1
    try:
        if own_pid_ns is not None:
            unshare(CLONE_NEWPID)
        pid = os.fork()
    finally:
        if pid != 0:  # the zygote, whether or not the fork worked
            if own_pid_ns is not None:
                setns(own_pid_ns, CLONE_NEWPID)
            for fd in fds:
                os.close(fd)
    if pid == 0:
        code = 70
        try:
            if level != "none":
                unshare(CLONE_NEWNS)
                mount(None, "/", None, MS_REC | MS_PRIVATE)
            Run(request, level, fds, seccomp).drive()
            send({"op": "done", "error": None})
            code = 0
        except BaseException:
            try:
                send({"op": "fatal", "message": traceback.format_exc()[-4000:]})
            except BaseException:
                pass
        finally:
            os._exit(code)
    failures = []
    while True:
        try:
            _, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if os.WIFSIGNALED(status):
            failures.append(f"the run's driver was killed by signal {os.WTERMSIG(status)}")
        elif os.WEXITSTATUS(status):
            failures.append(f"the run's driver exited with status {os.WEXITSTATUS(status)}")
    return {"op": "done", "error": "; ".join(failures)} if failures else None


def _warm_up() -> None:
    """Compile and run a little code once, so each test's fork finds the compiler warm."""
    sample = "import sys\ndef f(a, *b, **c):\n    return [x for x in range(3) if x] or f'{a}'\n"
    exec(compile(sample + "f(1)\n", "<warm-up>", "exec"), {"__name__": "__warm__"})
    json.dumps(json.loads('{"a": [1, 2.5, "x", null, true]}'))


def serve(level: str) -> None:
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    _warm_up()
    gc.freeze()  # a collection in a forked child would touch (copy) every page of the heap
    program = seccomp_filter()
    seccomp = Seccomp(program) if program is not None else None
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY) if level != "none" else None
    send({"op": "ready", "runtimes": find_runtimes(),
          "seccomp": platform.machine() if seccomp else "none", "pid": os.getpid()})
    while True:
        try:
            message = read_frame(CONTROL_FD)
        except EOFError:
            return
        op = message.get("op")
        if op == "run":
            send({"op": "started"})
            try:
                done = start_run(message, level, seccomp, own_pid_ns)
            except Exception as exc:  # could not fork or unshare (out of pids, memory)
                done = {"op": "done", "error": f"could not start the run: {exc!r}"}
            if done is not None:
                send(done)
        elif op == "ping":
            send({"op": "pong"})
        # a stray "next"/"cancel" from a run that already ended: ignored


def probe() -> None:
    """``--probe``: print what this sandbox enforces, as one line of JSON."""
    names = [name for _, name in __import__("socket").if_nameindex()]
    print(json.dumps({"interfaces": names, "uid": os.getuid(), "runtimes": find_runtimes(),
                      "seccomp": platform.machine() if seccomp_filter() else "none",
                      "python": platform.python_version()}))


def _install_quitters() -> None:
    """``-S`` skips site, which defines ``exit``/``quit``; competitive code calls them."""
    import builtins

    def _quit(code: Any = None) -> NoReturn:
        raise SystemExit(code)

    builtins.exit = builtins.quit = _quit  # type: ignore[attr-defined]


def main(argv: list[str]) -> None:
    global INCLUDE_DIR
    level = argv[argv.index("--level") + 1] if "--level" in argv else "full"
    if "--include" in argv:
        INCLUDE_DIR = argv[argv.index("--include") + 1]
    if "--probe" in argv:
        probe()
        return
    _install_quitters()
    serve(level)


if __name__ == "__main__":
    main(sys.argv[1:])
