"""The data that crosses the sandbox boundary: what to run, with which limits, what came back.

Plain frozen dataclasses of bytes, strings and numbers: a program's outputs and return values
come back as data (bytes, JSON text), never as live objects, so nothing the untrusted program
builds (an object whose ``__eq__`` is always true, say) can reach the grader, and the expected
outputs never enter the sandbox at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Language = Literal["python", "cpp", "javascript"]
TestMode = Literal["stdio", "call", "expr", "script"]
Status = Literal["ok", "runtime_error", "timeout", "memory_exceeded", "output_limit",
                 "compile_error"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-test limits (per-run for ``processes``), enforced inside the sandbox."""

    cpu_s: float = 2.0
    """CPU seconds per test (RLIMIT_CPU)."""
    wall_s: float = 4.0
    """Wall-clock seconds per test; the test's processes are killed past it."""
    memory_mb: int = 512
    """Memory of the test's processes together (the run's driver kills them all past it) and
    address space of each (RLIMIT_AS)."""
    processes: int = 32
    """Processes and threads per run, counted per run (its own uid), never shared across runs."""
    file_size_mb: int = 16
    """Largest file a test may write (RLIMIT_FSIZE), also bounded by the run's private tmpfs."""
    output_bytes: int = 1 << 20
    """stdout kept per test; beyond it the output is truncated and the status is
    ``output_limit`` (the truncated output is still returned and judged)."""
    compile_s: float = 20.0
    """Wall-clock limit of compiling a C++ program (once per program)."""


@dataclass(frozen=True, slots=True)
class TestRun:
    """One execution of the program.

    ``stdio``: run the program with ``stdin``; its stdout is the result.
    ``call``: run the program (Python), then call ``fn_name(*args)`` (a method of a
    ``Solution`` instance when the program defines that class and no such function); the
    return value comes back as JSON text in ``TestResult.value_json``.
    ``expr``: run the program, then evaluate ``expr`` (a Python expression from the dataset,
    for example the left side of an ``assert``) in its namespace; the value comes back as JSON.
    ``script``: run the program, then ``script`` (test code that cannot be lifted into values);
    ``TestResult.completed`` says whether it ran to its end.

    ``files`` (any mode): ``(name, data)`` pairs written read-only into the run's private tmp
    for this test only; their paths are the program's command-line arguments, in order (how
    a special judge is called: ``checker <input> <output> <answer>``).
    """

    __test__ = False  # not a pytest test class, despite the name

    mode: TestMode = "stdio"
    stdin: bytes = b""
    fn_name: str | None = None
    args_json: str = "[]"
    expr: str | None = None
    script: str | None = None
    files: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Program:
    language: Language
    source: str
    tests: tuple[TestRun, ...]
    limits: Limits = field(default_factory=Limits)
    binary: bytes | None = None
    """C++ only: the executable an earlier run compiled from ``source`` (no compilation)."""


@dataclass(frozen=True, slots=True)
class TestResult:
    """What one execution produced, as data; judged by the verifier outside the sandbox."""

    __test__ = False
    status: Status
    stdout: bytes = b""
    """Captured stdout, at most ``Limits.output_bytes``."""
    stderr_tail: bytes = b""
    """The last 4 KiB of stderr, for the verdict's detail."""
    exit_code: int | None = None
    signal: int | None = None
    value_json: str | None = None
    """``call``/``expr`` modes: the value as JSON text (None when none was produced)."""
    completed: bool = False
    """``script`` mode: the test code ran to its end."""
    truncated: bool = False
    wall_s: float = 0.0
    cpu_s: float = 0.0
    message: str = ""
    """Why, for anything but ``ok`` (for example the compiler's error)."""
    exception: bool = False
    """Python: the program ended by an uncaught exception (exit status 1, like
    ``sys.exit(1)``, which a special judge uses to say "wrong answer": this tells them apart)."""


@dataclass(frozen=True, slots=True)
class Isolation:
    """What the sandbox enforces on this machine; reported by /readyz and in ``detail``."""

    level: Literal["full", "namespaces", "none"]
    """``full``: bubblewrap namespaces (network, pid, mount, ipc, uts), a per-run uid and
    private tmpfs, rlimits. ``namespaces``: bubblewrap without the per-run uid (not root).
    ``none``: no isolation; code runs only when the unsafe setting is on."""
    network: bool
    """True when the network namespace cuts the program off the network."""
    per_run_uid: bool
    filesystem: str
    """``private`` (read-only runtime, private writable tmp) or ``host``."""
    detail: str = ""
    memory: Literal["accounted"] = "accounted"
    """How a run's memory is held to ``memory_mb`` as a whole (all its processes together):
    ``accounted``: the run's driver sums their memory every 10 ms and kills the run past it."""
    memory_detail: str = ""
    """The guarantee of that mode, in words."""
