"""The code sandbox, end to end: real bubblewrap, real processes, no mocks.

Each test runs real programs through :class:`rewardd.verifiers.code.sandbox.Sandbox` and checks
what came back: statuses, captured output, values, limits, early stopping, C++ and node,
and that an interrupted run leaves nothing behind. The attacks are in
``test_sandbox_security.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rewardd.verifiers.code.sandbox import Sandbox, SandboxError, get_sandbox, isolation, runtimes
from rewardd.verifiers.code.types import Limits, Program
from rewardd.verifiers.code.types import TestResult as Result  # aliases: pytest collects Test*
from rewardd.verifiers.code.types import TestRun as Case
from tests.support.sandbox import FAST, processes_of, run
from rewardd.workers.deadline import CheckTimeout, SoftDeadline

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap (bwrap) is not installed: "
                                       "apt-get install bubblewrap")
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="per-run uids (isolation level 'full') need root")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")

REPO = Path(__file__).resolve().parents[2]




@needs_root
def test_isolation_is_full_here() -> None:
    iso = isolation()
    assert iso.level == "full", iso.detail
    assert iso.network and iso.per_run_uid and iso.filesystem == "private"
    assert isolation() is iso  # detected once per process


def test_runtimes_are_reported() -> None:
    found = runtimes()
    assert found["python"]
    assert (found["cpp"] is not None) == (shutil.which("g++") is not None)
    assert (found["javascript"] is not None) == (shutil.which("node") is not None)


# ---- stdio and the Python modes --------------------------------------------------------------


def test_stdio_echo(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        import sys
        data = sys.stdin.read()
        print(data.upper(), end="")
        """, Case(stdin=b"hello\n"), Case(stdin="żółw ✓\n".encode()), Case())
    assert [r.status for r in results] == ["ok"] * 3
    assert [r.stdout for r in results] == [b"HELLO\n", "ŻÓŁW ✓\n".encode(), b""]
    assert results[0].exit_code == 0 and results[0].wall_s > 0


def test_stdio_reads_binary_stdin_and_uses_stdlib(sandbox: Sandbox) -> None:
    [result] = run(sandbox, """
        import sys, collections, heapq, bisect, itertools, subprocess
        raw = sys.stdin.buffer.read()
        print(len(raw), sum(raw) % 251, collections.Counter("aab")["a"])
        exit(0)
        """, Case(stdin=bytes(range(256)) * 1000))
    assert result.status == "ok", result.stderr_tail
    assert result.stdout == f"256000 {sum(range(256)) * 1000 % 251} 2\n".encode()


def test_call_function_and_solution_method(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        def pair(a, b):
            return (a + b, [a, b])
        class Solution:
            def twoSum(self, nums, target):
                seen = {}
                for i, n in enumerate(nums):
                    if target - n in seen:
                        return [seen[target - n], i]
                    seen[n] = i
        """, Case(mode="call", fn_name="pair", args_json="[1, 2]"),
        Case(mode="call", fn_name="twoSum", args_json="[[2, 7, 11, 15], 9]"),
        Case(mode="call", fn_name="pair", args_json='{"a": "x", "b": "y"}'))
    assert [r.status for r in results] == ["ok"] * 3
    assert [json.loads(r.value_json or "null") for r in results] == [
        [3, [1, 2]], [0, 1], ["xy", ["x", "y"]]]


def test_call_failures(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        def f():
            print("partial")
            return {1, 2}
        def g():
            raise KeyError("nope")
        """, Case(mode="call", fn_name="f"), Case(mode="call", fn_name="g"),
        Case(mode="call", fn_name="missing"))
    assert [r.status for r in results] == ["runtime_error"] * 3
    assert results[0].message.startswith("return value is not JSON data")
    assert results[0].stdout == b"partial\n" and results[0].value_json is None
    assert b"KeyError: 'nope'" in results[1].stderr_tail
    assert "missing" in results[2].message


def test_expr(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        def sq(x):
            return x * x
        """, Case(mode="expr", expr="sq(12)"), Case(mode="expr", expr="(sq(2), 'a')"),
        Case(mode="expr", expr="sq(None)"))
    assert [r.value_json for r in results[:2]] == ["144", '[4, "a"]']
    assert results[2].status == "runtime_error" and results[2].value_json is None


def test_script_completed_or_not(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        def add(a, b):
            return a + b
        """, Case(mode="script", script="assert add(2, 3) == 5\nassert add(1, 1) == 2"),
        Case(mode="script", script="assert add(2, 3) == 6"),
        Case(mode="script", script="import sys\nsys.exit(0)\nassert add(1, 1) == 2"))
    assert (results[0].status, results[0].completed) == ("ok", True)
    assert (results[1].status, results[1].completed) == ("runtime_error", False)
    assert b"AssertionError" in results[1].stderr_tail
    assert (results[2].status, results[2].completed) == ("runtime_error", False)


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)"])
def test_program_exiting_early_never_returns_a_value(sandbox: Sandbox, exit_call: str) -> None:
    source = f"def f():\n    return 1\n{exit_call}\n"
    results = run(sandbox, source, Case(mode="call", fn_name="f"),
                  Case(mode="expr", expr="f()"), Case(mode="script", script="pass"))
    for result in results:
        assert result.status == "runtime_error" and result.exit_code == 0
        assert result.value_json is None and not result.completed


# ---- limits ------------------------------------------------------------------------------


def test_cpu_spin_is_a_timeout(sandbox: Sandbox) -> None:
    """The CPU limit ends a spin, whatever the machine's load: the wall-clock limit is far
    away (with FAST's 2 s, a spin that got a fifth of a core on a loaded machine hit the
    wall-clock limit at 0.4 s of CPU)."""
    [result] = run(sandbox, "while True: pass",
                   limits=Limits(cpu_s=1.0, wall_s=120, memory_mb=256))
    assert result.status == "timeout" and result.message == "CPU time limit"
    # the rusage the result reports can read a little under the kernel's own count that sent
    # SIGXCPU at 1 s (0.8995 s seen at load average 12): the spin ran about its limit
    assert 0.8 <= result.cpu_s < 2.5


def test_sleep_past_wall_clock_is_a_timeout(sandbox: Sandbox) -> None:
    started = time.monotonic()
    [result] = run(sandbox, "import time; time.sleep(30)",
                   limits=Limits(cpu_s=1, wall_s=0.5))
    assert result.status == "timeout" and result.message == "wall-clock limit"
    # stopped, not waited for: answered before the 30 s sleep could have ended
    assert result.cpu_s < 0.5 and time.monotonic() - started < 30


def test_memory_bomb_is_memory_exceeded(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        import sys
        if sys.stdin.read() == "big":
            x = bytearray(10**10)
        chunks = []
        while True:
            chunks.append(b"x" * 10**7)
        """, Case(stdin=b"big"), Case(), limits=Limits(memory_mb=200))
    assert [r.status for r in results] == ["memory_exceeded"] * 2


def test_output_limit_keeps_exactly_output_bytes(sandbox: Sandbox) -> None:
    limit = 100_000
    [result] = run(sandbox, """
        import sys
        sys.stdout.write("y" * (10 * 2**20))
        """, limits=Limits(output_bytes=limit))
    assert result.status == "output_limit" and result.truncated
    assert result.stdout == b"y" * limit


def test_runtime_error_keeps_the_stderr_tail(sandbox: Sandbox) -> None:
    [result] = run(sandbox, """
        import sys
        for i in range(3000):
            print("noise", i, file=sys.stderr)
        def deep(n):
            return 1 / n if n == 0 else deep(n - 1)
        deep(5)
        """)
    assert result.status == "runtime_error" and result.exit_code == 1
    assert len(result.stderr_tail) <= 4096
    assert result.stderr_tail.rstrip().endswith(b"ZeroDivisionError: division by zero")
    assert b"deep(n - 1)" in result.stderr_tail  # source lines in the traceback
    assert "ZeroDivisionError" in result.message


def test_judge_stops_the_run_early(sandbox: Sandbox) -> None:
    seen: list[int] = []

    def judge(i: int, result: Result) -> bool:
        seen.append(i)
        return result.stdout == b"pass\n"

    started = time.monotonic()
    results = sandbox.run(Program("python", textwrap.dedent("""
        import sys, time
        word = sys.stdin.read()
        if word == "slow":
            time.sleep(30)
        print(word)
        """), (Case(stdin=b"pass"), Case(stdin=b"fail"), Case(stdin=b"slow"),
               Case(stdin=b"slow")), Limits(cpu_s=1.0, wall_s=60.0, memory_mb=256)),
        judge=judge)  # a slow test that ran would take its whole 30 s sleep
    assert seen == [0, 1]
    assert [r.stdout for r in results] == [b"pass\n", b"fail\n"]
    assert time.monotonic() - started < 30  # before a slow test's sleep could have ended
    # a judge that always agrees sees every test
    assert len(sandbox.run(Program("python", "print(1)", (Case(),) * 3),
                           judge=lambda i, r: True)) == 3


def test_empty_program_runs_nothing(sandbox: Sandbox) -> None:
    assert sandbox.run(Program("python", "print(1)", ())) == []


# ---- C++ and JavaScript -----------------------------------------------------------------


CPP_ECHO_EXE_STAMP = r"""
#include <cstdio>
#include <sys/stat.h>
int main() {
    long long a, b;
    if (scanf("%lld %lld", &a, &b) != 2) return 3;
    struct stat st;
    stat("/proc/self/exe", &st);
    printf("%lld %ld.%09ld %lu\n", a + b, (long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
           (unsigned long)st.st_ino);
}
"""


@needs_gxx
def test_cpp_compiles_once_per_program(sandbox: Sandbox) -> None:
    results = run(sandbox, CPP_ECHO_EXE_STAMP, Case(stdin=b"1 2"), Case(stdin=b"40 2"),
                  Case(stdin=b"x"), language="cpp", limits=Limits(compile_s=30))
    assert [r.status for r in results] == ["ok", "ok", "runtime_error"]
    sums = [r.stdout.split()[0] for r in results[:2]]
    assert sums == [b"3", b"42"] and results[2].exit_code == 3
    stamps = {tuple(r.stdout.split()[1:]) for r in results[:2]}
    assert len(stamps) == 1  # the same binary (mtime and inode): one compilation


@needs_gxx
def test_cpp_compile_error(sandbox: Sandbox) -> None:
    results = run(sandbox, "int main() { return undefined_name; }", Case(), Case(),
                  language="cpp")
    assert [r.status for r in results] == ["compile_error"] * 2
    assert "undefined_name" in results[0].message


@needs_gxx
def test_cpp_only_runs_stdio(sandbox: Sandbox) -> None:
    [result] = run(sandbox, "int main() {}", Case(mode="call", fn_name="f"), language="cpp")
    assert result.status == "compile_error" and "not supported for cpp" in result.message


@needs_gxx
def test_cpp_limits(sandbox: Sandbox) -> None:
    results = run(sandbox, r"""
        #include <cstdio>
        #include <vector>
        int main() {
            int kind = getchar();
            if (kind == 'm') { std::vector<long> v; while (true) v.resize(v.size() * 2 + 1); }
            if (kind == 's') { volatile unsigned long x = 0; while (true) x++; }
            if (kind == 'c') { int *p = nullptr; return *p; }
        }
        """, Case(stdin=b"m"), Case(stdin=b"s"), Case(stdin=b"c"), language="cpp")
    assert [r.status for r in results] == ["memory_exceeded", "timeout", "runtime_error"]
    assert results[2].signal == 11


@needs_node
def test_node_stdio(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        const data = require("fs").readFileSync(0, "utf8").trim().split(/\\s+/).map(Number);
        if (data[0] < 0) throw new Error("negative");
        console.log(data.reduce((a, b) => a + b, 0));
        """, Case(stdin=b"1 2 3"), Case(stdin=b"-1"), language="javascript")
    assert [(r.status, r.stdout) for r in results] == [("ok", b"6\n"), ("runtime_error", b"")]
    assert b"negative" in results[1].stderr_tail


@needs_node
def test_node_limits(sandbox: Sandbox) -> None:
    results = run(sandbox, """
        const kind = require("fs").readFileSync(0, "utf8");
        if (kind === "heap") { const a = []; while (true) a.push(new Array(1e6).fill(1)); }
        if (kind === "spin") { while (true) {} }
        """, Case(stdin=b"heap"), Case(stdin=b"spin"), Case(mode="expr", expr="1"),
        language="javascript", limits=Limits(cpu_s=1, wall_s=5, memory_mb=128))
    assert [r.status for r in results] == ["memory_exceeded", "timeout", "compile_error"]


# ---- the sandbox's own life -----------------------------------------------------------------


def test_interrupted_run_leaves_nothing_and_the_sandbox_works(sandbox: Sandbox) -> None:
    """The worker's soft deadline (SIGALRM in the main thread) interrupts a run mid-test."""
    run(sandbox, "print(0)")
    source = """
        import subprocess, time
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
        time.sleep(100)
        """
    deadline = SoftDeadline(0.5)
    started = time.monotonic()
    with pytest.raises(CheckTimeout):
        try:
            with deadline:
                run(sandbox, source, limits=Limits(cpu_s=30, wall_s=30))
        finally:
            deadline.disarm()
    assert time.monotonic() - started < 100  # before the sleep could have ended
    if sandbox.last_uid is not None:
        assert processes_of(sandbox.last_uid) == []
    assert run(sandbox, "print(input())", Case(stdin=b"again"))[0].stdout == b"again\n"


def test_a_dead_zygote_is_restarted() -> None:
    box = Sandbox()
    try:
        assert run(box, "print(1)")[0].stdout == b"1\n"
        for kill in ("bubblewrap, reaped", "the zygote, not yet reaped"):
            zygote = box._zygote
            assert zygote is not None and zygote.child_pidfd is not None
            if kill == "bubblewrap, reaped":
                os.killpg(zygote.pid, signal.SIGKILL)
                zygote.proc.wait(timeout=10)
            else:  # the next run's request goes into a pipe nobody reads: it is retried
                signal.pidfd_send_signal(zygote.child_pidfd, signal.SIGKILL)
            assert run(box, "print(2)")[0].stdout == b"2\n", kill
            assert box._zygote is not zygote
    finally:
        box.close()


def test_get_sandbox_is_per_process() -> None:
    parent = get_sandbox()
    assert get_sandbox() is parent
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own sandbox, which works
        try:
            child = get_sandbox()
            out = child.run(Program("python", "print(7)", (Case(),)))[0].stdout
            os.write(write_end, f"{child is not parent} {out!r}".encode())
            child.close()
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as f:
        assert f.read() == b"True b'7\\n'"
    assert status == 0
    with pytest.raises(SandboxError):  # a sandbox is not usable from another process
        parent._owner_pid = -1
        try:
            parent.run(Program("python", "print(1)", (Case(),)))
        finally:
            parent._owner_pid = os.getpid()


@needs_root
def test_namespaces_level_without_per_run_uid() -> None:
    """The non-root level (user namespace, no uid change), forced here as root."""
    box = Sandbox(level="namespaces")
    try:
        results = run(box, """
            import os, sys
            print(open("/proc/self/status").read().split("CapEff:")[1].split()[0])
            if sys.stdin.read() == "kill":
                os.kill(os.getppid(), 9)
                os.kill(-1, 9)
            """, Case(), Case(stdin=b"kill"))
        assert results[0].status == "ok" and results[0].stdout == b"0000000000000000\n"
        assert results[1].status == "runtime_error"  # the driver (pid 1) ignored the kill
        assert run(box, "print(3)")[0].stdout == b"3\n"
    finally:
        box.close()


def test_without_isolation_code_runs_only_when_unsafe_is_set(tmp_path: Path) -> None:
    """No bwrap on PATH: SandboxUnavailable, unless REWARDD_SANDBOX_UNSAFE=1."""
    script = textwrap.dedent("""
        from rewardd.verifiers.code.sandbox import Sandbox, SandboxUnavailable, isolation
        from rewardd.verifiers.code.types import Program, TestRun
        print(isolation().level)
        try:
            print(Sandbox().run(Program("python", "print(6*7)", (TestRun(),)))[0].stdout)
        except SandboxUnavailable as exc:
            print("unavailable", "apt-get install bubblewrap" in str(exc))
        """)
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    plain = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           timeout=120, cwd=REPO)
    assert plain.stdout.decode().split("\n")[:2] == ["none", "unavailable True"], plain.stderr
    unsafe = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                            env={**env, "REWARDD_SANDBOX_UNSAFE": "1"}, cwd=REPO)
    assert unsafe.stdout.decode().split("\n")[:2] == ["none", "b'42\\n'"], unsafe.stderr
