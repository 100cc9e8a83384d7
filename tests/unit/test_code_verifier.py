"""The code verifier end to end on the real sandbox: formats, verdicts, languages, exploits.

Every program here really runs (in the sandbox's isolation on this machine); the reference
parsing and comparison rules are pinned in test_code_spec.py. The exploit tests are the point
of the design: the expected outputs never enter the sandbox and results come back as data, so
stack walking, objects that equal everything and early exits all get a reward of 0.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
from pydantic import ValidationError

from rewardd.verifiers.base import FailureKind, InvalidReference, Outcome, Sample, run_verifier
from rewardd.verifiers.code import CodeVerifier
from rewardd.verifiers.code import verifier as code_verifier
from rewardd.verifiers.code.sandbox import SandboxUnavailable, get_sandbox
from rewardd.verifiers.code.types import Program
from rewardd.verifiers.code.types import TestRun as Run  # not collected as a test class

CODE = CodeVerifier()

ADD_STDIO = {"tests": {"inputs": ["1 2\n", "10 20\n", "-5 5\n"],
                       "outputs": ["3\n", "30\n", "0\n"]}}


@pytest.fixture(scope="module", autouse=True)
def sandbox_available() -> None:
    """These tests need programs to run: where the machine cannot, fail once, plainly (as
    the project's sandbox tests do: they fail, never skip; see ``make sandbox-deps``)."""
    try:
        get_sandbox().run(Program("python", "print(1)", (Run(),)))
    except SandboxUnavailable as exc:
        pytest.fail(f"no sandbox on this machine: {exc}")


def grade(completion: str, reference: dict, **params) -> Outcome:
    out = run_verifier(CODE, Sample(completion), reference, params)
    assert out.ok, out.detail
    return out


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nIt reads the input and prints."


def verdicts(out: Outcome) -> list[str]:
    return [t["verdict"] for t in out.detail["tests"]]


# ----------------------------------------------------------------------------- stdio


def test_stdio_correct_program_gets_one():
    out = grade(fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD_STDIO)
    assert out.reward == 1.0
    assert verdicts(out) == ["passed"] * 3
    d = out.detail
    assert (d["passed"], d["total"], d["code_from"], d["language"]) == (
        3, 3, "fenced_block", "python")
    assert d["isolation"] in ("full", "namespaces", "none")


def test_stdio_wrong_program_gets_zero_with_previews():
    out = grade("a, b = map(int, input().split())\nprint(a - b)", ADD_STDIO)
    assert out.reward == 0.0
    assert out.detail["code_from"] == "whole"
    first = out.detail["tests"][0]
    assert first["verdict"] == "wrong_answer"
    assert (first["got"], first["expected"]) == ("-1\n", "3\n")


def test_stdio_fraction_of_tests_passed():
    code = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 99)"
    out = grade(fenced(code), ADD_STDIO)
    assert out.reward == pytest.approx(2 / 3)
    assert verdicts(out) == ["passed", "passed", "wrong_answer"]


def test_all_or_nothing_stops_at_the_first_failure():
    code = "a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)"
    out = grade(fenced(code), ADD_STDIO, reward="all_or_nothing")
    assert out.reward == 0.0
    assert verdicts(out) == ["passed", "wrong_answer", "not_run"]
    assert out.detail["passed"] == 1
    assert grade(fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD_STDIO,
                 reward="all_or_nothing").reward == 1.0


def test_runtime_error_timeout_and_output_limit_verdicts():
    code = ("import sys\na, b = map(int, input().split())\n"
            "if a == 10:\n    raise ValueError('boom')\n"
            "if a == -5:\n    print('x' * 5000)\nprint(a + b)")
    out = grade(fenced(code), ADD_STDIO, output_kb=1)
    assert verdicts(out) == ["passed", "runtime_error", "output_limit"]
    assert "boom" in out.detail["tests"][1]["message"]
    out = grade(fenced("while True:\n    pass"), {"tests": {"inputs": [""], "outputs": [""]}},
                cpu_s=0.3, wall_s=1.0)
    assert verdicts(out) == ["timeout"] and out.reward == 0.0


def test_time_budget_stops_starting_tests():
    reference = {"tests": {"inputs": ["1\n"] * 6, "outputs": ["1\n"] * 6}}
    code = "import time\ntime.sleep(0.2)\nprint(input())"
    out = grade(fenced(code), reference, time_budget_s=0.3)
    assert verdicts(out)[0] == "passed" and set(verdicts(out)) == {"passed", "not_run"}
    assert verdicts(out)[-1] == "not_run" and out.reward < 1.0


def test_max_tests_runs_only_the_first_tests():
    out = grade(fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD_STDIO,
                max_tests=2)
    assert (out.reward, out.detail["total"], out.detail["tests_in_reference"]) == (1.0, 2, 3)


def test_no_code_is_zero_not_a_failure():
    out = grade("", ADD_STDIO)
    assert (out.reward, out.detail["rule"]) == (0.0, "no_code")
    out = grade("```python\n```", ADD_STDIO)
    assert out.detail["rule"] == "no_code"


# ----------------------------------------------------------------------------- call-based


def test_call_based_function():
    reference = {"tests": {"fn_name": "add", "inputs": [[1, 2], [[1], [2]], ["a", "b"]],
                           "outputs": [3, [1, 2], "ab"]}}
    out = grade(fenced("def add(a, b):\n    return a + b"), reference)
    assert out.reward == 1.0 and out.detail["style"] == "call"
    out = grade(fenced("def add(a, b):\n    return str(a) + str(b)"), reference)
    assert verdicts(out) == ["wrong_answer", "wrong_answer", "passed"]  # "12" is not 3


def test_call_based_solution_method_and_tuples():
    reference = {"tests": {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9], [[3, 3], 6]],
                           "outputs": [[0, 1], [0, 1]]}}
    code = ("from typing import List\nclass Solution:\n"
            "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
            "        seen = {}\n        for i, x in enumerate(nums):\n"
            "            if target - x in seen:\n                return (seen[target - x], i)\n"
            "            seen[x] = i\n")
    assert grade(fenced(code), reference).reward == 1.0


def test_livecodebench_json_lines_strings():
    reference = {"tests": json.dumps({"fn_name": "countPairs",
                                      "inputs": ["[1, 2, 3]\n4", "[5]\n1"],
                                      "outputs": ["1", "0"]})}
    code = ("class Solution:\n    def countPairs(self, nums, target):\n"
            "        return sum(1 for i in range(len(nums)) for j in range(i + 1, len(nums))"
            " if nums[i] + nums[j] < target)\n")
    out = grade(fenced(code), reference)
    assert out.reward == 1.0, out.detail


# ----------------------------------------------------------------------------- assert-style


def test_mbpp_asserts():
    reference = {"test_code": "assert square(2) == 4\nassert square(-3) == 9\n"
                              "assert square(0) == 0\n"}
    out = grade(fenced("def square(x):\n    return x * x"), reference)
    assert out.reward == 1.0
    assert (out.detail["lifted"], out.detail["script"]) == (3, 0)
    out = grade(fenced("def square(x):\n    return x * 2"), reference)
    assert verdicts(out) == ["passed", "wrong_answer", "passed"]
    assert out.detail["tests"][1]["test"] == "assert square(-3) == 9"


def test_humaneval_check_candidate():
    test_code = ("METADATA = {}\n\ndef check(candidate):\n"
                 "    assert candidate([1.0, 2.0, 3.0], 0.5) == False\n"
                 "    assert candidate([1.0, 2.8, 3.0], 0.3) == True\n"
                 "    assert not candidate([], 0.1)\n"
                 "    for n in range(3):\n        assert candidate([1.0] * n, 0.1) == (n > 1)\n")
    reference = {"test_code": test_code, "entry_point": "has_close_elements"}
    code = ("def has_close_elements(numbers, threshold):\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
            "               for b in numbers[i + 1:])")
    out = grade(fenced(code), reference)
    assert verdicts(out) == ["passed"] * 4
    assert (out.detail["lifted"], out.detail["script"], out.detail["script_asserts"]) == (
        3, 1, 1)
    out = grade(fenced("def has_close_elements(numbers, threshold):\n    return 1 / 0"),
                reference)
    assert out.reward == 0.0
    assert set(verdicts(out)) == {"runtime_error"}


# ----------------------------------------------------------------------------- other languages


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_cpp_stdio_and_compile_error():
    code = ("#include <iostream>\nint main() { long long a, b; std::cin >> a >> b; "
            "std::cout << a + b << std::endl; }")
    out = grade(fenced(code, "cpp"), {**ADD_STDIO, "language": "cpp"})
    assert out.reward == 1.0 and out.detail["language"] == "cpp"
    out = grade(fenced("int main() { return undefined_name; }", "cpp"),
                {**ADD_STDIO, "language": "cpp"})
    assert out.reward == 0.0
    assert set(verdicts(out)) == {"compile_error"}
    assert "undefined_name" in out.detail["tests"][0]["message"]


@pytest.mark.skipif(shutil.which("node") is None, reason="no node")
def test_javascript_stdio():
    code = ("const lines = require('fs').readFileSync(0, 'utf8').trim().split(' ');\n"
            "console.log(Number(lines[0]) + Number(lines[1]));")
    out = grade(fenced(code, "javascript"), ADD_STDIO, language="javascript")
    assert out.reward == 1.0, out.detail


# ----------------------------------------------------------------------------- exploits

STACK_WALKER = '''
import gc, sys
found = []

def look(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and 0 < len(value) < 50 and value.strip().lstrip("-").isdigit():
        found.append(value)

frame = sys._getframe()
while frame is not None:  # every frame up the stack: the harness's locals and globals
    for scope in (frame.f_locals, frame.f_globals):
        for key, value in list(scope.items()):
            look(value)
            if isinstance(value, dict):
                for inner in list(value.values()):
                    look(inner)
    frame = frame.f_back
try:
    import inspect
    for info in inspect.stack():
        for value in list(info.frame.f_locals.values()):
            look(value)
except ImportError:
    pass
for obj in gc.get_objects():  # every container object in the process
    if isinstance(obj, dict):
        for value in list(obj.values()):
            look(value)
    elif isinstance(obj, (list, tuple)):
        for value in list(obj):
            look(value)
'''


def test_stack_walker_would_find_an_answer_held_in_its_caller():
    """The control for the exploit below: in a harness that holds the answer, it finds it."""
    def harness_with_the_answer_in_scope() -> list[str]:
        expected = "3\n"  # noqa: F841 - what the walker looks for
        namespace: dict = {}
        with warnings.catch_warnings():  # the gc walk touches deprecated objects here
            warnings.simplefilter("ignore")
            exec(STACK_WALKER, namespace)
        return namespace["found"]

    assert "3\n" in harness_with_the_answer_in_scope()


def test_exploit_stack_walking_finds_nothing_to_copy():
    # the walker runs to its end and answers with what it found: never the expected output
    stdio = STACK_WALKER + "print(found[-1] if found else 'nothing')\n"
    out = grade(fenced(stdio), ADD_STDIO)
    assert out.reward == 0.0 and set(verdicts(out)) == {"wrong_answer"}
    call = STACK_WALKER + ("def add(a, b):\n"
                           "    return int(found[-1]) if found else None\n")
    reference = {"tests": {"fn_name": "add", "inputs": [[1, 2], [5, 5]], "outputs": [3, 10]}}
    out = grade(fenced(call), reference)
    assert out.reward == 0.0 and set(verdicts(out)) == {"wrong_answer"}
    out = grade(fenced(call), {"test_code": "assert add(1, 2) == 3\nassert add(5, 5) == 10\n"})
    assert out.reward == 0.0 and set(verdicts(out)) == {"wrong_answer"}


ALWAYS_EQUAL = '''
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __hash__(self): return 0
    def __bool__(self): return True
    def __lt__(self, other): return True
    def __sub__(self, other): return 0
    def __rsub__(self, other): return 0
    def __abs__(self): return 0

class Liar(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__

def add(a, b):
    return Anything()

def add_int(a, b):
    return Liar(-1)
'''


def test_exploit_object_equal_to_everything():
    call = {"tests": {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}}
    out = grade(fenced(ALWAYS_EQUAL), call)
    assert out.reward == 0.0 and set(verdicts(out)) == {"runtime_error"}  # not JSON data
    call_int = {"tests": {"fn_name": "add_int", "inputs": [[1, 2]], "outputs": [3]}}
    out = grade(fenced(ALWAYS_EQUAL), call_int)
    assert out.reward == 0.0 and out.detail["tests"][0]["got"] == "-1"  # its data: -1
    asserts = {"test_code": "assert add(1, 2) == 3\nassert add_int(1, 2) == 3\n"
                            "assert add(1, 2)\nassert add(1, 2) < 5\n"
                            "assert abs(add(1, 2) - 3.0) < 1e-6\n"}
    out = grade(fenced(ALWAYS_EQUAL), asserts)
    assert out.reward == 0.0 and out.detail["lifted"] == 5
    humaneval = {"test_code": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                 "entry_point": "add"}
    assert grade(fenced(ALWAYS_EQUAL), humaneval).reward == 0.0


@pytest.mark.parametrize("exit_call", ["import os\nos._exit(0)", "import sys\nsys.exit(0)"])
def test_exploit_exit_before_doing_anything(exit_call):
    program = exit_call + "\ndef add(a, b):\n    return a + b\nprint(3)\n"
    out = grade(fenced(program), ADD_STDIO)
    assert out.reward == 0.0 and out.detail["tests"][0]["got"] == ""
    call = {"tests": {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}}
    out = grade(fenced(program), call)
    assert out.reward == 0.0 and verdicts(out) == ["runtime_error"]
    lifted = {"test_code": "assert add(1, 2) == 3\nassert add(2, 2) == 4\n"}
    out = grade(fenced(program), lifted)
    assert out.reward == 0.0 and verdicts(out) == ["runtime_error"] * 2
    script = {"test_code": "for i in range(3):\n    assert add(i, 1) == i + 1\n"}
    out = grade(fenced(program), script)
    assert out.detail["script"] == 1 and out.reward == 0.0


# ----------------------------------------------------------------------------- failures


def test_invalid_reference_is_a_typed_failure():
    out = run_verifier(CODE, Sample("print(1)"), {"tests": {"inputs": ["1"]}}, {})
    assert (out.ok, out.error) == (False, FailureKind.invalid_reference)
    assert "tests.outputs" in out.detail["message"]


def test_sandbox_unavailable_is_a_failure_never_a_zero(monkeypatch):
    class NoSandbox:
        def run(self, program, judge=None):
            raise SandboxUnavailable("no isolation on this machine and unsafe mode is off")

    monkeypatch.setattr(code_verifier, "get_sandbox", lambda: NoSandbox())
    out = run_verifier(CODE, Sample("print(3)"), ADD_STDIO, {})
    assert (out.ok, out.reward, out.error) == (False, None, FailureKind.unavailable)
    assert "unsafe mode" in out.detail["message"]


def test_warm_up_does_not_start_the_sandbox(monkeypatch):
    def forbidden():
        raise AssertionError("warm_up must not start the sandbox")

    monkeypatch.setattr(code_verifier, "get_sandbox", forbidden)
    monkeypatch.setattr(code_verifier, "isolation", forbidden)
    CODE.warm_up()


def test_params_are_validated():
    with pytest.raises(ValidationError):
        CODE.Params.model_validate({"compare": "exact", "float_tolerance": 1e-6})
    with pytest.raises(ValidationError):
        CODE.Params.model_validate({"cpu_s": 0})
    with pytest.raises(ValidationError):
        CODE.Params.model_validate({"memory_mb": 10 ** 9})
    with pytest.raises(ValidationError):
        CODE.Params.model_validate({"reward": "partial"})
    with pytest.raises(ValidationError):
        CODE.Params.model_validate({"unknown": 1})


def test_a_group_parses_its_reference_once():
    code_verifier.clear_caches()
    reference = {"tests": {"inputs": ["1 2\n"], "outputs": ["3\n"]}}
    for completion in ("print(3)", "print(4)", "print(3)"):
        run_verifier(CODE, Sample(completion), dict(reference), {})
    specs = code_verifier._specs
    assert (specs.misses, specs.hits) == (1, 2)


def test_parsed_specs_are_bounded_by_the_bytes_of_their_references(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 row 6: specs were cached by the reference's whole text, 256 of them: distinct
    1 MB test codes could hold hundreds of MB in a worker. Keyed by digest, bounded in bytes."""
    code_verifier.clear_caches()
    monkeypatch.setattr(code_verifier, "_SPEC_CACHE_BYTES", 3000)
    for i in range(5):
        outputs = [f"{i}\n" + "x" * 1000]
        with pytest.raises(InvalidReference):  # no inputs: a reference that does not read
            code_verifier.load_spec({"tests": {"inputs": [], "outputs": outputs}})
    assert len(code_verifier._specs) == 2
