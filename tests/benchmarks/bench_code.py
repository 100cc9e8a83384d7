"""Benchmark: the code sandbox against a plain subprocess per test and bubblewrap per test.

    .venv/bin/python tests/benchmarks/bench_code.py [--executions 200] [--repeat 5]

Two measurements, side by side in one run (ratios, since this machine is noisy):

1. Per-execution overhead of ``print(1)``, one core, median of ``--repeat`` rounds of
   ``--executions`` executions each:
   - a bare fork: this warm interpreter forks, the child runs the code, the parent waits (no
     isolation: the floor any Python fork server pays);
   - ``subprocess.run([python, "-c", code])`` per execution (what SandboxFusion's default,
     unisolated mode does);
   - ``bwrap ... python -c code`` started fresh per execution (isolation without a fork server);
   - rewardd's sandbox, one run of one test per execution (fork, private mount and pid
     namespaces, a fresh tmpfs, setuid, rlimits), and the same program with 20 tests in one run
     (per-test cost inside a run).
2. Throughput for a small stdin/stdout program (read two integers, print their sum) on all
   cores: one worker process per core, each running programs of 10 tests; executions/second
   for the plain subprocess, bwrap per test, and rewardd's sandbox.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.verifiers.code.sandbox import get_sandbox, isolation  # noqa: E402
from rewardd.verifiers.code.types import Program, TestRun  # noqa: E402

PYTHON = sys.executable
BASE_PREFIX = sys.base_prefix
SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def bare_fork(code: str) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        try:
            exec(compile(code, "<bench>", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.close(w)
    while os.read(r, 65536):
        pass
    os.close(r)
    os.waitpid(pid, 0)


def plain_subprocess(code: str, stdin: bytes = b"") -> bytes:
    return subprocess.run([PYTHON, "-c", code], input=stdin, capture_output=True,
                          check=True).stdout


def bwrap_command(code: str) -> list[str]:
    binds = []
    for path in ("/usr", "/lib", "/lib64", "/bin"):
        if os.path.exists(path):
            binds += ["--ro-bind", path, path]
    binds += ["--ro-bind", BASE_PREFIX, "/opt/python"]
    python = "/opt/python/bin/" + Path(os.path.realpath(PYTHON)).name
    return ["bwrap", *binds, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            python, "-I", "-S", "-c", code]


def fresh_bwrap(code: str, stdin: bytes = b"") -> bytes:
    return subprocess.run(bwrap_command(code), input=stdin, capture_output=True,
                          check=True).stdout


def rewardd_run(code: str, tests: int = 1, stdin: bytes = b"") -> None:
    results = get_sandbox().run(Program("python", code, tuple(TestRun(stdin=stdin)
                                                              for _ in range(tests))))
    assert len(results) == tests and all(r.status == "ok" for r in results), results


def per_execution_ms(fn: Callable[[], None], executions: int, repeat: int,
                     per_call: int = 1) -> float:
    fn()  # warm
    rounds = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(executions):
            fn()
        rounds.append((time.perf_counter() - started) / (executions * per_call) * 1e3)
    return statistics.median(rounds)


def _throughput_worker(kind: str, executions: int, queue: multiprocessing.Queue) -> None:
    stdin = b"3 4\n"
    started = time.perf_counter()
    if kind == "subprocess":
        for _ in range(executions):
            assert plain_subprocess(SUM_PROGRAM, stdin) == b"7\n"
    elif kind == "bwrap":
        for _ in range(executions):
            assert fresh_bwrap(SUM_PROGRAM, stdin) == b"7\n"
    else:
        rewardd_run(SUM_PROGRAM, 10, stdin)  # warm this process's zygote
        started = time.perf_counter()
        for _ in range(executions // 10):
            rewardd_run(SUM_PROGRAM, 10, stdin)
    queue.put(time.perf_counter() - started)


def throughput(kind: str, executions: int, workers: int) -> float:
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_throughput_worker, args=(kind, executions, queue))
             for _ in range(workers)]
    for p in procs:
        p.start()
    times = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return executions * workers / max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    iso = isolation()
    cores = os.cpu_count() or 1
    print(f"`{' '.join([Path(sys.executable).name, *sys.argv])}`\n")
    print(f"- isolation: {iso.level} ({iso.detail}); {cores} cores; bwrap "
          f"{'present' if shutil.which('bwrap') else 'MISSING'}\n")

    n, k = args.executions, args.repeat
    rows = [
        ("bare fork (no isolation, the floor)", per_execution_ms(lambda: bare_fork("print(1)"), n, k)),
        ("subprocess.run(python -c) per execution", per_execution_ms(lambda: plain_subprocess("print(1)"), n // 4, k)),
        ("bwrap started fresh per execution", per_execution_ms(lambda: fresh_bwrap("print(1)"), n // 4, k)),
        ("rewardd sandbox, one run of 1 test", per_execution_ms(lambda: rewardd_run("print(1)"), n, k)),
        ("rewardd sandbox, per test in a run of 20", per_execution_ms(lambda: rewardd_run("print(1)", 20), n // 20, k, 20)),
    ]
    floor = rows[0][1]
    print("## Per-execution overhead of `print(1)`, one core, median of rounds\n")
    print("| runner | ms per execution | x bare fork |")
    print("|---|---:|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} | {ms / floor:.2f}x |")

    print(f"\n## Throughput, `a+b` over stdin, {cores} worker processes, "
          f"{n} executions each (rewardd: programs of 10 tests)\n")
    print("| runner | executions/s | x subprocess |")
    print("|---|---:|---:|")
    results = {kind: throughput(kind, n, cores) for kind in ("subprocess", "bwrap", "rewardd")}
    for kind, label in (("subprocess", "subprocess.run per test"),
                        ("bwrap", "bwrap fresh per test"), ("rewardd", "rewardd sandbox")):
        print(f"| {label} | {results[kind]:.0f} | {results[kind] / results['subprocess']:.2f}x |")


if __name__ == "__main__":
    main()
