"""The code verifier's pure parts: extraction, reference formats, assert lifting, comparison.

These pin what is run and what is expected (tests/unit/test_code_verifier.py runs programs).
Assert-style test code is lifted by a sandbox run of its own (issue 28 row 6: never parsed in
the worker), so those tests need the sandbox."""

from __future__ import annotations

import json
import math

import pytest

from rewardd.verifiers.base import InvalidReference
from rewardd.verifiers.code.compare import (Expectation, stdout_equal, tokens_equal, value_meets,
                                    values_equal)
from rewardd.verifiers.code.extract import extract_code
from rewardd.verifiers.code.spec import language_of, parse_reference

# ----------------------------------------------------------------------------- extraction


def test_extract_takes_the_last_python_block():
    text = "first\n```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```\ndone"
    got = extract_code(text)
    assert (got.code, got.code_from, got.fence_closed) == ("print(2)\n", "fenced_block", True)


def test_extract_accepts_a_bare_fence_and_skips_other_tags():
    text = "```\nx = 1\n```\nrun it:\n```bash\npython sol.py\n```\noutput:\n```text\n3\n```"
    assert extract_code(text).code == "x = 1\n"


def test_extract_picks_the_block_of_the_task_language():
    text = "```cpp\nint main(){}\n```\n```python\nprint(1)\n```"
    assert extract_code(text, "cpp").code == "int main(){}\n"
    assert extract_code(text, "python").code == "print(1)\n"
    js = "```js\nconsole.log(1)\n```"
    assert extract_code(js, "javascript").code == "console.log(1)\n"
    assert extract_code("```C++\nint x;\n```", "cpp").code == "int x;\n"


def test_extract_unclosed_final_fence_takes_the_rest():
    text = "```python\nprint(1)\n```\nnow the real one\n```python\nprint(2)\nprint(3)"
    got = extract_code(text)
    assert got.code == "print(2)\nprint(3)\n"
    assert (got.code_from, got.fence_closed) == ("fenced_block", False)


def test_extract_longer_fences_and_tildes():
    text = "````python\n```\nnot a close\n````\n"
    assert extract_code(text).code == "```\nnot a close\n"
    assert extract_code("~~~python\nx = 2\n~~~").code == "x = 2\n"


def test_extract_without_fence_is_the_whole_completion():
    got = extract_code("print(input())\n")
    assert (got.code, got.code_from) == ("print(input())\n", "whole")


def test_extract_nothing():
    assert extract_code("").code == ""
    assert extract_code("   \n").code == ""
    assert extract_code("```python\n\n```").code == ""


# ----------------------------------------------------------------------------- stdio


def test_stdio_tests_object_and_json_string():
    table = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
    for reference in ({"tests": table}, {"tests": json.dumps(table)},
                      {"input_output": json.dumps(table)}, {"input_output": table}):
        spec = parse_reference(reference)
        assert spec.style == "stdio" and spec.language == "python"
        assert [t.mode for t in spec.tests] == ["stdio", "stdio"]
        assert [t.stdin for t in spec.tests] == [b"1 2\n", b"3 4\n"]
        assert [e.value for e in spec.expected] == ["3\n", "7\n"]
        assert all(e.kind == "stdout" for e in spec.expected)


def test_stdio_lists_of_lines_are_joined():
    spec = parse_reference({"tests": {"inputs": [["2", "1 2"]], "outputs": [["3"]]}})
    assert spec.tests[0].stdin == b"2\n1 2\n"
    assert spec.expected[0].value == "3\n"


def test_stdio_empty_fn_name_is_stdio():
    spec = parse_reference({"tests": {"fn_name": "", "inputs": ["1"], "outputs": ["1"]}})
    assert spec.style == "stdio"


def test_language_from_reference_and_override():
    table = {"inputs": ["1"], "outputs": ["1"]}
    assert parse_reference({"tests": table, "language": "C++"}).language == "cpp"
    assert parse_reference({"tests": table, "language": "js"}).language == "javascript"
    assert parse_reference({"tests": table, "language": "cpp"}, "python").language == "python"
    assert language_of({}) == "python"


# ----------------------------------------------------------------------------- call-based


def test_call_based_argument_lists():
    spec = parse_reference({"tests": {"fn_name": "add", "inputs": [[1, 2], [[1], "a"]],
                                      "outputs": [3, ["x", None]]}})
    assert spec.style == "call"
    assert [(t.mode, t.fn_name, json.loads(t.args_json)) for t in spec.tests] == [
        ("call", "add", [1, 2]), ("call", "add", [[1], "a"])]
    assert [e.value for e in spec.expected] == [3, ["x", None]]
    assert all(e.kind == "equal" for e in spec.expected)


def test_call_based_livecodebench_json_lines():
    spec = parse_reference({"tests": json.dumps({
        "fn_name": "f", "inputs": ["[1,2]\n3", "\"ab\"\n[]\n"], "outputs": ["3", "\"abc\""]})})
    assert [json.loads(t.args_json) for t in spec.tests] == [[[1, 2], 3], ["ab", []]]
    assert [e.value for e in spec.expected] == [3, "abc"]


def test_call_based_string_output_in_direct_form_is_a_string():
    spec = parse_reference({"tests": {"fn_name": "f", "inputs": [["a"]], "outputs": ["3"]}})
    assert spec.expected[0].value == "3"  # not decoded: the inputs are argument lists


@pytest.mark.parametrize("table, field", [
    ({"fn_name": "f", "inputs": [[1], "2"], "outputs": [1, 2]}, "tests.inputs"),
    ({"fn_name": "f", "inputs": ["[1"], "outputs": ["1"]}, "tests.inputs[0]"),
    ({"fn_name": "f", "inputs": ["1"], "outputs": ["x y"]}, "tests.outputs[0]"),
    ({"fn_name": "f", "inputs": ["1"], "outputs": [1]}, "tests.outputs[0]"),
    ({"fn_name": "f(x)", "inputs": [[1]], "outputs": [1]}, "tests.fn_name"),
])
def test_call_based_bad_tables_name_the_field(table, field):
    with pytest.raises(InvalidReference, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_reference({"tests": table})


def test_call_based_needs_python():
    with pytest.raises(InvalidReference, match="tests.fn_name"):
        parse_reference({"tests": {"fn_name": "f", "inputs": [[1]], "outputs": [1]},
                         "language": "cpp"})


# ----------------------------------------------------------------------------- bad references


@pytest.mark.parametrize("reference, field", [
    ({}, "exactly one of"),
    ({"tests": {"inputs": ["1"], "outputs": ["1"]}, "test_code": "assert f()"},
     "exactly one of"),
    ({"tests": {"inputs": [], "outputs": []}}, "tests.inputs"),
    ({"tests": {"outputs": ["1"]}}, "tests.inputs"),
    ({"tests": {"inputs": ["1"]}}, "tests.outputs"),
    ({"tests": {"inputs": ["1", "2"], "outputs": ["1"]}}, "tests.outputs"),
    ({"tests": "{not json"}, "'tests'"),
    ({"input_output": "[1, 2]"}, "'input_output'"),
    ({"input_output": "{\"inputs\": [1], \"outputs\": [\"1\"]}"}, "input_output.inputs"),
    ({"tests": {"inputs": ["1"], "outputs": [1]}}, "tests.outputs"),
    ({"tests": {"inputs": ["1"], "outputs": ["1"]}, "language": "rust"}, "language"),
    ({"test_code": "   "}, "test_code"),
    ({"test_code": "assert f(1) ==\n"}, "test_code"),
    ({"test_code": "x = 1\n"}, "test_code"),
    ({"test_code": "def check(candidate):\n    assert candidate(1) == 2\n"}, "entry_point"),
    ({"test_code": "assert f(1) == 2", "entry_point": 3}, "entry_point"),
    ({"test_code": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f(1)"},
     "entry_point"),
    ({"test_code": "assert f(1) == 2", "language": "javascript"}, "test_code"),
])
def test_bad_references_raise_naming_the_field(reference, field):
    with pytest.raises(InvalidReference, match=field.replace("[", r"\[")):
        parse_reference(reference)


# ----------------------------------------------------------------------------- asserts


def lifted(test_code: str, entry_point: str | None = None):
    reference = {"test_code": test_code}
    if entry_point is not None:
        reference["entry_point"] = entry_point
    spec = parse_reference(reference)
    exprs = [(t.expr, e) for t, e in zip(spec.tests, spec.expected) if t.mode == "expr"]
    scripts = [t.script for t in spec.tests if t.mode == "script"]
    return spec, exprs, scripts


def test_mbpp_asserts_are_lifted_with_literal_expected_values():
    code = ("assert f(1) == 2\nassert f(-1) == -2\nassert g('a') == 'A'\n"
            "assert h() == (1, [2, 3])\nassert k() == {'a': None, 'b': True}\n"
            "assert -4.5 == f(2)\n")
    spec, exprs, scripts = lifted(code)
    assert [e for e, _ in exprs] == ["f(1)", "f(-1)", "g('a')", "h()", "k()", "f(2)"]
    assert [x.value for _, x in exprs] == [2, -2, "A", [1, [2, 3]], {"a": None, "b": True},
                                            -4.5]
    assert all(x.kind == "equal" for _, x in exprs)
    assert scripts == [] and (spec.lifted, spec.script, spec.style) == (6, 0, "assert")
    assert exprs[0][1].source == "assert f(1) == 2"


def test_test_code_as_a_list_of_asserts():
    spec = parse_reference({"test_code": ["assert f(1) == 2", "assert f(2) == 4"]})
    assert spec.lifted == 2


def test_humaneval_check_candidate_uses_the_entry_point():
    code = ("\n\nMETADATA = {'author': 'jt'}\n\n\ndef check(candidate):\n"
            "    assert candidate([1, 2], 0.3) == True\n"
            "    assert candidate([]) == []\n"
            "    assert True, 'This prints if this assert fails'\n")
    spec, exprs, scripts = lifted(code, "has_close_elements")
    assert [e for e, _ in exprs] == ["has_close_elements([1, 2], 0.3)",
                                     "has_close_elements([])"]
    assert [x.value for _, x in exprs] == [True, []]
    assert scripts == [] and spec.lifted == 2  # `assert True` is not a test
    assert "METADATA" in spec.setup


def test_humaneval_check_called_by_the_test_code():
    code = "def check(candidate):\n    assert candidate(2) == 4\n\ncheck(square)\n"
    _, exprs, scripts = lifted(code)
    assert exprs[0][0] == "square(2)" and scripts == []
    _, exprs, _ = lifted(code, "other")  # the reference's entry_point wins
    assert exprs[0][0] == "other(2)"


def test_humaneval_check_with_other_parameter_name_and_main_guard():
    code = ("def check(fn):\n    assert fn(2) == 4\n\n"
            "if __name__ == '__main__':\n    check(square)\n")
    _, exprs, scripts = lifted(code)
    assert exprs[0][0] == "square(2)" and scripts == []


def test_humaneval_loop_stays_in_a_script_calling_check():
    code = ("def check(candidate):\n    import random\n    assert candidate(0, 1) == 1\n"
            "    for i in range(100):\n        x = random.randint(0, 9)\n"
            "        assert candidate(x, 1) == x + 1\n    assert True\n")
    spec, exprs, scripts = lifted(code, "add")
    assert [e for e, _ in exprs] == ["add(0, 1)"]
    assert (spec.lifted, spec.script, spec.script_asserts) == (1, 1, 1)
    assert "import random" in spec.setup
    assert scripts[0].startswith("def check(candidate):\n    for i in range(100):")
    assert scripts[0].rstrip().endswith("check(add)")
    assert spec.expected[-1].kind == "completed"


def test_check_used_by_the_test_code_itself_is_left_alone():
    code = ("def check(candidate):\n    assert candidate(1) == 1\n\n"
            "for f in (a, b):\n    check(f)\n")
    spec, exprs, scripts = lifted(code)
    assert exprs == [] and "def check" in spec.setup and "check(f)" in scripts[0]


def test_assert_truthiness_and_negation_expect_exact_booleans():
    _, exprs, _ = lifted("assert is_prime(7)\nassert not is_prime(8)\n"
                         "assert Solution().isValid('()')\n")
    assert [(e, x.value) for e, x in exprs] == [("is_prime(7)", True), ("is_prime(8)", False),
                                                ("Solution().isValid('()')", True)]


def test_truthiness_computed_by_builtins_or_test_helpers_stays_in_the_script():
    # the verdict of these is computed inside the sandbox, where the program can make it
    # True (patched builtins, objects whose comparisons always hold): not lifted
    code = ("def is_sorted(xs):\n    return all(a <= b for a, b in zip(xs, xs[1:]))\n"
            "assert is_sorted(sort([3, 1, 2]))\nassert all(x > 0 for x in f(3))\n"
            "assert isinstance(f(1), int)\nassert not any(f(2))\nassert f(1) and f(2)\n"
            "assert f\nassert f(3) == 3\n")
    spec, exprs, scripts = lifted(code)
    assert [e for e, _ in exprs] == ["f(3)"]
    assert (spec.lifted, spec.script_asserts) == (1, 6)
    assert "def is_sorted" in spec.setup


def test_tolerance_forms_are_lifted():
    code = ("import math\nassert math.isclose(area(2), 12.566, rel_tol=0.001)\n"
            "assert abs(mean([1.0, 2.0, 3.0]) - 2.0/3.0) < 1e-6\n"
            "assert abs(0.5 - half()) <= 1e-9\nassert 1e-3 > abs(x() - 1)\n")
    spec, exprs, _ = lifted(code)
    assert [e for e, _ in exprs] == ["area(2)", "mean([1.0, 2.0, 3.0])", "half()", "x()"]
    first, second, third, fourth = (x for _, x in exprs)
    assert (first.kind, first.value, first.op, first.rel_tol, first.abs_tol) == (
        "close", 12.566, "isclose", 0.001, 0.0)
    assert (second.op, second.abs_tol) == ("<", 1e-6) and second.value == 2.0 / 3.0
    assert (third.op, third.value) == ("<=", 0.5)
    assert (fourth.op, fourth.value, fourth.abs_tol) == ("<", 1, 1e-3)
    assert spec.setup == "import math"


def test_order_membership_and_identity_forms():
    code = ("assert f(1) < 5\nassert 5 >= f(2)\nassert f(3) != 'x'\nassert f(4) in [1, 2]\n"
            "assert f(5) not in 'abc'\nassert f(6) is None\nassert f(7) is True\n")
    _, exprs, scripts = lifted(code)
    assert [(x.kind, x.op, x.value) for _, x in exprs] == [
        ("order", "<", 5), ("order", "<=", 5), ("order", "!=", "x"),
        ("member", "in", [1, 2]), ("member", "not in", "abc"), ("equal", "", None),
        ("equal", "", True)]
    assert scripts == []


def test_non_liftable_asserts_go_to_one_script_and_lifting_goes_on():
    code = ("assert set(f(2)) == set((1, 2))\nassert f(1) == g(1)\nassert 0 < f(3) < 9\n"
            "assert f(4) == {1, 2}\nassert f(5) == 1+2j\nassert f(6) == {1: 'a'}\n"
            "assert (y := f(7)) == 1\nassert f(8) == 8\n")
    spec, exprs, scripts = lifted(code)
    assert exprs == []  # the walrus assert starts the script: everything after it runs there
    assert (spec.lifted, spec.script, spec.script_asserts) == (0, 1, 8)
    code = "assert set(f(2)) == set((1, 2))\nassert f(8) == 8\n"
    spec, exprs, scripts = lifted(code)
    assert [e for e, _ in exprs] == ["f(8)"]
    assert scripts == ["assert set(f(2)) == set((1, 2))"]


def test_setup_before_the_first_assert_is_hoisted_and_later_assignments_are_not():
    code = ("import math\nfrom collections import Counter\nK = 3\ndef helper(x):\n"
            "    return x * 2\nassert f(K) == 6\nK = 4\nassert f(K) == 8\n")
    spec, exprs, scripts = lifted(code)
    assert spec.setup.splitlines()[:3] == ["import math", "from collections import Counter",
                                           "K = 3"]
    assert "def helper" in spec.setup
    assert [e for e, _ in exprs] == ["f(K)"]
    assert scripts == ["K = 4\nassert f(K) == 8"]


def test_constant_asserts_are_not_tests():
    spec, exprs, scripts = lifted("assert True\nassert 1 == 1\nassert f() == 1\n")
    # `assert 1 == 1` has no expression to evaluate: it is left to the script
    assert [e for e, _ in exprs] == ["f()"] and scripts == ["assert 1 == 1"]


# ----------------------------------------------------------------------------- stdout rules


def test_stdout_lines_default():
    assert stdout_equal(b"3  \n4\n\n\n", "3\n4")
    assert stdout_equal(b"3\r\n4\r\n", "3\n4\n")
    assert not stdout_equal(b" 3\n4\n", "3\n4\n")  # leading whitespace matters
    assert not stdout_equal(b"3\n\n4\n", "3\n4\n")  # inner blank lines matter
    assert not stdout_equal(b"3 4\n", "3\n4\n")


def test_stdout_exact():
    assert stdout_equal(b"3\n", "3\n", "exact")
    assert not stdout_equal(b"3", "3\n", "exact")
    assert not stdout_equal(b"3 \n", "3\n", "exact")


def test_stdout_tokens():
    assert stdout_equal(b"1   2\n3\n", "1 2 3", "tokens")
    assert not stdout_equal(b"1 2 3 4", "1 2 3", "tokens")


@pytest.mark.parametrize("mode", ["exact", "lines", "tokens"])
def test_stdout_is_never_lowercased(mode):
    assert not stdout_equal(b"YES\n", "yes\n", mode)
    assert not stdout_equal(b"Yes\n", "YES\n", mode, None)


@pytest.mark.parametrize("mode", ["lines", "tokens"])
def test_stdout_is_not_a_set_of_tokens(mode):
    assert not stdout_equal(b"2 1\n", "1 2\n", mode)
    assert not stdout_equal(b"1 1 2\n", "1 2\n", mode)
    assert not stdout_equal(b"1 2 2\n", "1 1 2\n", mode, 1e-6)


def test_stdout_invalid_utf8_is_replaced_not_an_error():
    assert not stdout_equal(b"\xff\n", "x\n")
    assert stdout_equal(b"\xff\n", "\ufffd\n")


def test_float_tolerance():
    assert not stdout_equal(b"0.3333333\n", "0.333333333\n")
    assert stdout_equal(b"0.3333333\n", "0.333333333\n", "lines", 1e-6)
    assert stdout_equal(b"x 0.3333333\n", "x   0.333333333\n", "lines", 1e-6)
    assert stdout_equal(b"1.0000001e9", "1e9", "tokens", 1e-6)  # relative above 1
    assert not stdout_equal(b"0.5\n", "0.6\n", "lines", 1e-6)
    assert not stdout_equal(b"1000001\n", "1000000\n", "tokens", 1e-3)  # integers: as written
    assert stdout_equal(b"1000000.5\n", "1000000\n", "tokens", 1e-6)
    assert not stdout_equal(b"nan\n", "nan0\n", "tokens", 1e-6)
    assert not tokens_equal("1_000.0", "1000.0", 1e-6)  # not a decimal number token
    assert not stdout_equal(b"0.3333333 1\n", "0.333333333\n", "lines", 1e-6)


# ----------------------------------------------------------------------------- value rules


def test_values_structural_equality():
    assert values_equal([1, [2, 3]], (1, (2, 3)))  # tuples and lists are the same
    assert values_equal(1.0, 1) and values_equal(1, 1.0)
    assert not values_equal("3", 3) and not values_equal(3, "3")
    assert not values_equal(True, 1) and not values_equal(1, True)
    assert not values_equal(0, False) and values_equal(False, False)
    assert not values_equal(None, 0) and values_equal(None, None)
    assert values_equal({"a": [1]}, {"a": (1,)})
    assert not values_equal({"a": 1}, {"a": 1, "b": 2})
    assert not values_equal([1, 2], [1, 2, 3])
    assert not values_equal("abc", "ABC")
    assert values_equal(float("nan"), float("nan"))
    assert values_equal(10 ** 30, 10 ** 30) and not values_equal(10 ** 30 + 1, 1e30)


def test_values_float_tolerance():
    assert not values_equal(0.1 + 0.2, 0.3)
    assert values_equal(0.1 + 0.2, 0.3, 1e-9)
    assert values_equal([0.30000001], [0.3], 1e-6)
    assert not values_equal(3, 4, 0.5)  # two ints: exact even with a tolerance
    assert not values_equal("0.3", 0.3, 1e-6)


def test_value_meets_other_forms():
    assert value_meets(4, Expectation("order", 5, op="<"))
    assert not value_meets(5, Expectation("order", 5, op="<"))
    assert not value_meets("4", Expectation("order", 5, op="<"))  # no coercion
    assert not value_meets(True, Expectation("order", 5, op="<"))
    assert value_meets("a", Expectation("order", "b", op="<="))
    assert value_meets(3, Expectation("order", "3", op="!="))
    assert value_meets(2, Expectation("member", [1, 2.0], op="in"))
    assert not value_meets(True, Expectation("member", [1], op="in"))
    assert value_meets("bc", Expectation("member", "abc", op="in"))
    assert not value_meets(1, Expectation("member", "abc", op="in"))
    assert value_meets(7, Expectation("member", [1], op="not in"))
    close = Expectation("close", 2.0 / 3.0, op="<", abs_tol=1e-6)
    assert value_meets(0.6666667, close) and not value_meets(0.6667, close)
    assert not value_meets("0.6666667", close) and not value_meets(None, close)
    assert not value_meets(10 ** 400, close)  # beyond float range: not close, no crash
    isclose = Expectation("close", 12.566, op="isclose", rel_tol=1e-3)
    assert value_meets(4 * math.pi, isclose) and not value_meets(12.6, isclose)
    assert value_meets(True, Expectation("equal", True))


# ----------------------------------------------------------------------------- issue 28


def test_test_code_is_never_parsed_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 6: 6 MB of test_code through ast.parse took +3.7 GB of worker memory. The lifting
    runs in the sandbox: here, parsing or compiling anything is an error, and it still works."""
    import ast
    import builtins

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("untrusted code parsed outside the sandbox")

    monkeypatch.setattr(ast, "parse", refused)
    monkeypatch.setattr(builtins, "compile", refused)
    spec, exprs, _ = lifted("def check(candidate):\n    assert candidate(1) == 2\n", "f")
    assert [e for e, _ in exprs] == ["f(1)"] and spec.lifted == 1


def test_test_code_too_big_to_parse_in_its_limits_is_an_invalid_reference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lifting run is held to REWARDD_SANDBOX_PARSE_MEMORY_MB: past it, the test code
    is the reference's fault, and this process's memory does not grow by the parse."""
    import resource

    from rewardd.verifiers.code.settings import sandbox_settings
    monkeypatch.setenv("REWARDD_SANDBOX_PARSE_MEMORY_MB", "64")
    sandbox_settings.cache_clear()
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        code = "".join(f"assert f({i}) == [{i}, {i} + 1, ({i},)]\n" for i in range(120_000))
        with pytest.raises(InvalidReference, match="'test_code' could not be read within the "
                                                   "limits of its parsing run"):
            parse_reference({"test_code": code})
        grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown_kb < 100 * 1024, grown_kb
    finally:
        monkeypatch.delenv("REWARDD_SANDBOX_PARSE_MEMORY_MB")
        sandbox_settings.cache_clear()


def test_an_unreadable_entry_point_is_named_by_the_lifting_run() -> None:
    with pytest.raises(InvalidReference, match="'entry_point' must be a function name"):
        lifted("def check(candidate):\n    assert candidate(1) == 2\n", "1 +")
