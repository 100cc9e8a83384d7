"""Run untrusted programs against tests: the grader's side of the code sandbox.

One :class:`Sandbox` per worker process owns one zygote: a warm Python inside bubblewrap
(:mod:`rewardd.verifiers.code.zygote`, whose docstring describes the isolation layers and the
limits). The zygote starts lazily on the first :meth:`Sandbox.run` — never at import and
never in a forkserver parent, which would hand every forked worker the same pipes — and is
restarted if it died. :func:`get_sandbox` gives each process its own instance (a forked
child gets a new one).

A run executes all tests of one program in one private world (one tmpfs, one uid, one pid
namespace), one test after the other, and returns their results; ``judge(i, result)``
runs after each result and stops the run when it answers False (all-or-nothing rewards need
nothing past the first failure, and the rest of the run is never executed).

Interruption: the worker's soft deadline raises a BaseException from a SIGALRM handler
anywhere in :meth:`Sandbox.run`. The run is then cancelled before the exception goes on:
with SIGALRM blocked, the grader sends ``cancel`` and ``ping`` and reads until ``pong``;
the zygote answers only once every process of the run is gone (the run's driver is pid 1
of its pid namespace, so the kernel kills and reaps them all when it exits). If the
stream cannot be trusted (interrupted mid-frame, no answer within a second), the zygote is
killed instead — its own pid namespace takes everything with it — and the next run starts
a fresh one.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from typing import IO, Any, Callable

from rewardd.verifiers.code.runtimes import (bwrap_command, isolation, runtimes, unsafe_allowed,
                                     unsafe_command, unsafe_env)
from rewardd.verifiers.code.settings import sandbox_settings
from rewardd.verifiers.code.types import Isolation, Program, TestResult
from rewardd.verifiers.code.zygote import HEADER, MAX_FRAME_BYTES, b64, pack_frame, unb64

__all__ = ["Sandbox", "SandboxError", "SandboxUnavailable", "get_sandbox", "isolation",
           "runtimes"]

Judge = Callable[[int, TestResult], bool]
OnBinary = Callable[[bytes], None]
log = logging.getLogger(__name__)

UID_BASE = 2_000_000_000
"""Per-run uids are UID_BASE + 16 * (the zygote's bubblewrap pid) + (run counter % 16):
distinct from every other live sandbox's (the pid is unique while it lives), below 2**31,
and far above any real account or subuid range."""
UID_SLOTS = 16
START_TIMEOUT_S = 30.0
CANCEL_TIMEOUT_S = 2.0
SLACK_S = 10.0
"""Added to a run's own time budget before the grader gives up on the zygote."""
PER_TEST_SLACK_S = 1.0
LEVELS = ("none", "namespaces", "full")
"""Isolation levels, weakest first (REWARDD_SANDBOX_REQUIRE_ISOLATION compares by it)."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): the zygote died or answered nonsense."""


class SandboxUnavailable(SandboxError):
    """This machine cannot isolate code and REWARDD_SANDBOX_UNSAFE is not set."""


class _NotTaken(Exception):
    """The zygote was gone before it took the request: nothing ran, a retry is safe."""


class _Zygote:
    """One zygote process and its two pipes, with deadline-aware frame reads."""

    def __init__(self, level: str) -> None:
        self.level = level
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        self.child_pidfd: int | None = None
        info_r = info_w = -1
        if level == "none":
            argv, env, pass_fds = unsafe_command(), unsafe_env(), ()
        else:
            info_r, info_w = os.pipe()
            argv, env, pass_fds = bwrap_command(level, info_fd=info_w), {}, (info_w,)
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, env=env, pass_fds=pass_fds,
                                         start_new_session=True, bufsize=0, close_fds=True)
        finally:
            if info_w >= 0:
                os.close(info_w)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        self._buffer = bytearray()
        self.eof = False
        self.runs = 0
        try:
            ready = self.recv(time.monotonic() + START_TIMEOUT_S)
            if ready.get("op") != "ready":
                raise SandboxError(f"zygote said {ready!r} instead of ready")
            self.ready = ready
            if info_r >= 0:
                self.child_pidfd = self._pidfd_from_info(info_r)
        except BaseException:
            self.kill()
            raise
        finally:
            if info_r >= 0:
                os.close(info_r)

    def _pidfd_from_info(self, info_r: int) -> int | None:
        """A pidfd of the zygote (bubblewrap's child, pid 1 of the sandbox) from --info-fd."""
        data = b""
        while select.select([info_r], [], [], 5.0)[0]:
            chunk = os.read(info_r, 4096)
            if not chunk:
                break
            data += chunk
        try:
            return os.pidfd_open(int(json.loads(data)["child-pid"]))
        except (ValueError, KeyError, OSError):
            return None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self) -> str:
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 2000))
            return self._stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def send(self, message: dict[str, Any]) -> None:
        data = memoryview(pack_frame(message))
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except BrokenPipeError:
            raise SandboxError(f"the zygote is gone: {self.stderr_tail()}") from None

    def recv(self, deadline: float) -> dict[str, Any]:
        """The next frame; SandboxError past ``deadline`` or at end of stream."""
        while True:
            if len(self._buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(self._buffer)
                if size > MAX_FRAME_BYTES:
                    raise SandboxError(f"zygote sent a frame of {size} bytes")
                end = HEADER.size + size
                if len(self._buffer) >= end:
                    body = bytes(self._buffer[HEADER.size:end])
                    del self._buffer[:end]
                    try:
                        return json.loads(body)
                    except ValueError:
                        raise SandboxError("zygote sent a malformed frame") from None
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                raise SandboxError("the sandbox did not answer in time")
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                self.eof = True
                try:
                    self.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
                raise SandboxError(f"the zygote exited: {self.stderr_tail()}")
            self._buffer += chunk

    def kill(self) -> None:
        """Kill the zygote and wait for its pid namespace (every run in it) to be gone.

        The zygote is pid 1 of the sandbox: killing it makes the kernel kill and reap every
        process under it before bubblewrap, which waits for it, exits.
        """
        try:
            if self.child_pidfd is not None:
                signal.pidfd_send_signal(self.child_pidfd, signal.SIGKILL)
            elif self.proc.poll() is None:  # unsafe level: the zygote is our own child
                self.proc.send_signal(signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        self.close()

    def close(self) -> None:
        """Drop this process's handles without signalling (also after a fork)."""
        for stream in (self.proc.stdin, self.proc.stdout, self._stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self.child_pidfd is not None:
            try:
                os.close(self.child_pidfd)
            except OSError:
                pass
            self.child_pidfd = None


class Sandbox:
    """Runs programs in a lazily started zygote; one run at a time (a lock orders threads)."""

    def __init__(self, level: str | None = None) -> None:
        """``level``: force ``full``/``namespaces``/``none`` (tests); default: detected."""
        self._forced_level = level
        self._zygote: _Zygote | None = None
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()
        self._announced = False
        self.last_uid: int | None = None
        """The uid of the latest run (``full`` only), so tests can look for its processes."""

    def _level(self) -> str:
        if self._forced_level is not None:
            return self._forced_level
        iso: Isolation = isolation()
        if iso.level == "none" and not unsafe_allowed():
            raise SandboxUnavailable(
                "code execution needs isolation this machine does not offer: install "
                "bubblewrap (apt-get install bubblewrap) and run the service as root for "
                f"per-run uids, or set REWARDD_SANDBOX_UNSAFE=1 to run without. {iso.detail}")
        required = sandbox_settings().sandbox_require_isolation
        if required is not None and LEVELS.index(iso.level) < LEVELS.index(required):
            raise SandboxUnavailable(
                f"the operator requires isolation {required!r} (REWARDD_SANDBOX_REQUIRE_"
                f"ISOLATION) and this machine offers {iso.level!r}: "
                + ("run the service as root for per-run uids" if required == "full" else
                   "install bubblewrap and allow it user namespaces") + f". {iso.detail}")
        return iso.level

    def _ensure(self) -> _Zygote:
        zygote = self._zygote
        if zygote is not None and zygote.alive():
            return zygote
        if zygote is not None:
            zygote.kill()
            self._zygote = None
        level = self._level()
        if self._zygote is None and zygote is None and not self._announced:
            iso = isolation() if self._forced_level is None else None
            log.info("code sandbox starting: isolation %s; memory %s: %s", level,
                     iso.memory if iso else "accounted", iso.memory_detail if iso else "")
            self._announced = True
        self._zygote = _Zygote(level)
        return self._zygote

    def run(self, program: Program, judge: Judge | None = None,
            on_binary: OnBinary | None = None) -> list[TestResult]:
        """Run every test of ``program`` (until ``judge`` says stop); their results in order.

        ``on_binary``: called with a C++ program's executable once it compiled, so a caller
        can cache it and send it as :attr:`Program.binary` next time (a checker's, say).

        Raises :class:`SandboxUnavailable` where code cannot run isolated (and unsafe is not
        allowed), :class:`SandboxError` when the sandbox itself fails mid-run. A zygote
        found dead before it took the request is replaced and the run tried once more.
        """
        if os.getpid() != self._owner_pid:
            raise SandboxError("a Sandbox belongs to the process that made it; "
                               "use get_sandbox() in a forked child")
        if not program.tests:
            return []
        with self._lock:
            for attempt in range(2):
                zygote = self._ensure()
                try:
                    return self._run_on(zygote, program, judge, on_binary)
                except _NotTaken:
                    self._zygote = None
                    zygote.kill()
                    if attempt:
                        raise SandboxError("the sandbox died twice before taking a run: "
                                           f"{zygote.stderr_tail()}") from None
            raise AssertionError("unreachable")

    def _run_on(self, zygote: _Zygote, program: Program, judge: Judge | None,
                on_binary: OnBinary | None = None) -> list[TestResult]:
        uid = UID_BASE + UID_SLOTS * zygote.pid + zygote.runs % UID_SLOTS
        zygote.runs += 1
        self.last_uid = uid if zygote.level == "full" else None
        request = _request(program, uid, lockstep=judge is not None,
                           want_binary=on_binary is not None)
        results: list[TestResult] = []
        state = "writing"
        try:
            deadline = time.monotonic() + _budget(program)
            try:
                zygote.send(request)
                state = "running"
                started = zygote.recv(deadline)
            except SandboxError:
                zygote.proc.poll()  # bubblewrap exits right after the zygote
                if zygote.eof and not zygote.alive():
                    state = "idle"  # it never took the run: nothing ran, a retry is safe
                    raise _NotTaken() from None
                raise
            if started.get("op") != "started":
                raise SandboxError(f"the sandbox answered {started.get('op')!r} to a run")
            while True:
                message = zygote.recv(deadline)
                op = message.get("op")
                if op == "result":
                    result = _result(message)
                    results.append(result)
                    i = int(message["i"])
                    if judge is not None:
                        go = bool(judge(i, result))
                        if i + 1 < len(program.tests):
                            zygote.send({"op": "next", "go": go})
                elif op == "binary" and on_binary is not None:
                    on_binary(unb64(message["data"]))
                elif op == "fatal":
                    raise SandboxError(f"sandbox driver failed: {message.get('message')}")
                elif op == "done":
                    state = "idle"
                    if message.get("error"):
                        raise SandboxError(f"sandbox run failed: {message['error']}")
                    return results
                else:
                    raise SandboxError(f"unexpected message from the sandbox: {op!r}")
        except BaseException:
            if state != "idle":
                self._abort(zygote, graceful=state == "running")
            raise

    def _abort(self, zygote: _Zygote, *, graceful: bool) -> None:
        """Stop the current run, leaving no process of it alive; never raises.

        SIGALRM is blocked meanwhile so the soft deadline's repeated alarms cannot cut the
        cleanup short; one already delivered may still raise once, hence the retries.
        """
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            for attempt in range(3):
                try:
                    if graceful and attempt == 0 and self._cancel(zygote):
                        return
                    zygote.kill()
                    self._zygote = None
                    return
                except BaseException:  # the alarm that was already on its way
                    continue
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _cancel(self, zygote: _Zygote) -> bool:
        """Ask the zygote to end the run; True once it confirmed (every process gone)."""
        try:
            zygote.send({"op": "cancel"})
            zygote.send({"op": "ping"})
            deadline = time.monotonic() + CANCEL_TIMEOUT_S
            while True:
                op = zygote.recv(deadline).get("op")
                if op == "pong":
                    return True
                if op not in ("started", "result", "done", "fatal"):
                    return False
        except SandboxError:
            return False

    def close(self) -> None:
        """Stop the zygote (the next run starts a fresh one)."""
        with self._lock:
            if self._zygote is not None:
                self._zygote.kill()
                self._zygote = None

    def _forget(self) -> None:
        """In a forked child: let go of the parent's zygote without touching it."""
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None


def _request(program: Program, uid: int, *, lockstep: bool,
             want_binary: bool = False) -> dict[str, Any]:
    limits = program.limits
    return {
        "op": "run", "uid": uid, "language": program.language, "source": program.source,
        "lockstep": lockstep, "want_binary": want_binary,
        "binary": b64(program.binary) if program.binary is not None else None,
        "limits": {"cpu_s": limits.cpu_s, "wall_s": limits.wall_s,
                   "memory_mb": limits.memory_mb, "processes": limits.processes,
                   "file_size_mb": limits.file_size_mb, "output_bytes": limits.output_bytes,
                   "compile_s": limits.compile_s},
        "tests": [{"mode": t.mode, "stdin": b64(t.stdin), "fn_name": t.fn_name,
                   "args_json": t.args_json, "expr": t.expr, "script": t.script,
                   "files": [[name, b64(data)] for name, data in t.files]}
                  for t in program.tests],
    }


def _budget(program: Program) -> float:
    """Longest a run may take before the grader stops trusting the zygote."""
    limits = program.limits
    compile_s = limits.compile_s if program.language == "cpp" and program.binary is None \
        else 0.0
    return compile_s + len(program.tests) * (limits.wall_s + PER_TEST_SLACK_S) + SLACK_S


def _result(message: dict[str, Any]) -> TestResult:
    return TestResult(
        status=message["status"], stdout=unb64(message["stdout"]),
        stderr_tail=unb64(message["stderr_tail"]), exit_code=message["exit_code"],
        signal=message["signal"], value_json=message["value_json"],
        completed=bool(message["completed"]), truncated=bool(message["truncated"]),
        wall_s=float(message["wall_s"]), cpu_s=float(message["cpu_s"]),
        message=message["message"], exception=bool(message.get("exception")))


_instance: Sandbox | None = None
_instance_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _instance_lock
    _instance_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def get_sandbox() -> Sandbox:
    """This process's sandbox (a forked child gets its own; the parent's is left alone)."""
    global _instance
    with _instance_lock:
        if _instance is None or _instance._owner_pid != os.getpid():
            if _instance is not None:
                _instance._forget()
            _instance = Sandbox()
        return _instance
