"""Attacks on the code sandbox: each must fail to escape, and its result must not pass.

Real bubblewrap and real processes. Every test asserts both sides: what the program could
not reach or change (checked from the host: a listener that saw no connection, a file that
never appeared, no process left with the run's uid) and the program's own result.
"""

from __future__ import annotations

import os
import shutil
import socket
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from rewardd.verifiers.code.sandbox import Sandbox, SandboxError
from rewardd.verifiers.code.types import Limits
from rewardd.verifiers.code.types import TestRun as Case

from tests.support.sandbox import processes_of, run

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None,
                       reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="these attacks are checked at isolation level 'full' (root)"),
]

REPO = Path(__file__).resolve().parents[2]




def test_no_network_egress(sandbox: Sandbox) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        [result] = run(sandbox, f"""
            import socket
            for host in ("127.0.0.1", "1.1.1.1"):
                try:
                    socket.create_connection((host, {port}), timeout=1).send(b"leak")
                    print("connected", host)
                except OSError as exc:
                    print("refused", host, type(exc).__name__)
            socket.create_connection(("127.0.0.1", {port}), timeout=1)
            """)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # a connection would be waiting in the backlog
            listener.accept()
    finally:
        listener.close()
    assert b"connected" not in result.stdout
    assert result.stdout.count(b"refused") == 2
    assert result.status == "runtime_error"


def test_host_files_and_environment_are_not_visible(sandbox: Sandbox) -> None:
    secret = f"secret-{uuid.uuid4()}"
    env_name = "REWARDD_SANDBOX_TEST_SECRET"
    places = [Path.home() / f".rewardd-sandbox-{uuid.uuid4().hex}",
              REPO / f".rewardd-sandbox-{uuid.uuid4().hex}"]
    os.environ[env_name] = secret
    box = Sandbox()  # a fresh zygote, started while the secret is in our environment
    try:
        for place in places:
            place.write_text(secret)
        [result] = run(box, f"""
            import os
            print(dict(os.environ))
            for path in {[str(p) for p in places]!r} + ["/proc/1/environ", "/proc/self/environ",
                                                         "/etc/passwd", "/etc/shadow"]:
                try:
                    print(path, open(path, "rb").read())
                except OSError as exc:
                    print(path, type(exc).__name__)
            print(os.listdir("/"), os.listdir("/etc"))
            raise SystemExit(1)
            """)
    finally:
        del os.environ[env_name]
        for place in places:
            place.unlink(missing_ok=True)
        box.close()
    out = result.stdout.decode()
    assert secret not in out and env_name not in out and secret.encode() not in result.stderr_tail
    for place in places:
        assert f"{place} FileNotFoundError" in out
    assert "/proc/1/environ PermissionError" in out  # the run's driver: root, not readable
    assert "/etc/passwd FileNotFoundError" in out and "/etc/shadow FileNotFoundError" in out
    assert "'root'" not in out and "'work'" not in out and "'home'" not in out
    assert result.status == "runtime_error"


def test_writes_do_not_reach_the_host(sandbox: Sandbox) -> None:
    name = f"rewardd-sandbox-{uuid.uuid4().hex}"
    targets = [Path("/tmp") / name, REPO / name, Path.home() / name, Path("/usr") / name]
    try:
        [result] = run(sandbox, f"""
            for path in {[str(t) for t in targets]!r}:
                try:
                    with open(path, "w") as f:
                        f.write("escaped")
                    print("wrote", path)
                except OSError as exc:
                    print("failed", path, type(exc).__name__)
            """)
        assert result.status == "ok"
        assert f"wrote /tmp/{name}".encode() in result.stdout  # its own private /tmp
        for target in targets:
            assert not target.exists()
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


def test_fork_bomb_does_not_starve_a_concurrent_run() -> None:
    bomb_box, good_box = Sandbox(), Sandbox()
    outcome: dict[str, object] = {}

    def bomb() -> None:
        outcome["bomb"] = run(bomb_box, """
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """, limits=Limits(cpu_s=2, wall_s=2, processes=16))
        outcome["bomb_uid"] = bomb_box.last_uid

    thread = threading.Thread(target=bomb)
    try:
        thread.start()
        time.sleep(0.5)  # the bomb is going
        good = run(good_box, "print(sum(map(int, input().split())))",
                   *(Case(stdin=f"{i} {i}".encode()) for i in range(5)),
                   limits=Limits(cpu_s=2, wall_s=10))
        thread.join(timeout=30)
    finally:
        bomb_box.close()
        good_box.close()
    assert [r.stdout for r in good] == [f"{2 * i}\n".encode() for i in range(5)]
    assert all(r.status == "ok" for r in good)
    [bombed] = outcome["bomb"]  # type: ignore[misc]
    assert bombed.status == "timeout"
    assert processes_of(outcome["bomb_uid"]) == []  # type: ignore[arg-type]


def test_resource_attacks_end_in_their_limits(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        import sys, time, subprocess
        attack = sys.stdin.read()
        if attack == "memory":
            hog = [bytearray(2**20) for _ in range(100_000)]
        elif attack == "spin":
            while True: pass
        elif attack == "sleep":
            subprocess.Popen(["sleep", "1000"])
            time.sleep(1000)
        elif attack == "output":
            chunk = "z" * 2**20
            for _ in range(10):
                sys.stdout.write(chunk)
                sys.stderr.write(chunk)
        elif attack == "disk":
            with open("/tmp/fill", "wb") as f:
                f.write(b"d" * 64 * 2**20)
        """, *(Case(stdin=a.encode()) for a in ("memory", "spin", "sleep", "output", "disk")),
        limits=Limits(cpu_s=1, wall_s=1.5, memory_mb=256, output_bytes=4096, file_size_mb=8))
    assert [r.status for r in results] == ["memory_exceeded", "timeout", "timeout",
                                           "output_limit", "runtime_error"]
    assert results[3].stdout == b"z" * 4096 and results[3].truncated
    assert b"File too large" in results[4].stderr_tail
    assert sandbox.last_uid is not None and processes_of(sandbox.last_uid) == []


def test_signals_cannot_reach_the_driver_zygote_or_grader(sandbox: Sandbox) -> None:
    run(sandbox, "pass")
    zygote = sandbox._zygote
    assert zygote is not None
    results = run(sandbox, """
        import os, signal, subprocess, sys
        attack = sys.stdin.read()
        if attack == "parent":
            os.kill(os.getppid(), signal.SIGKILL)
        elif attack == "all":
            child = subprocess.Popen(["sleep", "1000"])
            os.kill(-1, signal.SIGKILL)  # every process it may signal: its own, not the driver
            print("child", child.wait())
        elif attack == "init":
            os.kill(1, signal.SIGKILL)
        print("survived")
        """, Case(stdin=b"parent"), Case(stdin=b"all"), Case(stdin=b"init"))
    assert results[0].status == "runtime_error" and b"PermissionError" in results[0].stderr_tail
    assert results[1].stdout == b"child -9\nsurvived\n"  # kill(-1) spares the caller
    assert results[2].status == "runtime_error" and b"PermissionError" in results[2].stderr_tail
    assert sandbox._zygote is zygote and zygote.alive()  # the same zygote, still serving
    assert run(sandbox, "print('next')")[0].stdout == b"next\n"


def test_a_run_sees_nothing_of_the_previous_run(sandbox: Sandbox) -> None:
    [first] = run(sandbox, """
        import os, subprocess
        with open("/tmp/secret", "w") as f:
            f.write("run one")
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "1001"])
            os._exit(0)
        print(os.getuid())
        """)
    assert first.status == "ok"
    first_uid = sandbox.last_uid
    assert first_uid is not None and int(first.stdout) == first_uid
    assert processes_of(first_uid) == []
    [second] = run(sandbox, """
        import os
        print(os.path.exists("/tmp/secret"), os.listdir("/tmp"))
        print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        print(os.getuid())
        """)
    lines = second.stdout.decode().splitlines()
    assert lines[0] == "False []"
    assert lines[1] == "[1, 2]"  # the run's driver and this process, nothing else
    assert int(lines[2]) != first_uid


def test_no_process_outlives_its_run(sandbox: Sandbox) -> None:
    [result] = run(sandbox, """
        import os, signal
        if os.fork() == 0:  # a classic daemon: detached, immune to hangups
            os.setsid()
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "1000"])
            os._exit(0)
        print("daemon started")
        """)
    assert result.status == "ok"  # its own output is fine; the daemon is what must be gone
    assert sandbox.last_uid is not None and processes_of(sandbox.last_uid) == []


def test_no_new_namespaces_privileges_or_ptrace(sandbox: Sandbox) -> None:
    [result] = run(sandbox, """
        import ctypes, os, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        for name, flag in (("user", 0x10000000), ("net", 0x40000000), ("mount", 0x20000)):
            rc = libc.unshare(flag)
            print("unshare", name, rc, ctypes.get_errno())
        print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
        for attempt in (lambda: os.setuid(0), lambda: os.setgid(0)):
            try:
                attempt()
                print("became root")
            except PermissionError:
                print("denied")
        print(subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode)
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        print(status["NoNewPrivs"].strip(), status["Seccomp"].strip(),
              [status[c].strip() for c in ("CapInh", "CapPrm", "CapEff", "CapAmb")])
        import threading  # threads still work (clone3 -> clone)
        t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
        raise SystemExit(9)
        """)
    lines = result.stdout.decode().splitlines()
    assert lines[:3] == ["unshare user -1 1", "unshare net -1 1", "unshare mount -1 1"]
    assert lines[3] == "ptrace -1 1"
    assert lines[4:6] == ["denied", "denied"]
    assert lines[6] != "0" and lines[8] == "thread"
    assert lines[7] == "1 2 " + str(["0000000000000000"] * 4)  # no_new_privs, filter, no caps
    assert result.status == "runtime_error" and result.exit_code == 9


def test_a_killed_zygote_takes_its_run_with_it() -> None:
    """The hard path (the zygote died, or the grader killed it): nothing of the run is left."""
    box = Sandbox()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run(box, """
                import subprocess, time
                subprocess.Popen(["sleep", "1000"], start_new_session=True)
                time.sleep(100)
                """, limits=Limits(cpu_s=30, wall_s=30))
        except SandboxError as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
                box.last_uid is None or len(processes_of(box.last_uid)) < 2):
            time.sleep(0.05)
        uid, zygote = box.last_uid, box._zygote
        assert uid is not None and zygote is not None and zygote.child_pidfd is not None
        assert len(processes_of(uid)) == 2
        signal.pidfd_send_signal(zygote.child_pidfd, signal.SIGKILL)
        zygote.proc.wait(timeout=10)  # bubblewrap exits once its pid namespace is empty
        assert processes_of(uid) == []
        thread.join(timeout=10)
        assert len(errors) == 1
        assert run(box, "print('restarted')")[0].stdout == b"restarted\n"
    finally:
        thread.join(timeout=10)
        box.close()
