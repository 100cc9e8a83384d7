"""Benchmark: rewardd's `math` verifier vs math-verify 0.9.0 on tests/data/math_cases.jsonl.

Both tools, side by side in one run, on the labelled set (one JSON object a line: id, class,
prediction, reference, expected, note, optional params):

1. accuracy on the cases with default params: accuracy, false positives, false negatives,
   per class; rewardd alone on the cases with non-default params (math-verify has no such
   options); the `known_false_positive` class case by case; the cases each tool gets wrong;
2. robustness: every case once per tool in a killable worker process (pebble, one worker,
   a hard wall-clock limit per case, a fresh worker after a kill): slowest case, hangs,
   crashes; for rewardd also the production path (`rewardd.workers.embedded.EmbeddedExecutor`) on
   the adversarial cases, when it imports and runs;
3. throughput on one core, in-process, both tools warmed up, adversarial class excluded:
   (a) every case once, caches cleared before each case; (b) groups of 16 realistic rollouts
   sharing a reference, caches cleared before each group, so each tool keeps only what it
   gains within one group. "Caches" are rewardd's (`rewardd.verifiers.math.clear_caches()`, when the
   module has it) and math-verify's own small parse caches, cleared outside the timed region.

math-verify is used as a trainer uses it, with its defaults (its own signal timeouts
included): `verify(parse(gold), parse(completion))`, both parsed per rollout. The gold is
the reference wrapped in `\\boxed{}` as verl's math-verify reward does (a bare reference
such as `\\sqrt{2}` or `x^2+1` parses to nothing with math-verify's defaults);
`--mv-reference raw` passes the reference unchanged.

Run: `.venv/bin/python tests/benchmarks/bench_math.py` (`--quick` for a reduced run under a
minute, `--json PATH` for the raw figures, `--help` for the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import json
import logging
import multiprocessing
import os
import platform
import random
import re
import shlex
import statistics
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pebble
from pebble.common import ProcessExpired

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from math_verify import parse, verify  # noqa: E402
from math_verify import parser as _mv_parser  # noqa: E402

import rewardd.verifiers.math as rewardd_math  # noqa: E402
from rewardd.verifiers.base import Sample, run_verifier  # noqa: E402
from rewardd.verifiers.math import MathParams, MathVerifier  # noqa: E402

DEFAULT_CASES = ROOT / "tests" / "data" / "math_cases.jsonl"
KNOWN_FP_CLASS = "known_false_positive"
GROUP_SIZE = 16
RW, MV = "rewardd", "math-verify"

# math-verify logs a warning per internal timeout or parse failure; keep the tables readable.
for _name in ("math_verify", "latex2sympy2_extended"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)


# ------------------------------------------------------------------------------ cases


@dataclass
class Case:
    id: str
    cls: str
    prediction: str
    reference: str
    expected: bool
    note: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    param_case: bool = False


def is_param_case(params: dict[str, Any]) -> bool:
    """Non-default params (those equal to MathParams' defaults count as default)."""
    if not params:
        return False
    try:
        return MathParams.model_validate(params) != MathParams()
    except Exception:  # invalid params: rewardd reports the error; math-verify cannot run it
        return True


def load_cases(path: Path) -> list[Case]:
    cases, seen = [], set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            ref = raw["reference"]
            case = Case(id=str(raw["id"]), cls=str(raw.get("class", "unclassified")),
                        prediction=str(raw["prediction"]),
                        reference=ref if isinstance(ref, str) else json.dumps(ref),
                        expected=bool(raw["expected"]), note=str(raw.get("note") or ""),
                        params=dict(raw.get("params") or {}))
        except (ValueError, KeyError, TypeError) as exc:
            print(f"warning: {path}:{lineno} skipped ({type(exc).__name__}: {exc})",
                  file=sys.stderr)
            continue
        if case.id in seen:
            print(f"warning: {path}:{lineno} duplicate id {case.id!r}", file=sys.stderr)
        seen.add(case.id)
        case.param_case = is_param_case(case.params)
        cases.append(case)
    return cases


def stratified(cases: list[Case], limit: int) -> list[Case]:
    """The first ``limit`` cases taken round-robin over classes (file order within a class)."""
    if limit <= 0 or limit >= len(cases):
        return cases
    by_class: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        by_class[c.cls].append(c)
    picked: list[Case] = []
    queues = [list(v) for v in by_class.values()]
    while len(picked) < limit:
        for q in queues:
            if q and len(picked) < limit:
                picked.append(q.pop(0))
    keep = {id(c) for c in picked}
    return [c for c in cases if id(c) in keep]


# ------------------------------------------------------------------------------ the two tools

_VERIFIER: MathVerifier | None = None


def rewardd_verifier() -> MathVerifier:
    global _VERIFIER
    if _VERIFIER is None:
        _VERIFIER = MathVerifier()
    return _VERIFIER


def rewardd_call(completion: str, reference: str, params: dict[str, Any]) -> Any:
    return run_verifier(rewardd_verifier(), Sample(completion=completion),
                        {"answer": reference}, params)


def rewardd_true(outcome: Any) -> bool:
    return bool(outcome.ok) and outcome.reward == 1.0


def mv_gold(reference: str, mode: str) -> str:
    """The gold string math-verify parses: ``boxed`` wraps a bare reference as verl does."""
    if mode == "raw" or "$" in reference or re.search(r"\\(?:boxed|fbox)\b", reference):
        return reference
    return "\\boxed{" + reference + "}"


def mv_call(gold: str, completion: str) -> bool:
    return bool(verify(parse(gold), parse(completion)))


_MV_RESULT_CACHES = ("parse_latex_cached", "parse_expr_cached", "extract_latex")
_rewardd_clear = getattr(rewardd_math, "clear_caches", None)


def clear_rewardd() -> None:
    if _rewardd_clear is not None:
        _rewardd_clear()


def clear_mv() -> None:
    """math-verify's small result caches (lru of 20 parses); its regex caches stay warm."""
    for name in _MV_RESULT_CACHES:
        fn = getattr(_mv_parser, name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()


def _short(text: Any, limit: int = 160) -> Any:
    if isinstance(text, str) and len(text) > limit:
        return text[:limit] + "..."
    return text


def rewardd_task(completion: str, reference: str, params: dict[str, Any]
                 ) -> tuple[dict[str, Any], float]:
    """One rewardd verdict in a pool worker: plain data and the seconds it took."""
    started = time.perf_counter()
    outcome = rewardd_call(completion, reference, params)
    seconds = time.perf_counter() - started
    error = getattr(outcome.error, "value", outcome.error)
    detail = outcome.detail or {}
    return {"verdict": rewardd_true(outcome), "ok": bool(outcome.ok), "reward": outcome.reward,
            "error": None if error is None else str(error),
            "message": _short(detail.get("message")), "rule": detail.get("rule")}, seconds


def mv_task(gold: str, completion: str) -> tuple[dict[str, Any], float]:
    """One math-verify verdict in a pool worker (its own signal timeouts apply: main thread)."""
    started = time.perf_counter()
    try:
        parsed_gold = parse(gold)
        parsed_pred = parse(completion)
        verdict = bool(verify(parsed_gold, parsed_pred))
        error = None
    except Exception as exc:  # not expected with raise_on_error=False, but never lose a case
        verdict, parsed_gold, parsed_pred = False, [], []
        error = f"{type(exc).__name__}: {_short(str(exc))}"
    seconds = time.perf_counter() - started
    return {"verdict": verdict, "error": error, "gold_parsed": bool(parsed_gold),
            "pred_parsed": bool(parsed_pred)}, seconds


def warm_up(gold_mode: str) -> None:
    """Pay both tools' one-time costs (grammar build, regex compilation) before anything."""
    rewardd_verifier().warm_up()
    for ref, pred in (("\\frac{1}{2}", "so \\boxed{0.5}"), ("x^2+1", "\\boxed{1+x^2}"),
                      ("\\{1,2\\}", "\\boxed{\\{2,1\\}}"), ("[0,1)", "\\boxed{[0,1)}")):
        rewardd_call(pred, ref, {})
        mv_call(mv_gold(ref, gold_mode), pred)
    clear_rewardd()
    clear_mv()


# ------------------------------------------------------------------------------ robustness


def run_isolated(task: Callable[..., Any], arglists: list[tuple[Any, ...]], timeout: float
                 ) -> list[dict[str, Any]]:
    """Each call in a one-worker pebble pool with a hard wall-clock limit.

    pebble starts a task's clock when the worker picks it up, kills the worker at the limit
    and forks a fresh one (from this warmed-up process) for the next task.
    """
    pool = pebble.ProcessPool(max_workers=1, context=multiprocessing.get_context("fork"))
    futures = [pool.schedule(task, args=args, timeout=timeout) for args in arglists]
    results = []
    for fut in futures:
        try:
            result, seconds = fut.result()
            results.append({"status": "ok", "seconds": seconds, **result})
        except FutureTimeout:
            results.append({"status": "hang", "seconds": timeout, "verdict": False})
        except ProcessExpired as exc:
            results.append({"status": "crash", "seconds": None, "verdict": False,
                            "exitcode": exc.exitcode})
        except Exception as exc:  # pickling or pool failure: a crash of the harness, typed
            results.append({"status": "crash", "seconds": None, "verdict": False,
                            "exitcode": None, "message": f"{type(exc).__name__}: {exc}"})
    pool.close()
    pool.join(timeout=30)
    return results


def embedded_path(cases: list[Case], timeout: float) -> dict[str, Any]:
    """The production path: adversarial cases through EmbeddedExecutor, then one easy call
    to show the pool recovered. Any failure to import or run is reported, not raised."""
    try:
        from rewardd.workers.embedded import EmbeddedExecutor
        from rewardd.workers.executor import VerifyCall
    except Exception as exc:
        return {"ran": False, "reason": f"import failed: {type(exc).__name__}: {exc}"}
    executor = None
    try:
        started = time.perf_counter()
        executor = EmbeddedExecutor(pool_size=1)
        names = {f.name for f in dataclasses.fields(VerifyCall)}

        def one_sample_call(completion: str, reference: str, params: dict[str, Any]) -> Any:
            # VerifyCall takes `samples` (a tuple, one group per call) or, before, `sample`
            sample = Sample(completion=completion)
            kw = {"samples": (sample,)} if "samples" in names else {"sample": sample}
            return VerifyCall(verifier="math", reference={"answer": reference},
                              params=dict(params), timeout_s=timeout, **kw)

        calls = [one_sample_call(c.prediction, c.reference, c.params) for c in cases]
        calls.append(one_sample_call("\\boxed{42}", "42", {}))
        budget = timeout * len(calls) + 120  # never let an API change wedge the benchmark
        results = asyncio.run(asyncio.wait_for(executor.run(calls), budget))
        wall = time.perf_counter() - started
        def first(res: Any) -> Any:  # CallResult.items[0] (per-group API) or the result
            items = getattr(res, "items", None)
            return items[0] if isinstance(items, list) else res

        rows = []
        for case, res in zip(cases, results):
            out = first(res).outcome
            error = getattr(out.error, "value", out.error)
            rows.append({"id": case.id, "expected": case.expected, "ok": bool(out.ok),
                         "reward": out.reward, "error": None if error is None else str(error),
                         "elapsed_s": first(res).elapsed_s,
                         "message": _short((out.detail or {}).get("message"))})
        last = first(results[-1]).outcome
        return {"ran": True, "rows": rows, "wall_s": wall,
                "recovered": bool(last.ok and last.reward == 1.0)}
    except Exception as exc:
        return {"ran": False, "reason": f"{type(exc).__name__}: {_short(str(exc), 300)}"}
    finally:
        if executor is not None:
            try:
                executor.close()
            except Exception:
                pass


# ------------------------------------------------------------------------------ throughput

_REASONING = (
    lambda r: "We start by writing down what is given and what is asked.",
    lambda r: "Let $n = %d$; then $n + %d = %d$." % ((a := r.randint(2, 99)),
                                                    (b := r.randint(2, 99)), a + b),
    lambda r: "Multiplying both sides by $%d$ gives $%dx = %d$." % (
        (c := r.randint(2, 9)), c, c * r.randint(2, 50)),
    lambda r: "Simplifying, the expression reduces to $\\frac{%d}{%d}$ before the last step."
              % (r.randint(1, 40), r.randint(41, 90)),
    lambda r: "The discriminant $b^2 - 4ac = %d$ is positive, so there are two real roots."
              % r.randint(1, 200),
    lambda r: "Checking the boundary cases shows that nothing is lost.",
    lambda r: "A quick estimate gives roughly %d, which is consistent." % r.randint(10, 999),
    lambda r: "Grouping the terms pairwise, each pair contributes $%d$ to the sum."
              % r.randint(2, 30),
    lambda r: "Wait, let me double-check the sign in step %d. It is correct." % r.randint(2, 5),
)
_ANSWER_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer(?:\s+is)?\s*:?\s*", re.I)


def answer_tail(prediction: str) -> str:
    """The end of a completion: a prediction with its own \\boxed{} stays as written; a bare
    answer is stripped of prose and math delimiters and boxed."""
    if re.search(r"\\(?:boxed|fbox)\b", prediction):
        return prediction
    answer = _ANSWER_PREFIX.sub("", prediction.strip()).strip().rstrip(".").strip()
    while len(answer) >= 2 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    if not answer or len(answer) > 80 or "\n" in answer:
        return prediction
    return "Therefore, the final answer is $\\boxed{" + answer + "}$."


def realistic(rng: random.Random, prediction: str) -> str:
    sentences = [f(rng) for f in rng.sample(_REASONING, k=rng.randint(3, 5))]
    return " ".join(sentences) + "\n\n" + answer_tail(prediction)


@dataclass
class Group:
    reference: str
    cls: str
    completions: list[str]
    distinct_answers: int


def build_groups(cases: list[Case], size: int, seed: int) -> list[Group]:
    """One group per reference: about half the rollouts repeat one answer drawn from that
    reference's predictions; the rest are drawn from those and from other predictions of the
    same class (so more repeats happen), each with its own reasoning text."""
    by_ref: dict[str, list[Case]] = defaultdict(list)
    by_class: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        by_ref[c.reference].append(c)
        by_class[c.cls].append(c)
    groups = []
    for i, (ref, own_cases) in enumerate(by_ref.items()):
        rng = random.Random(seed * 1_000_003 + i)
        own = [c.prediction for c in own_cases]
        cls = own_cases[0].cls
        others = [c.prediction for c in by_class[cls] if c.reference != ref]
        majority = rng.choice(own)
        answers = [majority] * (size // 2)
        answers += [rng.choice(own + others) for _ in range(size - len(answers))]
        rng.shuffle(answers)
        groups.append(Group(ref, cls, [realistic(rng, a) for a in answers], len(set(answers))))
    return groups


def timed_rewardd(items: list[tuple[str, str]]) -> tuple[float, list[bool]]:
    """Seconds for rewardd on (completion, reference) pairs with default params, in a loop."""
    verdicts = []
    started = time.perf_counter()
    for completion, reference in items:
        verdicts.append(rewardd_true(rewardd_call(completion, reference, {})))
    return time.perf_counter() - started, verdicts


def timed_mv(items: list[tuple[str, str]]) -> tuple[float, list[bool]]:
    """Seconds for math-verify on (completion, gold) pairs: parse both, verify, per rollout."""
    verdicts = []
    started = time.perf_counter()
    for completion, gold in items:
        verdicts.append(bool(verify(parse(gold), parse(completion))))
    return time.perf_counter() - started, verdicts


def throughput(cases: list[Case], groups: list[Group], repeat: int, gold_mode: str
               ) -> dict[str, Any]:
    """Both tools in this process, interleaved unit by unit (a case, or a group), the order
    alternating, caches of both cleared before each unit (outside the timed region)."""
    distinct = {RW: [], MV: []}
    grouped = {RW: [], MV: []}
    agree = total = 0
    disagreements: list[dict[str, Any]] = []
    for r in range(repeat):
        secs = {RW: 0.0, MV: 0.0}
        for i, c in enumerate(cases):
            for tool in ((RW, MV) if (i + r) % 2 == 0 else (MV, RW)):
                clear_rewardd()
                clear_mv()
                if tool == RW:
                    secs[RW] += timed_rewardd([(c.prediction, c.reference)])[0]
                else:
                    secs[MV] += timed_mv([(c.prediction, mv_gold(c.reference, gold_mode))])[0]
        for tool in (RW, MV):
            distinct[tool].append(len(cases) / secs[tool] if secs[tool] else float("nan"))
        secs = {RW: 0.0, MV: 0.0}
        rollouts = 0
        for i, g in enumerate(groups):
            verdicts = {}
            for tool in ((RW, MV) if (i + r) % 2 == 0 else (MV, RW)):
                clear_rewardd()
                clear_mv()
                if tool == RW:
                    s, verdicts[RW] = timed_rewardd([(x, g.reference) for x in g.completions])
                else:
                    gold = mv_gold(g.reference, gold_mode)
                    s, verdicts[MV] = timed_mv([(x, gold) for x in g.completions])
                secs[tool] += s
            rollouts += len(g.completions)
            if r == 0:
                agree += sum(a == b for a, b in zip(verdicts[RW], verdicts[MV]))
                total += len(g.completions)
                disagreements += [{"reference": g.reference, "class": g.cls,
                                   "answer": _short(x.rsplit("\n\n", 1)[-1], 200),
                                   RW: a, MV: b}
                                  for x, a, b in zip(g.completions, verdicts[RW], verdicts[MV])
                                  if a != b]
        for tool in (RW, MV):
            grouped[tool].append(rollouts / secs[tool] if secs[tool] else float("nan"))
    return {"distinct": distinct, "groups": grouped,
            "group_agreement": agree / total if total else None, "group_rollouts": total,
            "group_disagreements": disagreements[:100]}


# ------------------------------------------------------------------------------ report


def pct(num: int, den: int) -> str:
    return f"{100 * num / den:.1f}%" if den else "n/a"


def table(header: list[str], rows: list[list[Any]], align: str | None = None) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(align or ["---"] * len(header)) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print()


def esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def confusion(cases: list[Case], verdicts: dict[str, bool]) -> dict[str, int]:
    fp = sum(1 for c in cases if verdicts[c.id] and not c.expected)
    fn = sum(1 for c in cases if not verdicts[c.id] and c.expected)
    return {"n": len(cases), "correct": len(cases) - fp - fn, "fp": fp, "fn": fn}


def reason(res: dict[str, Any]) -> str:
    if res["status"] != "ok":
        return res["status"]
    if res.get("error"):
        message = res.get("message")
        return esc(f"{res['error']}: {_short(message, 70)}" if message else str(res["error"]))
    return ""


def robustness_row(tool: str, results: dict[str, dict[str, Any]], timeout: float) -> list[Any]:
    timed = [(r["seconds"], cid) for cid, r in results.items() if r["seconds"] is not None]
    slow_s, slow_id = max(timed) if timed else (float("nan"), "-")
    counts = Counter(r["status"] for r in results.values())
    errors = sum(1 for r in results.values() if r["status"] == "ok" and r.get("error"))
    return [tool, len(results), slow_id, f"{slow_s:.3f}", counts["hang"], counts["crash"],
            errors]


def rate_text(rates: list[float]) -> str:
    if len(rates) == 1:
        return f"{rates[0]:,.1f}"
    return f"{statistics.mean(rates):,.1f} ({min(rates):,.1f}-{max(rates):,.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES,
                        help="labelled cases, JSON lines (default: tests/data/math_cases.jsonl)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="hard wall-clock limit per case in the robustness pass (s)")
    parser.add_argument("--repeat", type=int, default=3, help="throughput passes to average")
    parser.add_argument("--limit", type=int, default=0,
                        help="use at most N cases, taken round-robin over classes")
    parser.add_argument("--max-groups", type=int, default=0,
                        help="throughput: at most N groups (default: one per reference)")
    parser.add_argument("--max-adversarial", type=int, default=0,
                        help="use at most N adversarial cases (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the group rollouts")
    parser.add_argument("--adversarial-classes", default="adversarial",
                        help="comma-separated classes treated as adversarial (also any class "
                             "starting with 'adversarial')")
    parser.add_argument("--mv-reference", choices=("boxed", "raw"), default="boxed",
                        help="math-verify gold: reference wrapped in \\boxed{} (as verl does) "
                             "or passed raw")
    parser.add_argument("--no-embedded", action="store_true",
                        help="skip the EmbeddedExecutor (production path) check")
    parser.add_argument("--quick", action="store_true",
                        help="reduced run (< 60 s): --limit 48 --timeout 2 --repeat 1 "
                             "--max-groups 8 --max-adversarial 6, at most 3 cases through "
                             "the executor")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--verbose", action="store_true", help="list every wrong case")
    args = parser.parse_args()
    args.repeat = max(1, args.repeat)
    embedded_cap = 0
    if args.quick:
        args.limit = args.limit or 48
        args.timeout = min(args.timeout, 2.0)
        args.repeat = 1
        args.max_groups = args.max_groups or 8
        args.max_adversarial = args.max_adversarial or 6
        embedded_cap = 3
    wall_start = time.perf_counter()
    if not args.cases.exists():
        sys.exit(f"no case file at {args.cases}; pass --cases PATH")

    adversarial_names = {x.strip() for x in args.adversarial_classes.split(",") if x.strip()}

    def adversarial(c: Case) -> bool:
        return c.cls in adversarial_names or c.cls.startswith("adversarial")

    all_cases = load_cases(args.cases)
    cases = stratified(all_cases, args.limit)
    if args.max_adversarial:
        keep = {id(c) for c in [c for c in cases if adversarial(c)][:args.max_adversarial]}
        cases = [c for c in cases if not adversarial(c) or id(c) in keep]
    default_cases = [c for c in cases if not c.param_case]
    param_cases = [c for c in cases if c.param_case]
    mv_version = importlib.metadata.version("math-verify")

    print(f"\n`{shlex.join(sys.orig_argv)}`\n")
    print("# rewardd `math` verifier vs math-verify\n")
    print(f"- cases: `{args.cases}`: {len(cases)} used of {len(all_cases)} "
          f"({len(default_cases)} with default params, {len(param_cases)} with params), "
          f"{len({c.cls for c in cases})} classes")
    gold_text = ("reference wrapped in `\\boxed{}`" if args.mv_reference == "boxed"
                 else "reference as is")
    print(f"- math-verify {mv_version}{'' if mv_version == '0.9.0' else ' (expected 0.9.0)'}, "
          f"defaults; gold = {gold_text}; "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(f"- rewardd `rewardd.verifiers.math.clear_caches`: "
          f"{'present, called' if _rewardd_clear else 'absent'}")
    print(f"- robustness limit {args.timeout:g} s per case; throughput: {args.repeat} pass(es)\n")
    sys.stdout.flush()

    warm_up(args.mv_reference)

    # ---- robustness pass (also gives the verdicts for accuracy)
    print(f"[robustness: {len(cases)} rewardd + {len(default_cases)} math-verify calls]",
          file=sys.stderr, flush=True)
    rw_res = dict(zip([c.id for c in cases], run_isolated(
        rewardd_task, [(c.prediction, c.reference, c.params) for c in cases], args.timeout)))
    mv_res = dict(zip([c.id for c in default_cases], run_isolated(
        mv_task, [(mv_gold(c.reference, args.mv_reference), c.prediction)
                  for c in default_cases], args.timeout)))
    rw_v = {cid: bool(r["verdict"]) for cid, r in rw_res.items()}
    mv_v = {cid: bool(r["verdict"]) for cid, r in mv_res.items()}
    unparsed_gold = [cid for cid, r in mv_res.items()
                     if r["status"] == "ok" and not r.get("gold_parsed")]

    # ---- 1. accuracy
    print(f"## 1. Accuracy: {len(default_cases)} cases with default params\n")
    rows = []
    conf = {}
    for tool, verdicts, results in ((RW, rw_v, rw_res), (MV, mv_v, mv_res)):
        m = conf[tool] = confusion(default_cases, verdicts)
        failed = sum(1 for c in default_cases if reason(results[c.id]))
        rows.append([tool, pct(m["correct"], m["n"]), f"{m['correct']}/{m['n']}", m["fp"],
                     m["fn"], failed])
    table(["tool", "accuracy", "correct", "false positives", "false negatives",
           "hang / crash / error"], rows, ["---", "---:", "---:", "---:", "---:", "---:"])
    if unparsed_gold:
        print(f"math-verify parses {len(unparsed_gold)} reference(s) to nothing "
              f"(gold mode `{args.mv_reference}`): {', '.join(unparsed_gold[:20])}"
              f"{' ...' if len(unparsed_gold) > 20 else ''}\n")

    per_class = []
    classes = sorted({c.cls for c in default_cases})
    for cls in classes:
        members = [c for c in default_cases if c.cls == cls]
        per_class.append([cls, len(members),
                          sum(rw_v[c.id] == c.expected for c in members),
                          sum(mv_v[c.id] == c.expected for c in members)])
    print("### Per class\n")
    table(["class", "n", "rewardd correct", "math-verify correct"], per_class,
          ["---", "---:", "---:", "---:"])

    print(f"### rewardd on the {len(param_cases)} cases with non-default params "
          "(math-verify has no such options)\n")
    conf["rewardd_params"] = confusion(param_cases, rw_v)
    if param_cases:
        m = conf["rewardd_params"]
        table(["n", "accuracy", "false positives", "false negatives"],
              [[m["n"], pct(m["correct"], m["n"]), m["fp"], m["fn"]]],
              ["---:", "---:", "---:", "---:"])
    else:
        print("(none)\n")

    kfp = [c for c in default_cases if c.cls == KNOWN_FP_CLASS]
    print(f"### Class `{KNOWN_FP_CLASS}` ({len(kfp)} cases; FP = says true, expected false)\n")
    if kfp:
        def mark(v: bool, c: Case) -> str:
            return "**FP**" if v and not c.expected else str(v).lower()
        table(["id", "expected", "rewardd", "math-verify"],
              [[c.id, str(c.expected).lower(), mark(rw_v[c.id], c), mark(mv_v[c.id], c)]
               for c in kfp])
        for tool, verdicts in ((RW, rw_v), (MV, mv_v)):
            fps = [c.id for c in kfp if verdicts[c.id] and not c.expected]
            print(f"- {tool} false positives: {len(fps)}"
                  f"{': ' + ', '.join(fps) if fps else ''}")
        print()
    else:
        print("(none)\n")

    # ---- 2. robustness
    print(f"## 2. Robustness: each case once per tool in a killable worker, "
          f"limit {args.timeout:g} s\n")
    table(["tool", "cases", "slowest case", "seconds", f"hangs (killed at {args.timeout:g} s)",
           "crashes", "errors"],
          [robustness_row(RW, rw_res, args.timeout), robustness_row(MV, mv_res, args.timeout)],
          ["---", "---:", "---", "---:", "---:", "---:", "---:"])
    print("Each tool keeps its own internal limits here (math-verify's defaults: 5 s signal "
          "timeouts on each of its two parses and on verify, so up to about 15 s before it "
          "gives up by itself); the worker is killed at the limit above whatever they do.\n")
    adv_cases = [c for c in cases if adversarial(c)]
    if adv_cases:
        print(f"### Adversarial cases ({len(adv_cases)})\n")
        table(["id", "expected", "rewardd", "rewardd s", "math-verify", "math-verify s"],
              [[c.id, str(c.expected).lower(),
                reason(rw_res[c.id]) or str(rw_v[c.id]).lower(),
                "-" if rw_res[c.id]["seconds"] is None else f"{rw_res[c.id]['seconds']:.3f}",
                ("-" if c.id not in mv_res else
                 reason(mv_res[c.id]) or str(mv_v[c.id]).lower()),
                ("-" if c.id not in mv_res or mv_res[c.id]["seconds"] is None
                 else f"{mv_res[c.id]['seconds']:.3f}")]
               for c in adv_cases])
    embedded: dict[str, Any] = {"ran": False, "reason": "--no-embedded"}
    if args.no_embedded:
        print("Production path (EmbeddedExecutor): skipped (--no-embedded).\n")
    elif not adv_cases:
        embedded = {"ran": False, "reason": "no adversarial cases"}
        print("Production path (EmbeddedExecutor): no adversarial cases.\n")
    else:
        chosen = adv_cases[:embedded_cap] if embedded_cap else adv_cases
        print(f"[embedded executor: {len(chosen)} adversarial calls]", file=sys.stderr,
              flush=True)
        embedded = embedded_path(chosen, args.timeout)
        if not embedded["ran"]:
            print(f"Production path (EmbeddedExecutor): skipped, {embedded['reason']}\n")
        else:
            print(f"### Production path: `EmbeddedExecutor(pool_size=1)`, {len(chosen)} "
                  f"adversarial case(s), limit {args.timeout:g} s\n")
            table(["id", "expected", "outcome", "elapsed s"],
                  [[r["id"], str(r["expected"]).lower(),
                    r["error"] or ("true" if r["reward"] == 1.0 else "false"),
                    f"{r['elapsed_s']:.3f}"] for r in embedded["rows"]],
                  ["---", "---", "---", "---:"])
            print(f"Wall time {embedded['wall_s']:.1f} s including pool start; a normal call "
                  f"afterwards {'succeeded' if embedded['recovered'] else 'FAILED'}.\n")

    # ---- 3. throughput
    broken = {cid for res in (rw_res, mv_res) for cid, r in res.items() if r["status"] != "ok"}
    tp_cases = [c for c in default_cases if not adversarial(c) and c.id not in broken]
    excluded_broken = sorted(c.id for c in default_cases
                             if not adversarial(c) and c.id in broken)
    groups = build_groups(tp_cases, GROUP_SIZE, args.seed)
    if args.max_groups:
        groups = groups[:args.max_groups]
    print(f"[throughput: {len(tp_cases)} cases, {len(groups)} groups, {args.repeat} pass(es)]",
          file=sys.stderr, flush=True)
    warm_n = min(20, len(tp_cases))
    for c in tp_cases[:warm_n]:  # warm both tools on real inputs, in this process
        rewardd_call(c.prediction, c.reference, {})
        mv_call(mv_gold(c.reference, args.mv_reference), c.prediction)
    tp = throughput(tp_cases, groups, args.repeat, args.mv_reference)

    print(f"## 3. Throughput: cases/s, one core, in-process, mean of {args.repeat} pass(es)"
          f"{' (range)' if args.repeat > 1 else ''}\n")
    tp_rows = []
    for label, key, n in (
            (f"distinct: {len(tp_cases)} cases once, caches cleared per case", "distinct",
             len(tp_cases)),
            (f"groups of {GROUP_SIZE} sharing a reference: {len(groups)} groups, "
             "caches cleared per group", "groups", sum(len(g.completions) for g in groups))):
        rw_rates, mv_rates = tp[key][RW], tp[key][MV]
        ratio = (statistics.mean(rw_rates) / statistics.mean(mv_rates)
                 if n and statistics.mean(mv_rates) else float("nan"))
        per_pass = [a / b for a, b in zip(rw_rates, mv_rates) if b]
        spread = (f" ({min(per_pass):.2f}-{max(per_pass):.2f})" if len(per_pass) > 1 else "")
        tp_rows.append([label, n, rate_text(rw_rates), rate_text(mv_rates),
                        f"{ratio:.2f}x{spread}"])
    table(["workload", "calls per pass", "rewardd", "math-verify", "rewardd / math-verify"],
          tp_rows, ["---", "---:", "---:", "---:", "---:"])
    mean_distinct = statistics.mean([g.distinct_answers for g in groups]) if groups else 0.0
    agreed = round((tp["group_agreement"] or 0) * tp["group_rollouts"])
    print(f"Excluded: adversarial class, params cases, and cases that hung or crashed in the "
          f"robustness pass ({len(excluded_broken)}"
          f"{': ' + ', '.join(excluded_broken[:10]) if excluded_broken else ''}). "
          f"Groups: mean {mean_distinct:.1f} distinct answers per group; the tools agree on "
          f"{pct(agreed, tp['group_rollouts'])} of group rollouts"
          f"{' (disagreements in --json)' if agreed < tp['group_rollouts'] else ''}.\n")

    # ---- wrong cases
    cap = None if args.verbose else 40
    print("## Wrong cases\n")
    wrong_lists = {}
    for tool, verdicts, results, pool in ((RW, rw_v, rw_res, cases),
                                          (MV, mv_v, mv_res, default_cases)):
        wrong = [c for c in pool if verdicts[c.id] != c.expected]
        wrong_lists[tool] = [c.id for c in wrong]
        print(f"### {tool}: {len(wrong)} wrong\n")
        if wrong:
            shown = wrong if cap is None else wrong[:cap]
            table(["id", "class", "expected", "got", "note"],
                  [[c.id + (" (params)" if c.param_case else ""), c.cls,
                    str(c.expected).lower(),
                    reason(results[c.id]) or str(verdicts[c.id]).lower(), esc(_short(c.note, 80))]
                   for c in shown])
            if len(shown) < len(wrong):
                print(f"... {len(wrong) - len(shown)} more (--verbose lists all)\n")

    total_s = time.perf_counter() - wall_start
    print(f"Total wall time {total_s:.1f} s.")

    if args.json:
        payload = {
            "command": sys.orig_argv, "cases_file": str(args.cases),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "versions": {"math_verify": mv_version, "python": platform.python_version(),
                         "pebble": pebble.__version__},
            "rewardd_clear_caches": _rewardd_clear is not None,
            "accuracy": conf,
            "per_class": [dict(zip(("class", "n", "rewardd_correct", "math_verify_correct"), r))
                          for r in per_class],
            "mv_unparsed_gold": unparsed_gold,
            "known_false_positive": [{"id": c.id, "expected": c.expected,
                                      "rewardd": rw_v[c.id], "math_verify": mv_v[c.id]}
                                     for c in kfp],
            "cases": [{"id": c.id, "class": c.cls, "expected": c.expected,
                       "param_case": c.param_case, "adversarial": adversarial(c),
                       "rewardd": rw_res[c.id], "math_verify": mv_res.get(c.id)}
                      for c in cases],
            "embedded": embedded,
            "throughput": {"distinct_cases": len(tp_cases), "groups": len(groups),
                           "group_size": GROUP_SIZE, "excluded_broken": excluded_broken,
                           **tp},
            "wrong": wrong_lists, "wall_s": total_s,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
        print(f"Raw figures written to {args.json}.")


if __name__ == "__main__":
    main()
