"""CodeVerifier: run the completion's program on the reference's tests, judge each outside.

The division of labour that keeps the grade honest: the sandbox runs the untrusted program
and returns bytes and JSON text; this module holds the expected answers (they never enter the
sandbox, so no stack walking, ``gc`` scan or file read can find them) and compares plain
decoded data (so no object the program builds, such as one whose ``__eq__`` is always true,
takes part in a comparison). A program that exits early (``os._exit(0)``, ``sys.exit(0)``)
produces no output or no value, which is judged like any other wrong answer.

Speed: a group's N rollouts share one reference, so the parsed spec is cached per process,
keyed by the reference's canonical JSON (and the language override).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from typing import Any, Collection, Literal, Mapping

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rewardd.verifiers.base import (FailureKind, InvalidReference, Outcome, Sample, Verifier,
                            VerifierParams)
from rewardd.verifiers.code.checker import Case, CheckerFailed, check
from rewardd.verifiers.code.compare import (CompareMode, Expectation, decode, stdout_equal,
                                    value_meets)
from rewardd.verifiers.code.extract import extract_code
from rewardd.verifiers.code.sandbox import SandboxUnavailable, get_sandbox, isolation
from rewardd.verifiers.code.settings import sandbox_settings
from rewardd.verifiers.code.spec import Spec, TestCodeTimedOut, parse_reference, unknown_keys
from rewardd.verifiers.code.types import Language, Limits, Program, TestResult

_SPEC_CACHE_SIZE = 256
_SPEC_CACHE_BYTES = 32 << 20
"""References (canonical JSON) whose specs a worker keeps; a spec is about its size again."""
_PREVIEW = 200
_DETAILED_FAILURES = 10
"""Failed tests that keep their previews and messages in ``detail``; later failures keep only
their verdict, so a program failing hundreds of tests cannot bloat every response cell."""

Verdict = Literal["passed", "partial", "wrong_answer", "runtime_error", "timeout",
                  "memory_exceeded", "output_limit", "compile_error", "not_run"]


class CodeParams(VerifierParams):
    reward: Literal["fraction", "all_or_nothing"] = "fraction"
    """``fraction``: passed tests / all tests. ``all_or_nothing``: 1.0 when every test
    passes, else 0.0; the run stops at the first failure and later tests are ``not_run``."""
    compare: CompareMode = "lines"
    """How stdout is compared: ``lines`` (trailing whitespace of each line and trailing blank
    lines ignored), ``exact`` (character for character), ``tokens`` (whitespace-separated
    tokens in order). Never case-insensitive, never as a set of tokens."""
    float_tolerance: float | None = Field(default=None, gt=0.0, le=1.0)
    """When set, number tokens written with a decimal point or exponent (and float values of
    call/expr tests) are equal within ``tol * max(1, |expected|)``. Not with ``exact``."""
    language: Language | None = None
    """The program's language; None: the reference's ``language`` (default ``python``)."""
    cpu_s: float = Field(default=2.0, gt=0.0, le=60.0)
    """CPU seconds per test; at most the server's REWARDD_SANDBOX_MAX_TIME_S (default 30)."""
    wall_s: float = Field(default=4.0, gt=0.0, le=120.0)
    """Wall-clock seconds per test; at most REWARDD_SANDBOX_MAX_TIME_S (default 30)."""
    memory_mb: int = Field(default=512, ge=32, le=16384)
    """Memory of a run's processes together, in MiB (also each process's address space); at
    most the server's REWARDD_SANDBOX_MAX_MEMORY_MB (default 2048)."""
    output_kb: int = Field(default=1024, ge=1, le=65536)
    """stdout kept per test, in KiB; beyond it the output is truncated and judged as is."""
    processes: int = Field(default=32, ge=1, le=1024)
    """Processes and threads per run; at most REWARDD_SANDBOX_MAX_PROCESSES (default 64)."""
    max_tests: int | None = Field(default=None, ge=1, le=100_000)
    """Run only the first ``max_tests`` tests of the reference (None: all)."""
    time_budget_s: float | None = Field(default=5.0, gt=0.0, le=3600.0)
    """Start no new test once the run has taken this many seconds (wall clock, compilation
    included); the tests left are ``not_run`` and count as failed. It keeps a slow program's
    call inside the executor's limit (10 s by default), so it gets a low reward instead of a
    ``timeout`` failure: keep ``time_budget_s + wall_s`` below the call's ``timeout_s``.
    None: no budget."""
    checker_cpu_s: float = Field(default=2.0, gt=0.0, le=60.0)
    """CPU seconds of the reference's checker per test (its own limit, not the solution's);
    at most REWARDD_SANDBOX_MAX_TIME_S. A checker past it is a checker failure."""
    checker_wall_s: float = Field(default=3.0, gt=0.0, le=120.0)
    """Wall-clock seconds of the checker per test; at most REWARDD_SANDBOX_MAX_TIME_S. The
    checker runs after the solution: keep ``time_budget_s + wall_s + checker_wall_s`` below
    the call's ``timeout_s``, so a hanging checker is reported as the checker's failure."""
    checker_memory_mb: int = Field(default=512, ge=32, le=16384)
    """Memory of the checker's run in MiB (its three files included); at most
    REWARDD_SANDBOX_MAX_MEMORY_MB."""

    @field_validator("memory_mb", "processes", "cpu_s", "wall_s", "checker_cpu_s",
                     "checker_wall_s", "checker_memory_mb")
    @classmethod
    def _within_server_maximum(cls, value: float, info: ValidationInfo) -> float:
        """A request may lower the sandbox's limits, never raise them past the operator's."""
        name = info.field_name or ""
        setting, ceiling = _ceiling(name)
        if value > ceiling:
            raise ValueError(f"{name} {value:g} is over this server's maximum of {ceiling:g} "
                             f"(REWARDD_{setting.upper()}); ask for {ceiling:g} or less")
        return value

    @model_validator(mode="after")
    def _defaults_within_server_maximum(self) -> CodeParams:
        """A default the request did not set follows a ceiling the operator set below it."""
        for name in _CEILINGS:
            if name not in self.model_fields_set:
                _, ceiling = _ceiling(name)
                if getattr(self, name) > ceiling:
                    setattr(self, name, type(getattr(self, name))(ceiling))
        return self

    @model_validator(mode="after")
    def _tolerance_needs_tokens(self) -> CodeParams:
        if self.float_tolerance is not None and self.compare == "exact":
            raise ValueError("float_tolerance cannot be combined with compare='exact'")
        return self

    def limits(self) -> Limits:
        return Limits(cpu_s=self.cpu_s, wall_s=self.wall_s, memory_mb=self.memory_mb,
                      processes=self.processes, output_bytes=self.output_kb * 1024)

    def checker_limits(self) -> Limits:
        """The checker's own limits (stdout: a score and a message, 1 MiB at most)."""
        return Limits(cpu_s=self.checker_cpu_s, wall_s=self.checker_wall_s,
                      memory_mb=self.checker_memory_mb, processes=self.processes,
                      output_bytes=1 << 20)


_CEILINGS = {"memory_mb": "sandbox_max_memory_mb", "processes": "sandbox_max_processes",
             "cpu_s": "sandbox_max_time_s", "wall_s": "sandbox_max_time_s",
             "checker_cpu_s": "sandbox_max_time_s", "checker_wall_s": "sandbox_max_time_s",
             "checker_memory_mb": "sandbox_max_memory_mb"}


def _ceiling(param: str) -> tuple[str, float]:
    """The setting that bounds ``param`` and its value in this process."""
    setting = _CEILINGS[param]
    return setting, getattr(sandbox_settings(), setting)


# ---------------------------------------------------------------------------- spec cache


class _Specs:
    """Parsed specs (or InvalidReference messages) by the SHA-256 of the reference's
    canonical JSON and the language: LRU, at most :data:`_SPEC_CACHE_SIZE` entries and
    :data:`_SPEC_CACHE_BYTES` of references, so distinct 1 MB test codes cannot pile up in a
    worker (the key is a digest; the reference's text is not kept)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[bytes, Language | None], tuple[Spec | str, int]] = \
            OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0
        """Lookups that found a spec, and that did not (for tests and diagnostics)."""

    def get(self, key: tuple[bytes, Language | None]) -> Spec | str | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end(key)
            return entry[0]

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: tuple[bytes, Language | None], spec: Spec | str, size: int) -> None:
        with self._lock:
            if key in self._entries:
                self._bytes -= self._entries.pop(key)[1]
            self._entries[key] = (spec, size)
            self._bytes += size
            while len(self._entries) > 1 and (len(self._entries) > _SPEC_CACHE_SIZE
                                              or self._bytes > _SPEC_CACHE_BYTES):
                self._bytes -= self._entries.popitem(last=False)[1][1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.hits = self.misses = 0


_specs = _Specs()


def _parsed(canonical: str, language: Language | None) -> Spec | str:
    """The parsed spec, or the InvalidReference message (cached either way)."""
    key = (hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest(), language)
    spec = _specs.get(key)
    if spec is None:
        try:
            spec = parse_reference(json.loads(canonical), language)
        except TestCodeTimedOut:
            raise  # a busy machine's slow parse is tried again next time
        except InvalidReference as exc:
            spec = str(exc)
        _specs.put(key, spec, len(canonical))
    return spec


def load_spec(reference: Mapping[str, Any], language: Language | None = None) -> Spec:
    """The reference's spec, parsed once per process for each distinct reference."""
    try:
        canonical = json.dumps(reference, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON data (bytes from msgpack, say): no caching
        return parse_reference(reference, language)
    spec = _parsed(canonical, language)
    if isinstance(spec, str):
        raise InvalidReference(spec)
    return spec


def clear_caches() -> None:
    _specs.clear()


# ---------------------------------------------------------------------------- judging


def _preview(data: str | bytes | None) -> str | None:
    if data is None:
        return None
    text = decode(data) if isinstance(data, bytes) else data
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "..."


def _expected_preview(exp: Expectation) -> str | None:
    if exp.kind == "stdout":
        return _preview(exp.value)
    if exp.kind == "completed":
        return None
    if exp.kind == "equal":
        return _preview(json.dumps(exp.value, default=repr))
    if exp.kind == "close":
        tolerance = (f"rel_tol={exp.rel_tol}, abs_tol={exp.abs_tol}" if exp.op == "isclose"
                     else f"abs diff {exp.op} {exp.abs_tol}")
        return _preview(f"{exp.value!r} ({tolerance})")
    return _preview(f"{exp.op} {json.dumps(exp.value, default=repr)}")


def _failure_message(result: TestResult) -> str:
    """The sandbox's reason, then the end of stderr (whole lines, ~200 chars): the part of a
    traceback or compiler error that names the problem."""
    if result.message:
        parts = [result.message]
    elif result.signal:
        parts = [f"killed by signal {result.signal}"]
    elif result.exit_code not in (None, 0):
        parts = [f"exit status {result.exit_code}"]
    else:
        parts = []
    tail = decode(result.stderr_tail).strip()
    if tail and tail not in parts[0:1]:
        lines = tail.splitlines()
        kept: list[str] = []
        while lines and (not kept or sum(len(k) + 1 for k in kept) + len(lines[-1])
                         <= _PREVIEW):
            kept.insert(0, lines.pop())
        parts.append("\n".join(kept)[-_PREVIEW:])
    message = "\n".join(parts)
    return message if len(message) <= 3 * _PREVIEW else message[:3 * _PREVIEW] + "..."


def judge(exp: Expectation, result: TestResult, params: CodeParams) -> dict[str, Any]:
    """One test's verdict, from the sandbox's data and the expectation kept here."""
    status = result.status
    if status in ("runtime_error", "timeout", "memory_exceeded", "compile_error"):
        return {"verdict": status, "message": _failure_message(result)}
    if exp.kind == "stdout":
        ok = stdout_equal(result.stdout, exp.value, params.compare, params.float_tolerance)
        if ok:
            return {"verdict": "passed"}
        return {"verdict": "output_limit" if result.truncated or status == "output_limit"
                else "wrong_answer", "got": _preview(result.stdout),
                "expected": _expected_preview(exp)}
    # call/expr/script: stdout is not the answer, so a truncated one does not decide; a
    # failure of a run that also overflowed its output is reported as output_limit
    failed = "output_limit" if status == "output_limit" else None
    if exp.kind == "completed":
        if result.completed:
            return {"verdict": "passed"}
        return {"verdict": failed or "runtime_error", "message": _failure_message(result)
                or "the test code did not run to its end"}
    if result.value_json is None:
        return {"verdict": failed or "runtime_error", "message": _failure_message(result)
                or "the program produced no value (exited early, or the value is not JSON)"}
    try:
        got = json.loads(result.value_json)
    except (ValueError, RecursionError):
        return {"verdict": failed or "wrong_answer", "got": _preview(result.value_json),
                "message": "the value is not JSON"}
    if value_meets(got, exp, params.float_tolerance):
        return {"verdict": "passed"}
    return {"verdict": failed or "wrong_answer", "got": _preview(result.value_json),
            "expected": _expected_preview(exp)}


def _source(code: str, spec: Spec) -> str:
    if not spec.setup:
        return code
    return f"{code.rstrip()}\n\n\n# --- test setup (from the reference) ---\n{spec.setup}\n"


class CodeVerifier(Verifier):
    """Fraction of the reference's tests the completion's program passes (or all or nothing).

    Outcomes: a reference without readable tests is ``invalid_reference``. A completion with
    no code is a reward of 0.0 with ``detail.rule = "no_code"`` (the model's fault). A machine
    where the sandbox cannot isolate programs (and unsafe mode is off) is ``unavailable``;
    a sandbox that breaks (its zygote dies) raises and becomes ``error``: never a reward of 0.

    ``detail``: ``isolation`` (the sandbox's level), ``memory`` (how the run's memory is held
    to ``memory_mb`` as a whole: ``accounted``, see :class:`~rewardd.verifiers.code.types.
    Isolation`), ``code_from`` (``fenced_block`` or
    ``whole``; ``fence_closed: false`` for an unclosed final fence), ``language``, ``style``
    (``stdio``, ``call`` or ``assert``), ``passed``, ``total`` (``tests_in_reference`` when
    ``max_tests`` cut it), ``time_budget_spent: true`` when ``time_budget_s`` ran out (the
    tests left are ``not_run``), assert-style ``lifted``/``script``/``script_asserts``, and
    ``judged_by`` (``checker (python|cpp)`` when the reference has one), and
    ``tests``: one verdict per test (``passed``, ``partial`` with its ``score`` (a
    checker's partial credit), ``wrong_answer``, ``runtime_error``,
    ``timeout``, ``memory_exceeded``, ``output_limit``, ``compile_error``, ``not_run``),
    the first few failures with ``got``/``expected`` previews (200 characters), a
    ``message`` (the sandbox's reason and the end of stderr) and the ``test`` (the assert);
    a checker's rejection has ``checker`` (its exit status) and ``checker_message`` (its
    stderr). The reward is the sum of the tests' scores (passed 1, partial its score, else
    0) over the number of tests.

    A checker that fails (:mod:`~rewardd.verifiers.code.checker`) is ``invalid_reference``
    with ``detail.checker_failure`` (``crashed``, ``timeout``, ``memory_exceeded``,
    ``output_limit``, ``bad_score``, ``exit_status``, ``compile_error``) and ``detail.test``.
    """

    name = "code"
    deterministic = True
    description = ("Runs the program in the completion (last ```python/```cpp/```javascript "
                   "block, or the whole completion) in a sandbox on the reference's tests "
                   "(stdin/stdout, function calls, or assert-style test code) and returns the "
                   "fraction passed (or 1.0/0.0 with reward='all_or_nothing'). Outputs are "
                   "judged outside the sandbox; expected outputs never enter it. With a "
                   "'checker' in the reference, a special judge decides each stdio test "
                   "instead (any valid permutation, a float tolerance, constructive answers; "
                   "partial credit), in its own sandbox run; a checker that crashes, hangs or "
                   "breaks its protocol is an invalid_reference failure with "
                   "detail.checker_failure, never a reward. Unknown reference keys are a 422.")
    reference_fields = {
        "tests": "object (or JSON string): {inputs, outputs} for stdin/stdout tests, plus "
                 "fn_name for call-based tests (inputs: argument lists, or LiveCodeBench "
                 "JSON-lines strings with JSON-string outputs)",
        "input_output": "object or JSON string: the same as 'tests' (APPS/TACO naming)",
        "test_code": "str: assert-style Python test code (MBPP asserts, HumanEval "
                     "check(candidate))",
        "entry_point": "str: the function check(candidate) is called with (HumanEval)",
        "language": "str: python (default), cpp or javascript",
        "checker": "object {language: python|cpp, code: str}, stdio tests only: a testlib-style "
                   "special judge run as `checker <input> <output> <answer>` (file paths; "
                   "answer = the test's expected output). Exit 0 accepts: an empty stdout "
                   "scores 1, else stdout's first token must be a number in [0,1], the test's "
                   "partial score. Exit 1 (or 2, testlib's presentation error) is a wrong "
                   "answer. Any other exit, a crash, a limit (checker_cpu_s, checker_wall_s, "
                   "checker_memory_mb) or a C++ compile error is a checker failure "
                   "(invalid_reference, detail.checker_failure). testlib.h: only where the "
                   "operator set REWARDD_SANDBOX_INCLUDE_DIR",
        "solution": "str (optional): a known-correct program for these tests, never run "
                    "against the rollouts; canaries run it to check the tests (a solution "
                    "that fails them means the expected outputs are wrong)",
    }
    Params = CodeParams
    code_fields = (("test_code",), ("checker", "code"), ("solution",))
    """Reference fields holding code, capped by size at the API (REWARDD_MAX_CODE_FIELD_BYTES)."""

    def repeatable(self, outcome: Outcome) -> bool:
        """A program's verdict is the same run after run unless the clock decided part of
        it: a test that timed out, or tests not run because ``time_budget_s`` ran out
        (``detail.time_budget_spent``; both depend on the machine's load): such a verdict is
        not cached."""
        if outcome.detail.get("time_budget_spent"):
            return False
        tests = outcome.detail.get("tests")
        return not (isinstance(tests, list) and any(
            isinstance(t, dict) and t.get("verdict") == "timeout" for t in tests))

    def warm_up(self) -> None:
        # Imports only (done above at module import). Starting the sandbox here would make
        # the pre-fork parent own a zygote that every worker then shares.
        return None

    def verify(self, sample: Sample, reference: Mapping[str, Any],
               params: CodeParams) -> Outcome:
        try:  # assert-style test code is read by a sandbox run of its own
            spec = load_spec(reference, params.language)
        except SandboxUnavailable as exc:
            return Outcome.failure(FailureKind.unavailable, str(exc) or "no sandbox")
        tests, expected = spec.tests, spec.expected
        if params.max_tests is not None:
            tests, expected = tests[:params.max_tests], expected[:params.max_tests]
        extracted = extract_code(sample.completion, spec.language)
        detail: dict[str, Any] = {"code_from": extracted.code_from, "language": spec.language,
                                  "style": spec.style}
        if not extracted.fence_closed:
            detail["fence_closed"] = False
        if len(tests) < len(spec.tests):
            detail["tests_in_reference"] = len(spec.tests)
        if spec.style == "assert":
            detail.update(lifted=spec.lifted, script=spec.script,
                          script_asserts=spec.script_asserts)
        if not extracted.code.strip():
            return Outcome.success(0.0, rule="no_code", passed=0, total=len(tests), **detail)

        verdicts: dict[int, dict[str, Any]] = {}
        lock = threading.Lock()
        started = time.monotonic()
        checker = spec.checker

        def first_verdict(i: int, result: TestResult) -> dict[str, Any]:
            """The verdict, or ``checking`` for an output only the checker can judge."""
            if checker is None:
                return judge(expected[i], result, params)
            if result.status == "ok":
                return {"verdict": "checking"}
            if result.status == "output_limit":
                return {"verdict": "output_limit", "got": _preview(result.stdout),
                        "message": _failure_message(result)}
            return judge(expected[i], result, params)

        def on_result(i: int, result: TestResult) -> bool:
            verdict = first_verdict(i, result)
            with lock:
                verdicts[i] = verdict
            if verdict["verdict"] == "compile_error":
                return False  # every test would fail the same way
            if params.time_budget_s is not None \
                    and time.monotonic() - started > params.time_budget_s:
                detail["time_budget_spent"] = True  # the tests left are not_run
                return False
            return params.reward == "fraction" or verdict["verdict"] in ("passed", "checking")

        program = Program(spec.language, _source(extracted.code, spec), tests, params.limits())
        try:
            iso = isolation()
            sandbox = get_sandbox()
            results = sandbox.run(program, on_result)
            for i, result in enumerate(results[:len(tests)]):  # any the judge did not see
                if i not in verdicts:
                    verdicts[i] = first_verdict(i, result)
            if checker is not None:
                detail["judged_by"] = f"checker ({checker.language})"
                cases = [Case(i, tests[i].stdin, results[i].stdout, expected[i].value)
                         for i in sorted(verdicts) if verdicts[i]["verdict"] == "checking"]
                checked = check(checker, cases, params.checker_limits(), sandbox,
                                stop_at_reject=params.reward == "all_or_nothing")
                verdicts.update({i: v if v["verdict"] == "passed" else
                                 {**v, "got": _preview(results[i].stdout)}
                                 for i, v in checked.items()})
        except SandboxUnavailable as exc:
            return Outcome.failure(FailureKind.unavailable, str(exc) or "no sandbox", **detail)
        except CheckerFailed as exc:
            return Outcome.failure(FailureKind.invalid_reference,
                                   f"the reference's checker failed on test {exc.test} "
                                   f"({exc.kind}): {exc.message}", checker_failure=exc.kind,
                                   test=exc.test, **detail)
        reward, counts = _reward(verdicts, results, expected, len(tests), params)
        return Outcome.success(reward, isolation=iso.level, memory=iso.memory, **counts,
                               **detail)

    def reference_errors(self, reference: Any, shared: Collection[str] = (),
                         ) -> list[tuple[tuple[str, ...], str]]:
        """Unknown keys of a code reference (path, message): a 422 at the API, before any
        rollout runs. ``shared``: top-level keys the request's other verifiers document
        (:func:`~rewardd.verifiers.code.spec.unknown_keys`)."""
        return unknown_keys(reference, shared)


def _reward(verdicts: dict[int, dict[str, Any]], results: list[TestResult],
            expected: tuple[Expectation, ...], total: int,
            params: CodeParams) -> tuple[float, dict[str, Any]]:
    """The reward and the per-test detail: a passed test counts 1, a ``partial`` one its
    checker's score, any other 0; tests never judged are ``not_run``."""
    unrun = {"verdict": "not_run"}
    if any(v["verdict"] == "compile_error" for v in verdicts.values()):
        unrun = {"verdict": "compile_error"}  # the same program cannot run any test
    per_test, detailed, score = [], 0, 0.0
    for i in range(total):
        verdict = verdicts.get(i, unrun)
        if verdict["verdict"] == "checking":  # the checker stopped before it (all or nothing)
            verdict = unrun
        score += 1.0 if verdict["verdict"] == "passed" else float(verdict.get("score", 0.0))
        if verdict["verdict"] not in ("passed", "not_run"):
            detailed += 1
            if detailed > _DETAILED_FAILURES:
                verdict = {k: v for k, v in verdict.items() if k in ("verdict", "score")}
            else:
                if i < len(results):
                    verdict = {**verdict, "wall_s": round(results[i].wall_s, 3)}
                if expected[i].source:
                    verdict = {**verdict, "test": expected[i].source}
        per_test.append(verdict)
    passed = sum(v["verdict"] == "passed" for v in per_test)
    if params.reward == "all_or_nothing":
        reward = 1.0 if passed == total else 0.0
    else:
        reward = score / total
    return reward, {"passed": passed, "total": total, "tests": per_test}


__all__ = ["CodeParams", "CodeVerifier", "clear_caches", "judge", "load_spec"]
