"""Side by side: rewardd's `math` verifier and math-verify 0.9.0 on every labelled math set.

Issue 17 asks for the comparison on the project's own labels, class by class: accuracy,
false positives (a wrong rollout rewarded) and false negatives (a correct rollout given 0,
learning signal lost). `bench_math.py` measures one set deeply (robustness, throughput);
this script measures breadth: every `tests/data/math_*.jsonl` file (the main set, the
held-back set, the real-output extraction set and any set added later), one table per file
and one over all of them.

math-verify runs with its defaults, as a trainer calls it: `verify(parse(gold),
parse(completion))`, the gold a bare reference wrapped in `\\boxed{}` as verl does (the
same convention as `bench_math.py`, whose helpers this script reuses). Cases with
non-default params are scored for rewardd only (math-verify has no such options) and
counted apart. Each call runs in a killable worker with a hard limit (`--timeout`), so a
hang or crash is a typed row, not a stuck benchmark.

Run: `.venv/bin/python tests/benchmarks/bench_math_side_by_side.py` (`--files A B` for
particular sets, `--json PATH` for the raw rows, `--verbose` to list every wrong case).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_math import (  # noqa: E402
    MV,
    RW,
    Case,
    load_cases,
    mv_gold,
    mv_task,
    rewardd_task,
    run_isolated,
    warm_up,
)

DATA = ROOT / "tests" / "data"


def score(cases: list[Case], timeout: float, gold_mode: str) -> list[dict[str, Any]]:
    """One row per case: the label and each tool's verdict (None: math-verify not run)."""
    rw = run_isolated(rewardd_task, [(c.prediction, c.reference, c.params) for c in cases],
                      timeout)
    default = [c for c in cases if not c.param_case]
    mv = iter(run_isolated(mv_task, [(mv_gold(c.reference, gold_mode), c.prediction)
                                     for c in default], timeout))
    rows = []
    for case, r in zip(cases, rw):
        m = None if case.param_case else next(mv)
        rows.append({"id": case.id, "class": case.cls, "expected": case.expected,
                     "param_case": case.param_case,
                     RW: bool(r.get("verdict")), f"{RW}_status": r["status"],
                     f"{RW}_error": r.get("error"),
                     MV: None if m is None else bool(m.get("verdict")),
                     f"{MV}_status": None if m is None else m["status"]})
    return rows


def tally(rows: list[dict[str, Any]], tool: str) -> dict[str, int]:
    """correct / false positives / false negatives / hang-crash-error over the rows scored."""
    counts = {"n": 0, "correct": 0, "fp": 0, "fn": 0, "failed": 0}
    for row in rows:
        verdict = row[tool]
        if verdict is None:
            continue
        counts["n"] += 1
        counts["correct"] += verdict == row["expected"]
        counts["fp"] += verdict and not row["expected"]
        counts["fn"] += row["expected"] and not verdict
        counts["failed"] += row[f"{tool}_status"] != "ok" or bool(row.get(f"{tool}_error"))
    return counts


def _pct(counts: dict[str, int]) -> str:
    return f"{100.0 * counts['correct'] / counts['n']:.1f}%" if counts["n"] else "-"


def table(title: str, rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: the totals, then per class rewardd's and math-verify's figures."""
    default = [r for r in rows if not r["param_case"]]
    lines = [f"## {title}", "",
             f"{len(default)} cases with default params (both tools); "
             f"{len(rows) - len(default)} with params (rewardd only).", "",
             "| tool | accuracy | correct | false positives | false negatives | hang / crash / error |",
             "|---|---:|---:|---:|---:|---:|"]
    for tool in (RW, MV):
        c = tally(default, tool)
        lines.append(f"| {tool} | {_pct(c)} | {c['correct']}/{c['n']} | {c['fp']} | {c['fn']} "
                     f"| {c['failed']} |")
    params = tally([r for r in rows if r["param_case"]], RW)
    if params["n"]:
        lines.append(f"| {RW} (params cases) | {_pct(params)} | {params['correct']}/{params['n']} "
                     f"| {params['fp']} | {params['fn']} | {params['failed']} |")
    lines += ["", "| class | n | rewardd acc | rewardd FP | rewardd FN | math-verify acc "
                  "| math-verify FP | math-verify FN |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    by_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in default:
        by_class[row["class"]].append(row)
    for name in sorted(by_class):
        rw, mv = tally(by_class[name], RW), tally(by_class[name], MV)
        lines.append(f"| {name} | {rw['n']} | {_pct(rw)} | {rw['fp']} | {rw['fn']} | {_pct(mv)} "
                     f"| {mv['fp']} | {mv['fn']} |")
    return lines + [""]


def wrong(rows: list[dict[str, Any]], tool: str) -> list[str]:
    return [f"{r['id']} ({r['class']}): label {r['expected']}, {tool} {r[tool]}"
            for r in rows if r[tool] is not None and r[tool] != r["expected"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="*", type=Path,
                        default=sorted(DATA.glob("math_*.jsonl")),
                        help="labelled sets (default: every tests/data/math_*.jsonl)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call")
    parser.add_argument("--mv-reference", choices=("boxed", "raw"), default="boxed",
                        help="math-verify's gold: the reference in \\boxed{} (verl) or as is")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--verbose", action="store_true", help="list every wrong case")
    args = parser.parse_args(argv)

    warm_up(args.mv_reference)
    everything: list[dict[str, Any]] = []
    out: list[str] = ["# rewardd vs math-verify 0.9.0 on the labelled math sets", ""]
    for path in args.files:
        rows = score(load_cases(path), args.timeout, args.mv_reference)
        for row in rows:
            row["file"] = path.name
        everything += rows
        out += table(path.name, rows)
        print(f"[{path.name}: {len(rows)} cases scored]", file=sys.stderr)
    out += table("all sets", everything)
    for tool in (RW, MV):
        missed = wrong(everything, tool)
        out.append(f"### {tool}: {len(missed)} wrong")
        out += [f"- {line}" for line in (missed if args.verbose else missed[:15])]
        if not args.verbose and len(missed) > 15:
            out.append(f"- ... {len(missed) - 15} more (--verbose lists all)")
        out.append("")
    print("\n".join(out))
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
