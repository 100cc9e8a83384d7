"""Special judges (checkers): a program from the reference decides whether an output is right.

Problems with several right answers (any valid permutation, a float within a tolerance, a
constructive answer) cannot be graded by comparing text. The reference then carries
``"checker": {"language": "python" | "cpp", "code": "..."}``, a testlib-style program called as
``checker <input> <output> <answer>``: three file paths, the test's input, the rollout's
output and the jury's answer (the reference's expected output).

How its result is read (:func:`read_verdict`):

* exit 0: accepted. An empty stdout (whitespace only) is a score of 1.0; otherwise the first
  whitespace-separated token of stdout must be a decimal number in [0, 1] (``0.5``,
  ``1e-1``; not ``nan``/``inf``), the test's score for partial credit (the rest of stdout
  is a free message). A score of 1 is ``passed``, below 1 ``partial`` (0 included).
  Anything else on stdout is a checker failure (``bad_score``), never a guess.
* exit 1: wrong answer (score 0; stdout is not read). Exit 2 as well: testlib's
  presentation error (``_pe``), which testlib also uses when the rollout's output ends
  early or is not the expected format (that is the rollout's fault, not the checker's).
* any other exit status, a signal, an uncaught Python exception (exit status 1 too, but
  told apart from ``sys.exit(1)``), past its time or memory limits, more than 1 MiB of
  stdout, or a C++ checker that does not compile: a **checker failure**. The code verifier
  reports it as a typed failure of the judge (``invalid_reference`` with
  ``detail.checker_failure`` set), never as the rollout's wrong answer or a silent 0.

Isolation: the checker runs in its own sandbox run (a new private tmp, pid namespace and
uid), after the solution's run has ended, with its own limits (``checker_cpu_s``,
``checker_wall_s``, ``checker_memory_mb``). The three files exist only in that run, written
read-only by the run's driver; the jury's answer never enters the solution's run, and the
solution's run has no way to reach the checker's. The solution reaches the checker only as
the bytes of its output file.

A C++ checker is compiled once (``g++ -O2 -std=c++17``) and its executable cached in this
process by the SHA-256 of its code (a compile error too): every rollout of a group, and
every later group with the same checker, reuses it. ``testlib.h`` is not shipped (nor
fetched): an operator who puts it in a directory named by REWARDD_SANDBOX_INCLUDE_DIR has it
on every compile's include path (testlib checkers, as CodeContests+ ships them, then
compile); elsewhere a C++ checker must be self-contained.
"""

from __future__ import annotations

import decimal
import hashlib
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from rewardd.verifiers.base import InvalidReference
from rewardd.verifiers.code.compare import decode
from rewardd.verifiers.code.types import Limits, Program, TestResult, TestRun

CheckerLanguage = Literal["python", "cpp"]
CheckerFailureKind = Literal["compile_error", "crashed", "timeout", "memory_exceeded",
                             "output_limit", "bad_score", "exit_status"]

CHECKER_KEYS = ("language", "code")
_LANGUAGES: dict[str, CheckerLanguage] = {"python": "python", "python3": "python",
                                          "py": "python", "cpp": "cpp", "c++": "cpp"}
WRONG_ANSWER_EXITS = {1: "wrong answer", 2: "presentation error"}
FILE_NAMES = ("input.txt", "output.txt", "answer.txt")
_SCORE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_SCORE_CHARS = 100
"""Longest score token read (a checker prints ``0.5`` or a dozen digits, never more)."""
_MESSAGE = 300
_CACHE_ENTRIES = 32
_CACHE_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class Checker:
    """A reference's special judge, parsed; ``digest`` keys the compiled-executable cache."""

    language: CheckerLanguage
    code: str
    digest: str


class CheckerFailed(Exception):
    """The checker itself failed on a test: a failure of the judge, not of the rollout."""

    def __init__(self, kind: CheckerFailureKind, message: str, test: int) -> None:
        super().__init__(message)
        self.kind, self.message, self.test = kind, message, test


def parse_checker(value: Any) -> Checker:
    """The reference's ``checker`` object; InvalidReference naming the field otherwise.

    The code is not compiled here: compiling untrusted code outside the sandbox cost +2.3 GB
    of worker memory for 6 MB of Python (issue 28, row 6). A Python checker with a syntax
    error fails in its own sandbox run, which is a checker failure (``crashed``), also
    ``invalid_reference``."""
    if not isinstance(value, Mapping):
        raise InvalidReference("code reference 'checker' must be an object "
                               "{\"language\": \"python\" | \"cpp\", \"code\": \"...\"}")
    for key in value:
        if key not in CHECKER_KEYS:
            raise InvalidReference(f"code reference 'checker.{key}' is not a known key "
                                   f"(known: {', '.join(CHECKER_KEYS)})")
    language = value.get("language")
    if not isinstance(language, str) or language.strip().lower() not in _LANGUAGES:
        raise InvalidReference(f"code reference 'checker.language' must be python or cpp; "
                               f"got {str(language)[:50]!r}")
    code = value.get("code")
    if not isinstance(code, str) or not code.strip():
        raise InvalidReference("code reference 'checker.code' must be a non-empty string")
    lang = _LANGUAGES[language.strip().lower()]
    digest = hashlib.sha256(f"{lang}\0{code}".encode("utf-8", "surrogatepass")).hexdigest()
    return Checker(lang, code, digest)


# ---------------------------------------------------------------------------- verdicts


def _message(result: TestResult) -> str:
    parts = [result.message] if result.message else []
    tail = decode(result.stderr_tail).strip()
    if tail:
        parts.append(tail[-_MESSAGE:])
    return "\n".join(parts)[:2 * _MESSAGE]


def read_score(stdout: bytes) -> decimal.Decimal | None:
    """An accepted run's score: 1 for an empty stdout, else its first token as a number in
    [0, 1]; None when that token is not one (module rules).

    Read as an exact decimal from the text, never through a float: a float rounds
    ``0.99999999999999999999`` up to 1 (a pass where the checker gave partial credit) and
    ``1.0000000000000001`` down to 1 (accepted where the checker broke the protocol). The
    exponent is bounded first, so ``1e-999999999`` costs no more than ``1e-1``."""
    tokens = decode(stdout).split(maxsplit=1)
    if not tokens:
        return decimal.Decimal(1)
    if len(tokens[0]) > _SCORE_CHARS or not _SCORE.fullmatch(tokens[0]):
        return None
    score = decimal.Decimal(tokens[0])
    return score if 0 <= score <= 1 else None


def read_verdict(result: TestResult, test: int) -> dict[str, Any]:
    """The test's verdict from the checker's run (module rules); raises CheckerFailed."""
    status = result.status
    if status == "ok":
        score = read_score(result.stdout)
        if score is None:
            raise CheckerFailed("bad_score", "the checker exited 0 but its stdout does not "
                                "start with a score in [0, 1]: "
                                f"{decode(result.stdout)[:80]!r}", test)
        if score == 1:
            return {"verdict": "passed"}
        # below 1 stays below 1 as a float too (0.99999999999999999999 would round to 1.0)
        partial = min(float(score), math.nextafter(1.0, 0.0))
        return {"verdict": "partial", "score": partial, **_note(result)}
    if status in ("timeout", "memory_exceeded", "output_limit", "compile_error"):
        raise CheckerFailed(status, _message(result) or status, test)
    if result.signal is not None or result.exception:
        raise CheckerFailed("crashed", _message(result) or "the checker crashed", test)
    code = result.exit_code
    if code in WRONG_ANSWER_EXITS:
        return {"verdict": "wrong_answer", "checker": f"exit {code} "
                f"({WRONG_ANSWER_EXITS[code]})", **_note(result)}
    raise CheckerFailed("exit_status", f"the checker exited with status {code} (0 accepts, "
                        f"1 or 2 reject; anything else is a checker failure): "
                        f"{_message(result)}", test)


def _note(result: TestResult) -> dict[str, str]:
    """The checker's own words (stderr, where testlib writes them), if any."""
    text = decode(result.stderr_tail).strip()
    return {"checker_message": text[-_MESSAGE:]} if text else {}


# ---------------------------------------------------------------------------- executables


class _Executables:
    """Compiled C++ checkers of this process by digest (bytes), or their compile error
    (str): a group's rollouts, and later groups, compile a checker once. LRU, bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, bytes | str] = OrderedDict()
        self.compiled = 0
        """Compilations that finished (success or error), for tests and diagnostics."""

    def get(self, digest: str) -> bytes | str | None:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
            return entry

    def put(self, digest: str, entry: bytes | str) -> None:
        with self._lock:
            self.compiled += 1
            self._entries[digest] = entry
            self._entries.move_to_end(digest)
            while len(self._entries) > _CACHE_ENTRIES or (
                    len(self._entries) > 1 and sum(len(e) for e in self._entries.values())
                    > _CACHE_BYTES):
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.compiled = 0


executables = _Executables()


# ---------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class Case:
    """One test to check: its index, the input, the rollout's output and the jury's answer."""

    index: int
    stdin: bytes
    output: bytes
    answer: str


def check(checker: Checker, cases: list[Case], limits: Limits, sandbox: Any, *,
          stop_at_reject: bool) -> dict[int, dict[str, Any]]:
    """Each case's verdict, from one sandbox run of the checker over all of them.

    Stops at the first checker failure (raised as :class:`CheckerFailed`: a hanging checker
    costs one ``wall_s``, not one per test) and, with ``stop_at_reject``, at the first
    test that is not passed (all-or-nothing rewards need nothing past it)."""
    if not cases:
        return {}
    binary = None
    if checker.language == "cpp":
        cached = executables.get(checker.digest)
        if isinstance(cached, str):
            raise CheckerFailed("compile_error", cached, cases[0].index)
        binary = cached
    runs = tuple(TestRun(mode="stdio", files=tuple(zip(FILE_NAMES, (
        case.stdin, case.output, case.answer.encode("utf-8", "replace"))))) for case in cases)
    program = Program(checker.language, checker.code, runs, limits, binary=binary)
    verdicts: dict[int, dict[str, Any]] = {}
    failure: list[CheckerFailed] = []

    def on_result(i: int, result: TestResult) -> bool:
        index = cases[i].index
        if result.status == "compile_error" and binary is None and not failure \
                and result.message.startswith("compilation failed"):
            executables.put(checker.digest, _message(result))  # not a time or memory limit:
            # a compile that ran out of time on a busy machine is tried again next call
        try:
            verdicts[index] = read_verdict(result, index)
        except CheckerFailed as exc:
            failure.append(exc)
            return False
        return not stop_at_reject or verdicts[index]["verdict"] == "passed"

    def on_binary(data: bytes) -> None:
        executables.put(checker.digest, data)

    sandbox.run(program, on_result, on_binary if checker.language == "cpp" and binary is None
                else None)
    if failure:
        raise failure[0]
    return verdicts


__all__ = ["CHECKER_KEYS", "Case", "Checker", "CheckerFailed", "CheckerFailureKind", "check",
           "executables", "parse_checker", "read_score", "read_verdict"]
