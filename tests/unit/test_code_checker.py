"""Special judges (checkers) of the code verifier, on the real sandbox.

Three problems that exact matching grades wrong, each with a testlib-style checker
(``checker <input> <output> <answer>``) in Python and in C++: a permutation problem (any
derangement), a float problem (a tolerance relative to the jury's answer) and a constructive
one (any coprime split, with partial credit). Then checkers that fail (crash, hang, bad exit
status, bad score, no compile) must be typed failures of the judge, never the rollout's
wrong answer; a solution that goes after the checker or the jury's answer finds nothing; and
a CodeContests-style row with a checker is graded end to end.

The C++ cases need g++ (the sandbox's /usr): where it is missing they are skipped with a
warning that says so, and the Python cases still run.
"""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
import warnings
from pathlib import Path
from typing import Any

import pytest

from rewardd.verifiers.base import FailureKind, InvalidReference, Outcome, Sample, run_verifier
from rewardd.verifiers.code import CodeVerifier
from rewardd.verifiers.code.checker import (Case, CheckerFailed, check, executables,
                                            parse_checker, read_score, read_verdict)
from rewardd.verifiers.code.sandbox import Sandbox, SandboxUnavailable, get_sandbox
from rewardd.verifiers.code.settings import SandboxSettings, sandbox_settings
from rewardd.verifiers.code.spec import parse_reference, unknown_keys
from rewardd.verifiers.code.types import Limits, Program, TestResult
from rewardd.verifiers.code.types import TestRun as Run  # not collected as a test class

CODE = CodeVerifier()
HAVE_GXX = shutil.which("g++") is not None
if not HAVE_GXX:
    warnings.warn("g++ is not installed: the C++ checker tests of test_code_checker.py are "
                  "SKIPPED; install g++ to run them", stacklevel=1)
LANGUAGES = ["python", pytest.param("cpp", marks=pytest.mark.skipif(
    not HAVE_GXX, reason="g++ is not installed: C++ checkers cannot be compiled here"))]
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module", autouse=True)
def sandbox_available() -> None:
    """Programs must really run: fail plainly where they cannot (see make sandbox-deps)."""
    try:
        get_sandbox().run(Program("python", "print(1)", (Run(),)))
    except SandboxUnavailable as exc:
        pytest.fail(f"no sandbox on this machine: {exc}")


def grade(completion: str, reference: dict, **params: Any) -> Outcome:
    out = run_verifier(CODE, Sample(completion), reference, params)
    assert out.ok, out.detail
    return out


def judge_failure(completion: str, reference: dict, **params: Any) -> Outcome:
    out = run_verifier(CODE, Sample(completion), reference, params)
    assert not out.ok and out.error == FailureKind.invalid_reference, out
    assert out.reward is None
    return out


def verdicts(out: Outcome) -> list[str]:
    return [t["verdict"] for t in out.detail["tests"]]


# ----------------------------------------------------------------------------- problems
# Each checker: exit 0 accept (stdout: nothing, or a score), 1 wrong, 2 malformed output.

PERMUTATION_TESTS = {"inputs": ["2\n", "3\n", "5\n"],
                     "outputs": ["2 1\n", "2 3 1\n", "2 3 4 5 1\n"]}
PERMUTATION = {
    "python": """
import sys
n = int(open(sys.argv[1]).read())
try:
    p = [int(t) for t in open(sys.argv[2]).read().split()]
except ValueError:
    sys.exit(2)
ok = sorted(p) == list(range(1, n + 1)) and all(p[i] != i + 1 for i in range(n))
sys.exit(0 if ok else 1)
""",
    "cpp": r"""
#include <algorithm>
#include <cstdio>
#include <vector>
int main(int argc, char** argv) {
    if (argc != 4) return 3;
    FILE* in = std::fopen(argv[1], "r");
    FILE* out = std::fopen(argv[2], "r");
    int n;
    if (std::fscanf(in, "%d", &n) != 1) return 3;
    std::vector<int> p(n);
    for (int i = 0; i < n; i++) {
        if (std::fscanf(out, "%d", &p[i]) != 1) return 2;
        if (p[i] == i + 1) return 1;
    }
    int extra;
    if (std::fscanf(out, "%d", &extra) == 1) return 1;
    std::sort(p.begin(), p.end());
    for (int i = 0; i < n; i++) if (p[i] != i + 1) return 1;
    return 0;
}
""",
}

FLOAT_TESTS = {"inputs": ["2\n", "10\n", "16\n"],
               "outputs": ["1.4142135624\n", "3.1622776602\n", "4.0000000000\n"]}
FLOAT = {
    "python": """
import sys
want = float(open(sys.argv[3]).read())
try:
    got = float(open(sys.argv[2]).read())
except ValueError:
    sys.exit(2)
sys.exit(0 if abs(got - want) <= 1e-6 * max(1.0, abs(want)) else 1)
""",
    "cpp": r"""
#include <algorithm>
#include <cmath>
#include <cstdio>
int main(int argc, char** argv) {
    double want, got;
    if (std::fscanf(std::fopen(argv[3], "r"), "%lf", &want) != 1) return 3;
    if (std::fscanf(std::fopen(argv[2], "r"), "%lf", &got) != 1) return 2;
    return std::fabs(got - want) <= 1e-6 * std::max(1.0, std::fabs(want)) ? 0 : 1;
}
""",
}

# constructive: print a b with a + b = n, a, b >= 1; gcd(a, b) == 1 for full marks, a valid
# split that is not coprime gets 0.5 (partial credit on stdout)
SPLIT_TESTS = {"inputs": ["10\n", "12\n", "15\n"], "outputs": ["1 9\n", "1 11\n", "1 14\n"]}
SPLIT = {
    "python": """
import math, sys
n = int(open(sys.argv[1]).read())
try:
    a, b = map(int, open(sys.argv[2]).read().split())
except ValueError:
    sys.exit(2)
if a < 1 or b < 1 or a + b != n:
    sys.exit(1)
if math.gcd(a, b) != 1:
    print("0.5 valid split, not coprime")
""",
    "cpp": r"""
#include <cstdio>
#include <numeric>
int main(int argc, char** argv) {
    long long n, a, b;
    std::fscanf(std::fopen(argv[1], "r"), "%lld", &n);
    if (std::fscanf(std::fopen(argv[2], "r"), "%lld %lld", &a, &b) != 2) return 2;
    if (a < 1 || b < 1 || a + b != n) return 1;
    if (std::gcd(a, b) != 1) std::printf("0.5 valid split, not coprime\n");
    return 0;
}
""",
}


def ref(tests: dict, language: str, code: str) -> dict:
    return {"tests": tests, "checker": {"language": language, "code": code}}


@pytest.mark.parametrize("language", LANGUAGES)
def test_permutation_any_valid_answer_is_accepted(language: str) -> None:
    reference = ref(PERMUTATION_TESTS, language, PERMUTATION[language])
    other = "n = int(input())\nprint(n, *range(1, n))"  # a derangement, not the jury's
    # exact matching accepts only n=2 (its one derangement is the jury's): 1 of 3
    assert grade(other, {"tests": PERMUTATION_TESTS}).reward == pytest.approx(1 / 3)
    out = grade(other, reference)
    assert out.reward == 1.0 and verdicts(out) == ["passed"] * 3
    assert out.detail["judged_by"] == f"checker ({language})"
    assert grade("n = int(input())\nprint(*range(2, n + 1), 1)", reference).reward == 1.0


@pytest.mark.parametrize("language", LANGUAGES)
def test_permutation_wrong_and_malformed_outputs(language: str) -> None:
    reference = ref(PERMUTATION_TESTS, language, PERMUTATION[language])
    identity = grade("n = int(input())\nprint(*range(1, n + 1))", reference)
    assert identity.reward == 0.0 and verdicts(identity) == ["wrong_answer"] * 3
    first = identity.detail["tests"][0]
    assert first["checker"] == "exit 1 (wrong answer)" and first["got"] == "1 2\n"
    repeated = grade("n = int(input())\nprint(*([2] * n))", reference)  # not a permutation
    assert verdicts(repeated) == ["wrong_answer"] * 3
    garbage = grade("print('abc')", reference)  # malformed: exit 2, the rollout's fault
    assert garbage.reward == 0.0
    assert {t["checker"] for t in garbage.detail["tests"]} == {"exit 2 (presentation error)"}


@pytest.mark.parametrize("language", LANGUAGES)
def test_float_within_tolerance_of_the_jury(language: str) -> None:
    reference = ref(FLOAT_TESTS, language, FLOAT[language])
    precise = "import math\nprint(f'{math.sqrt(int(input())):.7f}')"
    assert grade(precise, {"tests": FLOAT_TESTS}).reward == 0.0  # other digits than the jury
    assert grade(precise, reference).reward == 1.0
    # 1.41 and 3.16 are off by more than 1e-6; 4.0 is exact: 1 of 3
    coarse = grade("import math\nprint(round(math.sqrt(int(input())), 2))", reference)
    assert coarse.reward == pytest.approx(1 / 3)
    assert verdicts(coarse) == ["wrong_answer", "wrong_answer", "passed"]
    assert coarse.detail["tests"][0]["got"] == "1.41\n"
    # the tolerance is 1e-6 * 1.4142135624 = 1.4142e-6: 1.4142156 is 2.0376e-6 off (out),
    # 1.4142148 is 1.2376e-6 off (in: relative, an absolute 1e-6 would reject it)
    one = {**reference, "tests": {"inputs": ["2\n"], "outputs": ["1.4142135624\n"]}}
    assert grade("print(1.4142156)", one).reward == 0.0
    assert grade("print(1.4142148)", one).reward == 1.0


@pytest.mark.parametrize("language", LANGUAGES)
def test_constructive_with_partial_credit(language: str) -> None:
    reference = ref(SPLIT_TESTS, language, SPLIT[language])
    # n // 2, n - n // 2: 5 5 (gcd 5) -> 0.5, 6 6 (gcd 6) -> 0.5, 7 8 -> 1: (0.5+0.5+1)/3
    half = grade("n = int(input())\nprint(n // 2, n - n // 2)", reference)
    assert half.reward == pytest.approx(2 / 3)
    assert verdicts(half) == ["partial", "partial", "passed"]
    assert [t.get("score") for t in half.detail["tests"]] == [0.5, 0.5, None]
    assert half.detail["passed"] == 1
    strict = grade("n = int(input())\nprint(n // 2, n - n // 2)", reference,
                   reward="all_or_nothing")
    assert strict.reward == 0.0
    assert grade("n = int(input())\nprint(n - 1, 1)", reference).reward == 1.0
    assert grade("n = int(input())\nprint(n, 0)", reference).reward == 0.0


def test_all_or_nothing_stops_checking_at_the_first_reject() -> None:
    reference = ref(SPLIT_TESTS, "python", SPLIT["python"])
    out = grade("n = int(input())\nprint(n // 2, n - n // 2)", reference,
                reward="all_or_nothing")
    assert verdicts(out) == ["partial", "not_run", "not_run"] and out.reward == 0.0


# ----------------------------------------------------------------------------- failures


ANY = "print(1)"
ONE_TEST = {"inputs": ["1\n", "2\n", "3\n"], "outputs": ["1\n", "2\n", "3\n"]}


@pytest.mark.parametrize("language,code", [
    ("python", "raise RuntimeError('checker bug')"),
    ("python", "import sys\nprint(open(sys.argv[4]).read())"),  # IndexError: no 4th file
    pytest.param("cpp", "#include <cstdlib>\nint main() { std::abort(); }",
                 marks=pytest.mark.skipif(not HAVE_GXX, reason="g++ is not installed")),
    pytest.param("cpp", "int main() { volatile int* p = nullptr; return *p; }",
                 marks=pytest.mark.skipif(not HAVE_GXX, reason="g++ is not installed")),
])
def test_crashing_checker_is_a_failure_of_the_judge(language: str, code: str) -> None:
    out = judge_failure(ANY, ref(ONE_TEST, language, code))
    assert out.detail["checker_failure"] == "crashed"
    assert out.detail["test"] == 0  # stopped at the first failure
    assert "checker failed on test 0 (crashed)" in out.detail["message"]


def test_python_checker_exception_is_not_its_wrong_answer() -> None:
    """Both exit with status 1; only sys.exit(1) is a wrong answer."""
    said_wrong = grade(ANY, ref(ONE_TEST, "python", "import sys\nsys.exit(1)"))
    assert verdicts(said_wrong) == ["wrong_answer"] * 3
    crashed = judge_failure(ANY, ref(ONE_TEST, "python", "1 / 0"))
    assert crashed.detail["checker_failure"] == "crashed"
    assert "ZeroDivisionError" in crashed.detail["message"]


@pytest.mark.parametrize("code,params", [
    ("while True:\n    pass", {"checker_cpu_s": 1, "checker_wall_s": 30}),  # CPU limit
    ("import time\ntime.sleep(600)", {"checker_wall_s": 1}),  # wall clock
])
def test_hanging_checker_is_a_timeout_of_the_judge(code: str, params: dict) -> None:
    out = judge_failure(ANY, ref(ONE_TEST, "python", code), **params)
    assert out.detail["checker_failure"] == "timeout"
    assert out.detail["test"] == 0  # one test's limit, not three


def test_checker_over_its_memory_is_a_failure_of_the_judge() -> None:
    out = judge_failure(ANY, ref(ONE_TEST, "python", "x = bytearray(400 << 20)"),
                        checker_memory_mb=128)
    assert out.detail["checker_failure"] == "memory_exceeded"


@pytest.mark.parametrize("code,kind", [
    ("import sys\nsys.exit(3)", "exit_status"),  # testlib's _fail
    ("import sys\nsys.exit(7)", "exit_status"),  # testlib's points: not this protocol
    ("print('ok')", "bad_score"),
    ("print(1.5)", "bad_score"),
    ("print('nan')", "bad_score"),
    ("print('x' * (2 << 20))", "output_limit"),
])
def test_checker_that_breaks_the_protocol(code: str, kind: str) -> None:
    out = judge_failure(ANY, ref(ONE_TEST, "python", code))
    assert out.detail["checker_failure"] == kind


def test_checker_limits_are_its_own() -> None:
    """A checker that needs 1.5 s of CPU passes with checker_cpu_s=3 while the solution's
    cpu_s is 1; the solution's limit does not bind the checker. Its wall-clock limit is the
    most a request may give (30 s), so a busy machine cannot end it first."""
    spin = ("import time\nt = time.process_time()\n"
            "while time.process_time() - t < 1.5:\n    pass")
    out = grade(ANY, ref({"inputs": ["1\n"], "outputs": ["1\n"]}, "python", spin),
                cpu_s=1, checker_cpu_s=3, checker_wall_s=30)
    assert out.reward == 1.0


@pytest.mark.skipif(not HAVE_GXX, reason="g++ is not installed")
def test_cpp_checker_compiled_once_for_a_group() -> None:
    executables.clear()
    reference = ref(PERMUTATION_TESTS, "cpp", PERMUTATION["cpp"] + "\n// group A\n")
    group = ["n = int(input())\nprint(n, *range(1, n))", "print('abc')",
             "n = int(input())\nprint(*range(2, n + 1), 1)"]
    assert [grade(c, reference).reward for c in group] == [1.0, 0.0, 1.0]
    assert executables.compiled == 1


@pytest.mark.skipif(not HAVE_GXX, reason="g++ is not installed")
def test_cpp_checker_that_does_not_compile_fails_the_judge_once() -> None:
    executables.clear()
    reference = ref(ONE_TEST, "cpp", "int main() { return undefined_name; }")
    for _ in range(2):
        out = judge_failure(ANY, reference)
        assert out.detail["checker_failure"] == "compile_error"
        assert "undefined_name" in out.detail["message"]
    assert executables.compiled == 1  # the error is cached too: no second compilation


@pytest.mark.parametrize("level", ["namespaces", "none"])
@pytest.mark.parametrize("language", LANGUAGES)
def test_checker_files_and_cached_executable_at_other_levels(level: str, language: str) -> None:
    """The argument files (a private tmp under namespaces, a temporary directory without
    isolation) and the cached executable work at every isolation level, not only full."""
    executables.clear()
    checker = parse_checker({"language": language, "code": PERMUTATION[language]})
    cases = [Case(0, b"3\n", b"3 1 2\n", "2 3 1\n"), Case(1, b"3\n", b"1 2 3\n", "2 3 1\n")]
    sandbox = Sandbox(level=level)
    try:
        for _ in range(2):  # the second time from the cache (C++)
            got = check(checker, cases, Limits(), sandbox, stop_at_reject=False)
            assert [got[0]["verdict"], got[1]["verdict"]] == ["passed", "wrong_answer"]
    finally:
        sandbox.close()
    assert executables.compiled == (1 if language == "cpp" else 0)


@pytest.mark.skipif(not HAVE_GXX, reason="g++ is not installed")
def test_compile_past_its_time_limit_is_not_cached() -> None:
    """A compile error is cached; a compile cut short by its limit (a busy machine) is not:
    the next call compiles again and succeeds."""
    executables.clear()
    checker = parse_checker({"language": "cpp", "code": PERMUTATION["cpp"] + "// slow\n"})
    cases = [Case(0, b"2\n", b"2 1\n", "2 1\n")]
    with pytest.raises(CheckerFailed) as failed:
        check(checker, cases, Limits(compile_s=0.01), get_sandbox(), stop_at_reject=False)
    assert failed.value.kind == "compile_error" and "limit" in failed.value.message
    assert executables.get(checker.digest) is None
    assert check(checker, cases, Limits(), get_sandbox(), stop_at_reject=False) == {
        0: {"verdict": "passed"}}
    assert isinstance(executables.get(checker.digest), bytes)


HEADER_CHECKER = r"""
#include "judge_lib.h"
int main(int argc, char** argv) { return judge_same(argv[2], argv[3]); }
"""
HEADER = r"""
#include <fstream>
#include <string>
inline int judge_same(const char* out, const char* ans) {
    std::ifstream a(out), b(ans);
    std::string x, y;
    while (true) {
        bool more_a = static_cast<bool>(a >> x), more_b = static_cast<bool>(b >> y);
        if (more_a != more_b) return 1;
        if (!more_a) return 0;
        if (x != y) return 1;
    }
}
"""


@pytest.mark.skipif(not HAVE_GXX, reason="g++ is not installed")
def test_include_dir_setting_serves_headers_such_as_testlib(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    """REWARDD_SANDBOX_INCLUDE_DIR is on every C++ compile's include path, read-only (the
    way an operator provides testlib.h); without it the same checker does not compile."""
    include = tmp_path / "include"
    include.mkdir(mode=0o755)
    (include / "judge_lib.h").write_text(HEADER)
    (include / "judge_lib.h").chmod(0o644)
    tmp_path.chmod(0o755)
    cases = [Case(0, b"", b"1 2\n", "1 2\n"), Case(1, b"", b"2 1", "1 2\n")]
    checker = parse_checker({"language": "cpp", "code": HEADER_CHECKER})
    executables.clear()
    monkeypatch.setenv("REWARDD_SANDBOX_INCLUDE_DIR", str(include))
    sandbox_settings.cache_clear()
    sandbox = Sandbox()
    try:
        verdicts_ = check(checker, cases, Limits(), sandbox, stop_at_reject=False)
    finally:
        sandbox.close()
        monkeypatch.delenv("REWARDD_SANDBOX_INCLUDE_DIR")
        sandbox_settings.cache_clear()
    assert [verdicts_[i]["verdict"] for i in (0, 1)] == ["passed", "wrong_answer"]
    executables.clear()
    sandbox = Sandbox()
    try:
        with pytest.raises(CheckerFailed) as failed:
            check(checker, cases, Limits(), sandbox, stop_at_reject=False)
    finally:
        sandbox.close()
    assert failed.value.kind == "compile_error" and "judge_lib.h" in failed.value.message
    with pytest.raises(ValueError, match="is not a directory"):
        SandboxSettings(sandbox_include_dir=str(tmp_path / "missing"))


def test_solution_failures_are_not_sent_to_the_checker() -> None:
    """A crash or a timeout of the rollout stays its own verdict; the checker is not run
    on it (a checker that would fail on any call proves it)."""
    reference = ref(ONE_TEST, "python", "raise SystemExit(3)")
    out = grade("import sys\nsys.exit(5)", reference)
    assert verdicts(out) == ["runtime_error"] * 3


# ----------------------------------------------------------------------------- isolation

SECRET = "JURY-ANSWER-5be1c7"
MARKER = "CHECKER-SOURCE-9d2f04"
INPUT = "TEST-INPUT-3c1e"  # in the solution's reach: proves the search finds what it can
EQUAL_CHECKER = f"""
# {MARKER}
import sys
sys.exit(0 if open(sys.argv[2]).read().split() == open(sys.argv[3]).read().split() else 1)
"""
SNOOP = f"""
import glob, os
paths = glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ") + glob.glob(
    "/proc/[0-9]*/fd/*") + glob.glob("/proc/[0-9]*/cwd/*") + glob.glob("/proc/[0-9]*/root/tmp/*")
for top in ("/tmp", "/opt", "/dev/shm", "/var", "/etc", "/run", "/home", "/root", "/"):
    for root, dirs, files in os.walk(top):
        if root.startswith(("/proc", "/sys", "/usr", "/dev")) and root != "/dev/shm":
            dirs[:] = []
            continue
        paths += [os.path.join(root, name) for name in files]
found = []
for path in paths:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        continue
    for secret in (b"{SECRET}", b"{MARKER}", b"{INPUT}"):
        if secret in data and secret.decode() not in found:
            found.append(secret.decode())
for name in ("answer.txt", "output.txt", "input.txt", "main", "checker.py"):
    for where in ("/tmp", os.getcwd()):
        try:
            with open(os.path.join(where, name), "w") as f:
                f.write("tampered")
        except OSError:
            pass
print(*sorted(found))
"""


def test_solution_cannot_read_or_alter_the_checker_or_the_answer() -> None:
    reference = ref({"inputs": [f"{INPUT}\n"], "outputs": [f"{SECRET}\n"]}, "python",
                    EQUAL_CHECKER)
    out = grade(SNOOP, reference, cpu_s=20, wall_s=30, time_budget_s=None)
    assert out.reward == 0.0 and verdicts(out) == ["wrong_answer"]
    assert out.detail["tests"][0]["got"] == f"{INPUT}\n"  # its own input, nothing else
    # the checker itself does see its three files, and the jury's answer
    assert grade(f"print('{SECRET}')", reference).reward == 1.0


def test_checker_files_are_read_only_for_the_checker() -> None:
    code = """
import sys
for path in sys.argv[1:]:
    try:
        open(path, "w").write("changed")
    except OSError:
        continue
    sys.exit(3)
"""
    assert grade(ANY, ref({"inputs": ["1\n"], "outputs": ["1\n"]}, "python", code)).reward \
        == 1.0


def test_checker_receives_the_exact_bytes() -> None:
    code = """
import sys
got, inp, ans = (open(p, "rb").read() for p in (sys.argv[2], sys.argv[1], sys.argv[3]))
sys.exit(0 if (got, inp, ans) == (b"a  b\\r\\n\\n", b"in put\\n", "é\\n".encode()) else 1)
"""
    reference = ref({"inputs": ["in put\n"], "outputs": ["é\n"]}, "python", code)
    assert grade("import sys\nsys.stdout.write('a  b\\r\\n\\n')", reference).reward == 1.0
    assert grade("print('a b')", reference).reward == 0.0


# ----------------------------------------------------------------------------- reference


def test_unknown_keys_are_named_everywhere() -> None:
    good = ref(ONE_TEST, "python", "pass")
    assert unknown_keys(good) == []
    bad = {"tests": json.dumps({**ONE_TEST, "fn": "f"}), "checkr": {},
           "checker": {"language": "python", "code": "pass", "timeout": 3}}
    assert [path for path, _ in unknown_keys(bad)] == [
        ("checkr",), ("tests", "fn"), ("checker", "timeout")]
    for reference, named in [({**good, "checkr": 1}, "'checkr'"),
                             ({**good, "tests": {**ONE_TEST, "extra": 1}}, "'tests.extra'"),
                             ({**good, "checker": {"language": "python", "code": "pass",
                                                   "limits": {}}}, "'checker.limits'")]:
        with pytest.raises(InvalidReference, match=named):
            parse_reference(reference)
        out = run_verifier(CODE, Sample(ANY), reference, {})
        assert out.error == FailureKind.invalid_reference and named in out.detail["message"]


def test_keys_of_other_verifiers_may_share_the_reference() -> None:
    """A group's one reference serves every verifier of the request: the API passes the
    keys the others document (``shared``); a worker accepts any registered verifier's key."""
    reference = {"tests": ONE_TEST, "answer": "3", "rubric": "style"}
    assert [p for p, _ in unknown_keys(reference)] == [("answer",), ("rubric",)]
    assert [p for p, _ in unknown_keys(reference, {"answer"})] == [("rubric",)]
    assert unknown_keys(reference, {"answer", "rubric"}) == []
    assert parse_reference(reference).style == "stdio"  # math's and rubric's keys
    assert "nor a key of this request's other verifiers" in unknown_keys(
        {**reference, "answr": 1}, {"answer", "rubric"})[0][1]


@pytest.mark.parametrize("checker,named", [
    ("python", "must be an object"),
    ({"language": "java", "code": "x"}, "'checker.language' must be python or cpp"),
    ({"language": "python", "code": " "}, "'checker.code' must be a non-empty string"),
])
def test_bad_checker_is_an_invalid_reference(checker: Any, named: str) -> None:
    with pytest.raises(InvalidReference, match=named):
        parse_reference({"tests": ONE_TEST, "checker": checker})


@pytest.mark.parametrize("reference", [
    {"tests": {"fn_name": "f", "inputs": [[1]], "outputs": [1]}},
    {"test_code": "assert f(1) == 1"},
])
def test_checker_needs_stdio_tests(reference: dict) -> None:
    with pytest.raises(InvalidReference, match="judges stdin/stdout tests only"):
        parse_reference({**reference, "checker": {"language": "python", "code": "pass"}})


def test_checker_code_is_never_compiled_outside_the_sandbox() -> None:
    """Issue 28 row 6: compile() of 6 MB of checker code took +2.3 GB of worker memory. A
    syntax error is now found by the checker's own sandboxed run: still the judge's
    failure (``invalid_reference``), never a reward."""
    parsed = parse_checker({"language": "python", "code": "def f(:"})
    assert parsed.language == "python"  # read, not compiled
    out = judge_failure(ANY, ref(ONE_TEST, "python", "def f(:"))
    assert out.detail["checker_failure"] == "crashed"
    assert "SyntaxError" in out.detail["message"]


def test_checker_language_aliases() -> None:
    assert parse_checker({"language": "C++", "code": "int main(){}"}).language == "cpp"
    assert parse_checker({"language": "python3", "code": "pass"}).language == "python"


@pytest.mark.parametrize("stdout,score", [
    (b"", 1.0), (b" \n", 1.0), (b"1", 1.0), (b"0.25 partly", 0.25), (b"0\n", 0.0),
    (b"1e-1", 0.1), (b".5", 0.5), (b"1.0000001", None), (b"-0.1", None), (b"ok", None),
    (b"inf", None), (b"0x1", None),
])
def test_score_rule(stdout: bytes, score: float | None) -> None:
    read = read_score(stdout)
    assert (read is None) if score is None else read == Decimal(str(score))


@pytest.mark.parametrize("stdout,verdict", [
    # issue 28 row 15: read as a float, the first passed and the second was accepted
    (b"0.99999999999999999999", "partial"),
    (b"1.0000000000000001", "bad_score"),
    (b"1.000000000000000000000", "passed"),
    (b"1e-999999999", "partial"),
    (b"0." + b"9" * 200, "bad_score"),  # longer than any real score: refused, not parsed
])
def test_score_read_as_decimal(stdout: bytes, verdict: str) -> None:
    try:
        got = read_verdict(TestResult("ok", stdout=stdout), 0)
    except CheckerFailed as exc:
        assert exc.kind == verdict
        return
    assert got["verdict"] == verdict
    if verdict == "partial":
        assert 0.0 <= got["score"] < 1.0


@pytest.mark.parametrize("result,verdict", [
    (TestResult("ok"), {"verdict": "passed"}),
    (TestResult("ok", stdout=b"0"), {"verdict": "partial", "score": 0.0}),
    (TestResult("runtime_error", exit_code=1), {"verdict": "wrong_answer",
                                                "checker": "exit 1 (wrong answer)"}),
    (TestResult("runtime_error", exit_code=2, stderr_tail=b"wrong output format"),
     {"verdict": "wrong_answer", "checker": "exit 2 (presentation error)",
      "checker_message": "wrong output format"}),
])
def test_verdict_rule(result: TestResult, verdict: dict) -> None:
    assert read_verdict(result, 0) == verdict


# ----------------------------------------------------------------------------- a dataset


def codecontests_reference(row: dict) -> dict:
    """A CodeContests(+) row as a code reference: public, private and generated tests in
    that order, and its checker (C++, as CodeContests+ ships them)."""
    inputs, outputs = [], []
    for split in ("public_tests", "private_tests", "generated_tests"):
        inputs += row[split]["input"]
        outputs += row[split]["output"]
    return {"tests": {"inputs": inputs, "outputs": outputs},
            "checker": {"language": "cpp", "code": row["checker"]}}


CC_LANGUAGES = {2: ("cpp", "cpp"), 3: ("python", "python")}


@pytest.mark.skipif(not HAVE_GXX, reason="g++ is not installed: the row's checker is C++")
def test_codecontests_row_with_a_checker() -> None:
    """Two-sum, any pair: the jury's solutions all pass although they print other pairs than
    the jury's answers; the incorrect ones fail as the checker says."""
    row = json.loads((DATA / "codecontests_checker.json").read_text())
    reference = codecontests_reference(row)
    assert len(reference["tests"]["inputs"]) == 6
    rewards = {}
    for kind in ("solutions", "incorrect_solutions"):
        for language, code in zip(row[kind]["language"], row[kind]["solution"]):
            lang, tag = CC_LANGUAGES[language]
            out = grade(f"```{tag}\n{code}\n```", reference, language=lang,
                        time_budget_s=None)  # compiling <bits/stdc++.h> takes seconds
            rewards.setdefault(kind, []).append(out.reward)
            if kind == "solutions":
                assert verdicts(out) == ["passed"] * 6, out.detail
    assert rewards["solutions"] and set(rewards["solutions"]) == {1.0}
    # the first-index-only solution misses the pair in tests 2 and 5 (0-based 1 and 4)
    assert rewards["incorrect_solutions"] == [pytest.approx(4 / 6)]
    exact = grade(f"```python\n{row['solutions']['solution'][-1]}\n```",
                  {"tests": reference["tests"]}, language="python")
    assert exact.reward < 1.0  # the reason the row ships a checker
