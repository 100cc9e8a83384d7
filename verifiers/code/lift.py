"""Assert-style test code, lifted into values to judge and a script to run: the program
that does it INSIDE the sandbox.

Why a sandboxed program and not a function of the worker: the test code is the tenant's
text, and parsing it is not cheap: ``ast.parse`` of 6 MB of Python took +3.7 GB of worker
memory and more than 30 s (issue 28, row 6). So this module is sent, as source, to the
sandbox as an ordinary Python run (``Program("python", SOURCE, ...)``) under the run's own
time and memory limits; it reads ``{"code", "entry_point"}`` as JSON on stdin and prints
the lifted spec as JSON (or ``{"error": ...}``), which the grader reads as data
(:func:`rewardd.verifiers.code.spec.parse_reference`). It imports nothing but the standard
library (the sandbox has no ``rewardd``), and is importable for tests.

The lifting is trusted code on untrusted text, and nothing of the rollout's program takes
part: the run holds no solution, only this program and the reference's test code (which
is never executed here, only parsed). Its output can be no worse than the reference
itself, which the tenant wrote anyway.
"""

from __future__ import annotations

import ast
import builtins
import copy
import json
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any


class LiftError(Exception):
    """The test code cannot be read: the reference's fault (``invalid_reference``)."""


@dataclass(frozen=True, slots=True)
class Expectation:
    """What one test's result must be; built from the reference, never sent to the sandbox
    of the solution (this program builds assert-style ones and sends them back as JSON).

    ``stdout``: the output matches ``value`` (text) under the stdout rules. ``equal``: the
    value equals ``value``. ``order``: ``got <op> value`` with ``op`` one of ``<``, ``<=``,
    ``>``, ``>=``, ``!=``. ``member``: ``got in value`` (``op`` is ``in`` or ``not in``).
    ``close``: with ``op`` ``isclose``, ``math.isclose(got, value, rel_tol, abs_tol)``; with
    ``op`` ``<`` or ``<=`` (the ``abs(x - c) < tol`` form), ``|got - value| op abs_tol``;
    ``got`` must be a number. ``completed``: a ``script`` test ran to its end. ``source`` is
    the assert it came from (for ``detail``). The value is shared by every call that uses a
    cached spec: it is never mutated. ``kind`` is one of
    :data:`~rewardd.verifiers.code.compare.ExpectationKind`.
    """

    kind: str
    value: Any = None
    op: str = ""
    rel_tol: float = 0.0
    abs_tol: float = 0.0
    source: str = ""

    def sourced(self, source: str) -> Expectation:
        return replace(self, source=source)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """``(True, value)`` when ``node`` is a literal (``ast.literal_eval``), or arithmetic
    (``+ - * /``, unary ``-``/``+``) on int/float literals such as ``2.0/3.0``; else
    ``(False, None)``. Evaluated here, by this program, never in the solution's run."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return True, _fold(node)
    except (ValueError, ArithmeticError, RecursionError):
        return False, None


def _fold(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _fold(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult,
                                                            ast.Div)):
        left, right = _fold(node.left), _fold(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            if abs(left) > 1e300 or abs(right) > 1e300:  # keep literal products small
                raise ValueError("too large")
            return left * right
        return left / right
    raise ValueError("not a literal")


def _jsonable(value: Any) -> bool:
    """Can a program's value, sent back as JSON, ever equal this literal? (No sets, bytes,
    complex numbers or non-string keys: those asserts stay in the script.)"""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}
_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.NotEq: "!=",
        ast.Eq: "==", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


def _is_close_call(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "isclose") or (
        isinstance(func, ast.Attribute) and func.attr == "isclose"
        and isinstance(func.value, ast.Name) and func.value.id == "math")


def _is_abs_call(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords and (
        (isinstance(func, ast.Name) and func.id in ("abs", "fabs")) or (
            isinstance(func, ast.Attribute) and func.attr == "fabs"
            and isinstance(func.value, ast.Name) and func.value.id == "math")))


def _split_literal(left: ast.expr, right: ast.expr) -> tuple[ast.expr, Any, bool] | None:
    """``(expression, literal value, literal_was_on_the_left)`` when exactly one side is a
    literal, else None."""
    left_lit, left_value = _literal(left)
    right_lit, right_value = _literal(right)
    if right_lit and not left_lit:
        return left, right_value, False
    if left_lit and not right_lit:
        return right, left_value, True
    return None


def _lift_isclose(call: ast.Call) -> tuple[ast.expr, Expectation] | None:
    if len(call.args) != 2 or any(k.arg not in ("rel_tol", "abs_tol") for k in call.keywords):
        return None
    tolerances = {"rel_tol": 1e-9, "abs_tol": 0.0}
    for keyword in call.keywords:
        ok, value = _literal(keyword.value)
        if not ok or not _is_number(value) or value < 0:
            return None
        tolerances[keyword.arg] = float(value)  # type: ignore[index]
    split = _split_literal(call.args[0], call.args[1])
    if split is None or not _is_number(split[1]):
        return None
    return split[0], Expectation("close", split[1], op="isclose", **tolerances)


def _lift_abs_difference(node: ast.Compare) -> tuple[ast.expr, Expectation] | None:
    """``abs(E - c) < tol`` (also ``<=``, ``abs(c - E)``, ``tol > abs(E - c)``)."""
    op = _OPS.get(type(node.ops[0]))
    left, right = node.left, node.comparators[0]
    if _is_abs_call(right) and op in (">", ">="):
        left, right, op = right, left, _FLIP[op]
    if op not in ("<", "<=") or not _is_abs_call(left):
        return None
    inner = left.args[0]  # type: ignore[attr-defined]
    ok, tol = _literal(right)
    if not ok or not _is_number(tol) or not isinstance(inner, ast.BinOp) \
            or not isinstance(inner.op, ast.Sub):
        return None
    split = _split_literal(inner.left, inner.right)
    if split is None or not _is_number(split[1]):
        return None
    return split[0], Expectation("close", split[1], op=op, abs_tol=float(tol))


def _lift_compare(node: ast.Compare) -> tuple[ast.expr, Expectation] | None:
    if len(node.ops) != 1:
        return None  # chains (0 < f(x) < 5) stay in the script
    close = _lift_abs_difference(node)
    if close is not None:
        return close
    op = _OPS.get(type(node.ops[0]))
    right = node.comparators[0]
    if op in ("in", "not in"):
        ok, container = _literal(right)
        left_ok, _ = _literal(node.left)
        if not ok or left_ok or not isinstance(container, (list, tuple, set, frozenset, dict,
                                                           str)):
            return None
        items = container if isinstance(container, str) else list(container)
        if not _jsonable(items):
            return None
        return node.left, Expectation("member", items, op=op)
    split = _split_literal(node.left, right)
    if split is None or not _jsonable(split[1]):
        return None
    expr, value, flipped = split
    if op == "==":
        return expr, Expectation("equal", value)
    if op == "is" and (value is None or isinstance(value, bool)):
        return expr, Expectation("equal", value)
    if op in _FLIP and (op == "!=" or _is_number(value) or isinstance(value, str)):
        return expr, Expectation("order", value, op=_FLIP[op] if flipped else op)
    return None


def _is_program_call(node: ast.expr, test_names: frozenset[str]) -> bool:
    """A call whose function is the program's own (``f(...)``, ``Solution().f(...)``): its
    root name is neither a builtin nor bound by the test code. Only such a call's result is
    the program's answer; ``all(...)``, ``isinstance(...)`` or a test helper such as
    ``is_sorted(f(x))`` compute the verdict inside the sandbox, where the program can make
    them return True (patched builtins, objects whose comparisons always hold), so those stay
    in the script."""
    if not isinstance(node, ast.Call):
        return False
    root = node.func
    while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
        root = root.value if not isinstance(root, ast.Call) else root.func
    return isinstance(root, ast.Name) and root.id not in test_names \
        and not hasattr(builtins, root.id)


def _lift(test: ast.expr, test_names: frozenset[str] = frozenset()
          ) -> tuple[ast.expr, Expectation] | None:
    """The expression to evaluate in the sandbox and what its value must be, for the assert
    forms this module lifts; None for anything else (it stays in the script).
    ``test_names``: the names the test code binds (its helpers are not the program)."""
    if isinstance(test, ast.Compare):
        return _lift_compare(test)
    if _is_close_call(test):
        return _lift_isclose(test)  # type: ignore[arg-type]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        if _is_program_call(test.operand, test_names):
            return test.operand, Expectation("equal", False)
        return None
    if _is_program_call(test, test_names):
        return test, Expectation("equal", True)
    return None


class _Substitute(ast.NodeTransformer):
    """Replace the check function's parameter (``candidate``) by the entry point."""

    def __init__(self, name: str, replacement: ast.expr) -> None:
        self.name, self.replacement = name, replacement

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id == self.name and isinstance(node.ctx, ast.Load):
            return ast.copy_location(copy.deepcopy(self.replacement), node)
        return node


def _is_trivia(stmt: ast.stmt) -> bool:
    """Docstrings, ``pass`` and ``assert True``: nothing to test (``assert True`` would be a
    free pass in every rollout's fraction, so it is not counted)."""
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True
    return isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) \
        and bool(stmt.test.value)


def _is_setup(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef, ast.Assign, ast.AnnAssign))


def _is_check_def(stmt: ast.stmt) -> bool:
    args = stmt.args if isinstance(stmt, ast.FunctionDef) else None
    return (isinstance(stmt, ast.FunctionDef) and stmt.name == "check"
            and not stmt.decorator_list and args is not None and len(args.args) == 1
            and not args.posonlyargs and not args.kwonlyargs and not args.vararg
            and not args.kwarg)


def _check_call_arg(stmt: ast.stmt) -> ast.expr | None:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) \
            and call.func.id == "check" and len(call.args) == 1 and not call.keywords:
        return call.args[0]
    return None


def _is_main_guard(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (its body is read as top-level test code)."""
    test = stmt.test if isinstance(stmt, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__" and not stmt.orelse)  # type: ignore


def _entry_point(text: str) -> ast.expr:
    """The entry point as an expression: a name, or a dotted name (``Solution().f`` no)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        node = None
    inner = node
    while isinstance(inner, ast.Attribute):
        inner = inner.value
    if not isinstance(inner, ast.Name):
        raise LiftError(f"code reference 'entry_point' must be a function name; got "
                               f"{text[:50]!r}")
    return node  # type: ignore[return-value]


def _bound_names(module: ast.Module) -> frozenset[str]:
    """Every name the test code binds anywhere (defs, classes, imports, assignments)."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            names.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return frozenset(names)


def _names(nodes: list[ast.stmt]) -> set[str]:
    return {n.id for stmt in nodes for n in ast.walk(stmt) if isinstance(n, ast.Name)}


@dataclass
class _Lifting:
    """Accumulates the result of reading one test file."""

    setup: list[ast.stmt]
    exprs: list[tuple[ast.expr, Expectation]]
    script: list[ast.stmt]


def _read_scope(body: list[ast.stmt], out: _Lifting, hoist_setup: bool,
                substitute: _Substitute | None, test_names: frozenset[str]
                ) -> list[ast.stmt]:
    """Lift the asserts of one scope (the module, or ``check``'s body), in order; return
    what must run as a script, in order.

    Imports are hoisted into the setup wherever they are. Other setup statements are hoisted
    only at module level and only before the first assert (``x = 1; assert f(x) == 2;
    x = 2; ...`` must not see the second value). Liftable asserts become expressions; an
    assert that cannot be lifted goes to the script and lifting goes on (an assert binds
    nothing; one with a ``:=`` is treated as a statement). The first other statement, and
    everything after it in the scope, goes to the script as well."""
    deferred: list[ast.stmt] = []
    seen_assert = False
    for index, stmt in enumerate(body):
        if _is_trivia(stmt):
            continue
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            out.setup.append(stmt)
            continue
        if hoist_setup and not seen_assert and _is_setup(stmt):
            out.setup.append(stmt)
            continue
        if not isinstance(stmt, ast.Assert) or any(
                isinstance(n, ast.NamedExpr) for n in ast.walk(stmt)):
            return deferred + [s for s in body[index:] if not _is_trivia(s)]
        seen_assert = True
        test = substitute.visit(copy.deepcopy(stmt.test)) if substitute else stmt.test
        lifted = _lift(test, test_names)
        if lifted is None:
            deferred.append(stmt)
            continue
        source = ast.unparse(ast.Assert(test=test, msg=None))[:200]
        out.exprs.append((lifted[0], lifted[1].sourced(source)))
    return deferred


def parse_test_code(code: str, entry_point: str | None) -> dict[str, Any]:
    """Assert-style tests: lift what can be judged as data, run the rest as a script.

    Lifted into an ``expr`` test, judged outside the sandbox on the expression's JSON value:
    ``assert E == L`` / ``L == E`` (``L`` anything ``ast.literal_eval`` reads that JSON can
    hold, or arithmetic on number literals such as ``2.0/3.0``; ``is None``/``is True``
    likewise); ``assert E`` (the value must be JSON ``true`` exactly: a truthy non-bool
    fails) and ``assert not E`` (``false`` exactly) when ``E`` is a call of the program's
    own function (not a builtin such as ``all``/``isinstance``, not a helper of the test
    code: those compute the verdict inside the sandbox); ``assert E <, <=, >, >=, != L``;
    ``assert E in L`` / ``not in L`` (a literal container); ``assert math.isclose(E, L, ...)``
    and ``assert abs(E - L) < tol`` (tolerances as written). Inside ``def check(candidate)``
    the parameter is replaced by the entry point (``entry_point``, else the argument of the
    test code's own ``check(f)`` call). ``assert True`` is ignored. Assert messages are
    ignored.

    Setup at the top of the test code (imports anywhere, and before the first assert:
    function and class definitions other than ``check``, assignments) is appended to the
    program's source, so it runs in the program's namespace before each expression.

    Everything else becomes ONE ``script`` test, the remaining code in its order, run after
    the program and passed only when it runs to its end: asserts of other forms (comparing
    two computed values, chained comparisons, sets), and from the first statement that is
    neither an assert nor hoistable setup (a loop, an ``if``, a call, an assignment after an
    assert) everything after it in its scope. This is the weaker mode: its asserts are
    evaluated inside the sandbox, by the program's own objects (an ``__eq__`` that is always
    true passes them), and the completion flag is produced in the untrusted process.
    ``Spec.lifted``/``script``/``script_asserts`` report the split.
    """
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError) as exc:  # MemoryError: past the run's limit
        raise LiftError(f"code reference 'test_code' is not valid Python: {exc}") \
            from None
    body: list[ast.stmt] = []
    for stmt in module.body:  # an `if __name__ == "__main__":` block is top-level test code
        body.extend(stmt.body if _is_main_guard(stmt) else [stmt])  # type: ignore[attr-defined]

    check = next((s for s in body if _is_check_def(s)), None)
    calls = [s for s in body if _check_call_arg(s) is not None]
    others = [s for s in body if s is not check and all(s is not c for c in calls)]
    if check is not None and "check" in _names(others):
        check = None  # the test code uses check itself: keep it as ordinary code
    if check is not None:
        body, candidate = others, None
        if entry_point is not None:
            candidate = _entry_point(entry_point)
        elif calls:
            candidate = _check_call_arg(calls[-1])
        if candidate is None:
            raise LiftError("code reference 'entry_point' is needed: 'test_code' "
                                   "defines check(candidate) but never calls it")

    out = _Lifting(setup=[], exprs=[], script=[])
    test_names = _bound_names(module)
    out.script.extend(_read_scope(body, out, hoist_setup=True, substitute=None,
                                  test_names=test_names))
    if check is not None:
        param = check.args.args[0].arg  # type: ignore[union-attr]
        remainder = _read_scope(check.body, out, hoist_setup=False,  # type: ignore[union-attr]
                                substitute=_Substitute(param, candidate),  # type: ignore
                                test_names=test_names - {param})
        if remainder:
            rest = copy.deepcopy(check)
            rest.body = remainder  # type: ignore[union-attr]
            out.script.append(rest)  # type: ignore[arg-type]
            out.script.append(ast.Expr(ast.Call(ast.Name("check", ast.Load()),
                                                [copy.deepcopy(candidate)], [])))
    return _assemble(out)


def _assemble(out: _Lifting) -> dict[str, Any]:
    runs: list[dict[str, Any]] = [{"mode": "expr", "expr": ast.unparse(expr)}
                                  for expr, _ in out.exprs]
    expected = [exp.as_dict() for _, exp in out.exprs]
    script_asserts = 0
    if out.script:
        module = ast.fix_missing_locations(ast.Module(body=out.script, type_ignores=[]))
        script_asserts = sum(isinstance(n, ast.Assert) for n in ast.walk(module))
        runs.append({"mode": "script", "script": ast.unparse(module)})
        expected.append(Expectation("completed", True,
                                    source="(test code run as a script)").as_dict())
    if not runs:
        raise LiftError("code reference 'test_code' has no tests (no assert and no "
                        "other test code)")
    setup = ast.unparse(ast.fix_missing_locations(ast.Module(body=out.setup,
                                                              type_ignores=[])))
    return {"runs": runs, "expected": expected, "setup": setup, "lifted": len(out.exprs),
            "script": 1 if out.script else 0, "script_asserts": script_asserts}


def main() -> None:
    """The sandbox run: stdin ``{"code", "entry_point"}``, stdout the lifted spec as JSON."""
    sys.set_int_max_str_digits(0)  # a big literal is a value like any other
    request = json.loads(sys.stdin.read())
    try:
        answer: dict[str, Any] = parse_test_code(request["code"], request.get("entry_point"))
    except LiftError as exc:
        answer = {"error": str(exc)}
    try:
        text = json.dumps(answer)
    except (ValueError, RecursionError) as exc:
        text = json.dumps({"error": f"code reference 'test_code' holds a value that cannot "
                                    f"be sent back: {exc}"})
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
