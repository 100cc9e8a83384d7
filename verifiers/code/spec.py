"""A code task's reference, parsed into the runs to make and the answers to expect.

The runs (:class:`~rewardd.verifiers.code.types.TestRun`) go into the sandbox; the expected answers
(:class:`~rewardd.verifiers.code.compare.Expectation`) never do: they stay in the grader, which
judges each run's output as data. Exactly one of these reference fields holds the tests:

``tests`` (an object, or a JSON string of one; the verl / SandboxFusion shape) or
``input_output`` (the same, as found in APPS/TACO-derived datasets, usually a JSON string):

* standard input/output: ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``. An input
  or output given as a list of strings is read as lines: joined with ``\\n`` plus a final
  ``\\n``.
* call-based, when ``fn_name`` is a non-empty string: ``{"fn_name": "f", "inputs": [[1, 2],
  ...], "outputs": [3, ...]}``, each input the list of arguments and each output the return
  value, as JSON values. The LiveCodeBench / verl form is also read: every input a STRING of
  JSON lines, one argument per non-blank line (``"[1,2]\\n3"`` is ``f([1, 2], 3)``), and then
  every output a JSON string (``"3"``, ``"\\"abc\\""``), decoded. The two forms are told
  apart by the inputs (all lists, or all strings); a mix is an invalid reference, as is any
  string that is not JSON, because a guess could silently test the wrong thing.

``test_code`` (a string, or a list of strings joined by newlines), with ``entry_point``
(HumanEval): assert-style tests (MBPP's ``assert f(1) == 2`` lines; HumanEval's ``def
check(candidate): assert candidate(...) == ...``, called by the test code as ``check(f)`` or,
when it is not, with ``entry_point``). See :func:`rewardd.verifiers.code.lift.parse_test_code`
for what is lifted into values judged outside the solution's sandbox and what remains a
``script``; the lifting itself runs in a sandbox run of its own (:func:`parse_test_code`), so
the test code is never parsed in a worker.

``language``: ``python`` (default), ``cpp`` or ``javascript`` (also ``py``, ``python3``,
``c++``, ``js``, ``node``); call-based and assert-style tests need Python.

``checker`` (stdin/stdout tests only): ``{"language": "python" | "cpp", "code": "..."}``, a
special judge that decides each test instead of comparing text
(:mod:`~rewardd.verifiers.code.checker`).

Unknown keys are refused, never ignored (a misspelt ``checker`` would otherwise grade by
exact match): inside ``tests``/``input_output`` (``inputs``, ``outputs``, ``fn_name``), inside
``checker``, and at the top level, where a group's one reference may also hold the keys of
the other verifiers scoring it (``answer`` for ``math``, ``rubric``...): the API refuses a
top-level key that none of the request's verifiers documents (``reference_fields``), a
worker (which sees only this verifier) one that no registered verifier documents
(:func:`~rewardd.verifiers.registry.registered_fields`).
:func:`unknown_keys` lists them with their paths; the API refuses them with a 422 before
anything runs.

A reference that cannot be read raises :class:`~rewardd.verifiers.base.InvalidReference` naming the
field (``tests.outputs``, ``input_output.inputs[3]``, ``test_code``, ``entry_point``...).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Literal, Mapping

from rewardd.verifiers.base import InvalidReference
from rewardd.verifiers.code import lift
from rewardd.verifiers.code.checker import CHECKER_KEYS, Checker, parse_checker
from rewardd.verifiers.code.compare import Expectation, decode
from rewardd.verifiers.code.sandbox import SandboxError, get_sandbox
from rewardd.verifiers.code.settings import sandbox_settings
from rewardd.verifiers.code.types import Language, Limits, Program, TestRun
from rewardd.verifiers.registry import registered_fields

Style = Literal["stdio", "call", "assert"]

_LANGUAGES: dict[str, Language] = {
    "python": "python", "python3": "python", "py": "python", "py3": "python",
    "cpp": "cpp", "c++": "cpp", "cxx": "cpp", "cc": "cpp",
    "javascript": "javascript", "js": "javascript", "node": "javascript",
    "nodejs": "javascript",
}
_TABLE_FIELDS = ("tests", "input_output", "test_code")
REFERENCE_KEYS = ("tests", "input_output", "test_code", "entry_point", "language", "checker",
                  "solution")
TABLE_KEYS = ("inputs", "outputs", "fn_name")
LIFT_SOURCE = Path(lift.__file__).read_text(encoding="utf-8")
"""The lifting program's source, run in the sandbox for each distinct test code."""
_LIFT_OUTPUT_BYTES = 64 << 20
"""stdout of the lifting run: the lifted spec's JSON (a few times the test code's size)."""


@dataclass(frozen=True, slots=True)
class Spec:
    """Everything the verifier needs from a reference; immutable, shared by a group's calls."""

    language: Language
    style: Style
    tests: tuple[TestRun, ...]
    expected: tuple[Expectation, ...]
    """One per test, same order."""
    setup: str = ""
    """Assert-style only: test code setup (imports, helpers, constants) appended to the
    program's source, so it runs in the program's namespace before each expression."""
    lifted: int = 0
    """Assert-style: asserts lifted into ``expr`` tests judged outside the sandbox."""
    script: int = 0
    """Assert-style: ``script`` tests (0 or 1): test code that could not be lifted."""
    script_asserts: int = 0
    """Assert statements inside the script (judged only by the script's completion)."""
    checker: Checker | None = None
    """The special judge that decides each stdio test, when the reference has one."""


# ---------------------------------------------------------------------------- language


def language_of(reference: Mapping[str, Any], override: Language | None = None) -> Language:
    """The reference's language (``python`` when absent), unless ``override`` is given."""
    if override is not None:
        return override
    value = reference.get("language")
    if value is None:
        return "python"
    if isinstance(value, str) and value.strip().lower() in _LANGUAGES:
        return _LANGUAGES[value.strip().lower()]
    raise InvalidReference(f"code reference 'language' must be one of python, cpp, "
                           f"javascript; got {str(value)[:50]!r}")


# ---------------------------------------------------------------------------- tables


def _decode_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidReference(f"code reference {where!r} is not valid JSON: {exc}") from None


# ---------------------------------------------------------------------------- keys


def _unknown(mapping: Mapping[str, Any], known: tuple[str, ...],
             where: tuple[str, ...]) -> list[tuple[tuple[str, ...], str]]:
    return [(where + (str(key),), f"code reference '{'.'.join(where + (str(key),))}' is not "
             f"a known key (known: {', '.join(known)})") for key in mapping if key not in known]


def _top_level(reference: Mapping[str, Any],
               shared: Collection[str]) -> list[tuple[tuple[str, ...], str]]:
    return [(path, message + (" (nor a key of this request's other verifiers)" if shared
                              else "")) for path, message in _unknown(reference, REFERENCE_KEYS, ())
            if path[0] not in shared]


def unknown_keys(reference: Any,
                 shared: Collection[str] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Every unknown key of a code reference, as (path, message): the top level (less the
    ``shared`` keys, those the request's other verifiers document), the tests table (also
    when given as a JSON string; one that is not JSON is left to the parser) and the
    checker. Shape errors other than unknown keys are not looked for here."""
    if not isinstance(reference, Mapping):
        return []
    found = _top_level(reference, shared)
    for name in ("tests", "input_output"):
        table = reference.get(name)
        if isinstance(table, str):
            try:
                table = json.loads(table)
            except (ValueError, RecursionError):
                continue
        if isinstance(table, Mapping):
            found += _unknown(table, TABLE_KEYS, (name,))
    checker = reference.get("checker")
    if isinstance(checker, Mapping):
        found += _unknown(checker, CHECKER_KEYS, ("checker",))
    return found


def _table(reference: Mapping[str, Any], name: str) -> dict[str, Any]:
    table = reference[name]
    if isinstance(table, str):
        table = _decode_json(table, name)
    if not isinstance(table, dict):
        raise InvalidReference(f"code reference {name!r} must be an object with 'inputs' and "
                               f"'outputs' (or a JSON string of one)")
    for _, message in _unknown(table, TABLE_KEYS, (name,))[:1]:
        raise InvalidReference(message)
    return table


def _io_lists(table: Mapping[str, Any], name: str) -> tuple[list[Any], list[Any]]:
    inputs, outputs = table.get("inputs"), table.get("outputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidReference(f"code reference '{name}.inputs' must be a non-empty list")
    if not isinstance(outputs, list):
        raise InvalidReference(f"code reference '{name}.outputs' must be a list")
    if len(inputs) != len(outputs):
        raise InvalidReference(f"code reference '{name}.inputs' has {len(inputs)} entries but "
                               f"'{name}.outputs' has {len(outputs)}")
    return inputs, outputs


def _text(value: Any, where: str) -> str:
    """A stdin/stdout entry: a string, or a list of lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "".join(line + "\n" for line in value)
    raise InvalidReference(f"code reference {where!r} must be a string (or a list of lines)")


def _stdio(table: Mapping[str, Any], name: str, language: Language) -> Spec:
    inputs, outputs = _io_lists(table, name)
    runs = tuple(TestRun(mode="stdio", stdin=_text(x, f"{name}.inputs[{i}]").encode(
        "utf-8", errors="replace")) for i, x in enumerate(inputs))  # a lone surrogate: "?"
    expected = tuple(Expectation("stdout", _text(y, f"{name}.outputs[{i}]"))
                     for i, y in enumerate(outputs))
    return Spec(language, "stdio", runs, expected)


def _json_lines(text: str, where: str) -> list[Any]:
    return [_decode_json(line, where) for line in text.split("\n") if line.strip()]


def _call(table: Mapping[str, Any], name: str, language: Language) -> Spec:
    fn_name = table["fn_name"]
    if language != "python":
        raise InvalidReference(f"code reference '{name}.fn_name': call-based tests need "
                               f"language python, not {language}")
    inputs, outputs = _io_lists(table, name)
    if all(isinstance(x, list) for x in inputs):
        args = inputs
        values = outputs
    elif all(isinstance(x, str) for x in inputs):  # LiveCodeBench: JSON lines, JSON outputs
        args = [_json_lines(x, f"{name}.inputs[{i}]") for i, x in enumerate(inputs)]
        values = []
        for i, y in enumerate(outputs):
            if not isinstance(y, str):
                raise InvalidReference(f"code reference '{name}.outputs[{i}]' must be a JSON "
                                       f"string when the inputs are JSON-lines strings")
            values.append(_decode_json(y, f"{name}.outputs[{i}]"))
    else:
        raise InvalidReference(f"code reference '{name}.inputs' must be all argument lists or "
                               f"all JSON-lines strings, not a mix")
    runs = tuple(TestRun(mode="call", fn_name=fn_name, args_json=json.dumps(a))
                 for a in args)
    expected = tuple(Expectation("equal", v) for v in values)
    return Spec(language, "call", runs, expected)


def _from_table(reference: Mapping[str, Any], name: str, language: Language) -> Spec:
    table = _table(reference, name)
    fn_name = table.get("fn_name")
    if fn_name in (None, ""):
        return _stdio(table, name, language)
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise InvalidReference(f"code reference '{name}.fn_name' must be a function name")
    return _call(table, name, language)


# ---------------------------------------------------------------------------- asserts


class TestCodeTimedOut(InvalidReference):
    """Reading the test code ran out of time: ``invalid_reference`` like any unreadable test
    code, but not cached (a busy machine may read it next time)."""

    __test__ = False


def _lift_limits() -> Limits:
    """The lifting run's limits (:mod:`~rewardd.verifiers.code.lift`): the operator's
    ceilings, the memory at most ``sandbox_parse_memory_mb``; stdout large enough for the
    lifted spec of the largest test code the API accepts."""
    ceilings = sandbox_settings()
    return Limits(cpu_s=min(ceilings.sandbox_max_time_s, 10.0),
                  wall_s=min(ceilings.sandbox_max_time_s, 20.0),
                  memory_mb=min(ceilings.sandbox_max_memory_mb,
                                ceilings.sandbox_parse_memory_mb),
                  processes=4, output_bytes=_LIFT_OUTPUT_BYTES)


def parse_test_code(code: str, entry_point: str | None) -> Spec:
    """Assert-style tests, lifted by :mod:`~rewardd.verifiers.code.lift` in a sandbox run of
    their own (see there for the rules): the test code is never parsed in this process.

    Raises InvalidReference when the test code cannot be read, also when reading it breaks
    the run's limits (the memory a huge file takes to parse), SandboxUnavailable where no
    code can run isolated."""
    request = json.dumps({"code": code, "entry_point": entry_point}).encode()
    program = Program("python", LIFT_SOURCE, (TestRun(mode="stdio", stdin=request),),
                      _lift_limits())
    [result] = get_sandbox().run(program)
    if result.status != "ok" or result.truncated:
        why = result.message or decode(result.stderr_tail).strip()[-200:] or result.status
        unreadable = TestCodeTimedOut if result.status == "timeout" else InvalidReference
        raise unreadable(f"code reference 'test_code' could not be read within the "
                               f"limits of its parsing run ({result.status}): {why}")
    try:
        lifted = json.loads(result.stdout)
    except ValueError as exc:
        raise SandboxError(f"the test code's lifting run answered malformed JSON: {exc}"
                           ) from None
    if "error" in lifted:
        raise InvalidReference(str(lifted["error"]))
    try:
        runs = tuple(TestRun(mode=r["mode"], expr=r.get("expr"), script=r.get("script"))
                     for r in lifted["runs"])
        expected = tuple(Expectation(**e) for e in lifted["expected"])
        return Spec("python", "assert", runs, expected, setup=lifted["setup"],
                    lifted=lifted["lifted"], script=lifted["script"],
                    script_asserts=lifted["script_asserts"])
    except (KeyError, TypeError) as exc:
        raise SandboxError(f"the test code's lifting run answered malformed JSON: {exc!r}"
                           ) from None


# ---------------------------------------------------------------------------- entry


def parse_reference(reference: Mapping[str, Any], language: Language | None = None) -> Spec:
    """The reference's tests (module rules); ``language`` overrides the reference's."""
    if not isinstance(reference, Mapping):
        raise InvalidReference("code reference must be an object")
    for _, message in _top_level(reference, registered_fields())[:1]:
        raise InvalidReference(message)
    present = [name for name in _TABLE_FIELDS if reference.get(name) is not None]
    if len(present) != 1:
        raise InvalidReference("code reference needs exactly one of 'tests', 'input_output' "
                               f"or 'test_code'; got {present or 'none'}")
    lang = language_of(reference, language)
    name = present[0]
    checker = reference.get("checker")
    if checker is not None:
        parsed = parse_checker(checker)
        spec = _from_table(reference, name, lang) if name != "test_code" else None
        if spec is None or spec.style != "stdio":
            raise InvalidReference("code reference 'checker' judges stdin/stdout tests only "
                                   f"('{name}' holds {spec.style if spec else 'assert'}-style "
                                   "tests)")
        return dataclasses.replace(spec, checker=parsed)
    if name != "test_code":
        return _from_table(reference, name, lang)
    if lang != "python":
        raise InvalidReference(f"code reference 'test_code': assert-style tests need "
                               f"language python, not {lang}")
    code = reference["test_code"]
    if isinstance(code, list) and all(isinstance(line, str) for line in code):
        code = "\n".join(code)
    if not isinstance(code, str) or not code.strip():
        raise InvalidReference("code reference 'test_code' must be a non-empty string (or a "
                               "list of strings)")
    entry_point = reference.get("entry_point")
    if entry_point is not None and (not isinstance(entry_point, str)
                                    or not entry_point.strip()):
        raise InvalidReference("code reference 'entry_point' must be a non-empty string")
    return parse_test_code(code, entry_point)


__all__ = ["REFERENCE_KEYS", "TABLE_KEYS", "Spec", "Style", "language_of", "parse_reference",
           "TestCodeTimedOut", "parse_test_code", "unknown_keys"]
