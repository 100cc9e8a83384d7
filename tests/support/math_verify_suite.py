"""Rebuild ``tests/data/math_verify_suite.jsonl`` from math-verify's own regression tests.

math-verify (https://github.com/huggingface/Math-Verify) asserts curated (gold, prediction,
expected) triples in ``pytest.mark.parametrize`` tables. This script reads those tables as
data (Python's ``ast``, literals only: no code of theirs is run or copied) from a checkout
and writes one labelled case per triple, with its source (file, test, row index, commit).

Kept: the rows compared with math-verify's default options (``precision`` 6, ``strict``,
no ``allow_set_relation_comp``). Dropped and relabelled rows are listed below with their
reason (``tests/data/README.md`` says the same). Run::

    git -C <mirror> show HEAD:tests/<file> ...  # or a checkout
    .venv/bin/python -m tests.support.math_verify_suite <checkout>/tests <commit>
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "math_verify_suite.jsonl"

RELABEL = {
    ("test_all.py", "test_latex_notation", 5):
        "math-verify's span regex stops at a line break inside $..$; the answer 9 is stated, "
        "so the field (and rewardd's extraction) accepts it",
    ("test_all.py", "test_latex_notation", 6):
        "as above, with \\( .. \\) over three lines",
    ("test_all.py", "test_set_rel_assymetry", 3):
        "an inequality against its interval: math-verify accepts it only under its option "
        "allow_set_relation_comp (the same table asserts 1 with it on, and 1 the other way "
        "round by default); rewardd's lenient default reads x in [-2, 7] as -2 <= x <= 7",
    ("test_yujianll.py", "test_string_extraction", 9):
        "1 + 1/e is not 1 - 1/e; math-verify's label records its own false positive",
}
"""Rows whose label follows a math-verify convention the rest of the field does not share:
the label is flipped (the note says why)."""

DROP = {
    ("test_numina_cases.py", "test_numina_cases", 24):
        "the gold is malformed (an unclosed box, '\\\\' line breaks) and names W(n) where the "
        "prediction names W(x): the label depends on reading right-hand sides only",
    ("test_all.py", "test_complex_math_expressions", 4):
        "both sides hold a form feed where \\frac was meant (a '\\f' escape in a non-raw "
        "string literal): the row only asserts that an unparseable string equals itself",
}


def _options_are_default(row: dict) -> bool:
    return (row.get("precision", 6) == 6 and row.get("strict", True) is True
            and not row.get("allow_set_relation_comp", False))


def rows(tests: Path):
    for path in sorted(tests.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for dec in fn.decorator_list:
                if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                    continue
                names = [s.strip() for s in ast.literal_eval(dec.args[0]).split(",")]
                if "gold" not in names or "pred" not in names:
                    continue
                for index, element in enumerate(dec.args[1].elts):
                    try:
                        values = ast.literal_eval(element)
                    except ValueError:
                        continue  # computed at import time (an f-string of math.sqrt): not data
                    yield path.name, fn.name, index, dict(zip(names, values))


def main(tests: Path, commit: str) -> None:
    cases, seen = [], set()
    for file, test, index, row in rows(tests):
        key = (file, test, index)
        if key in DROP or not _options_are_default(row):
            continue
        if (row["pred"], row["gold"]) in seen:
            continue  # the same pair asserted twice (their tables repeat a few rows)
        seen.add((row["pred"], row["gold"]))
        expected = bool(row.get("expected", row.get("result")))
        note = "math-verify's label"
        if key in RELABEL:
            expected, note = not expected, "relabelled: " + RELABEL[key]
        cases.append({"id": f"mv-{len(cases) + 1:03d}", "class": test,
                      "prediction": row["pred"], "reference": row["gold"],
                      "expected": expected, "note": note,
                      "source": f"huggingface/Math-Verify@{commit[:12]}:tests/{file}::{test}[{index}]"})
    OUT.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases))
    print(f"{len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
