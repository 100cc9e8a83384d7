"""The recorded verdicts of every verifier on its labelled corpus, by revision.

A verifier's ``revision`` must change whenever its verdicts change: receipts name it, and the
verdict cache keys on it, so a fix that changed verdicts under an unchanged revision would
let the cache (shared in Redis across pods, kept for a day) answer with the old verdicts, and
two records with the same receipt would disagree. ``tests/unit/test_verifier_revisions.py``
runs each verifier over its corpus and compares with ``tests/data/verdicts.json``:

* verdicts differ, revision unchanged: the test fails, naming the cases; bump the verifier's
  ``revision`` (``verifiers/...``) and record again;
* revision changed: record again (the file must name today's revisions).

Record with ``.venv/bin/python -m tests.support.verdict_snapshot``.

Corpora: the math verifier's labelled sets (``tests/data/math_*.jsonl``), and
``tests/data/verifier_corpus.jsonl`` for the others (written for this check: each
verifier's accepting, rejecting and edge cases). The rubric and arena judges run against the
rule-based judge server of the tests (``tests/support/judge_server.py``, real HTTP): its
answers follow fixed rules, so their verdicts move only when the judge's prompt, parsing or
scoring does. A case of a group-level verifier is a group (``completions``), its verdict one
per completion. The refusal judge, the continuation judge and the reward model need a model
the rules do not imitate (or a model file): not here; their revisions are bumped by hand.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

DATA = Path(__file__).resolve().parents[1] / "data"
SNAPSHOT = DATA / "verdicts.json"
MATH_CORPORA = ("math_cases.jsonl", "math_heldout.jsonl", "math_real_compare.jsonl",
                "math_real_extract.jsonl", "math_verify_suite.jsonl")
CORPUS = DATA / "verifier_corpus.jsonl"
NEEDS_A_MODEL = frozenset({"refusal_judge", "continuation", "reward_model"})


@dataclass(frozen=True)
class Case:
    id: str
    verifier: str
    completions: tuple[str, ...]
    """One sample; several for a group-level verifier's group."""
    reference: dict[str, Any]
    params: dict[str, Any]
    prompt: str = ""
    num_tokens: int | None = None


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text().splitlines():
        if line.strip():
            yield json.loads(line)


def cases() -> list[Case]:
    found = [Case(c["id"], "math", (c["prediction"],), {"answer": c["reference"]},
                  c.get("params", {}))
             for name in MATH_CORPORA for c in _lines(DATA / name)]
    found += [Case(c["id"], c["verifier"], tuple(c.get("completions") or (c["completion"],)),
                   c["reference"], c["params"], c.get("prompt", ""), c.get("num_tokens"))
              for c in _lines(CORPUS)]
    return found


def verdict(case: Case) -> list[Any]:
    """``[reward, error]`` of the case as its verifier decides it today (a group's: one
    pair per completion)."""
    from rewardd.verifiers import REGISTRY, Sample, run_verifier
    from rewardd.verifiers.base import run_group_verifier

    verifier = REGISTRY[case.verifier]
    samples = [Sample(text, case.prompt, case.num_tokens) for text in case.completions]
    if verifier.group_level:
        outcomes = run_group_verifier(verifier, samples, case.reference, case.params)
        return [[o.reward, o.error.value if o.error else None] for o in outcomes]
    outcome = run_verifier(verifier, samples[0], case.reference, case.params)
    return [outcome.reward, outcome.error.value if outcome.error else None]


@contextlib.contextmanager
def rule_judge() -> Iterator[None]:
    """REWARDD_JUDGE_* pointing at a fresh rule-based judge server (and back after)."""
    from rewardd.verifiers.judge import openai_compat
    from rewardd.verifiers.judge.config import reset_backends
    from tests.support.judge_server import JudgeServer

    server = JudgeServer().start()
    saved = {k: os.environ.get(k) for k in ("REWARDD_JUDGE_BASE_URL", "REWARDD_JUDGE_MODEL")}
    os.environ.update(REWARDD_JUDGE_BASE_URL=server.base_url, REWARDD_JUDGE_MODEL="rule-judge")
    openai_compat.CACHE.clear()
    reset_backends()
    try:
        yield
    finally:
        reset_backends()
        openai_compat.CACHE.clear()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def verdicts_of(name: str) -> dict[str, list[Any]]:
    """Today's verdicts of verifier ``name`` on its corpus (a judge against the rule judge)."""
    from rewardd.verifiers import REGISTRY

    mine = [case for case in cases() if case.verifier == name]
    with rule_judge() if REGISTRY[name].judged else contextlib.nullcontext():
        return {case.id: verdict(case) for case in mine}


def record() -> dict[str, Any]:
    """Today's revision and verdicts of every verifier with a corpus."""
    from rewardd.verifiers import REGISTRY

    names = sorted({case.verifier for case in cases()})
    return {name: {"revision": REGISTRY[name].revision, "verdicts": verdicts_of(name)}
            for name in names}


def main() -> None:
    SNAPSHOT.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")


if __name__ == "__main__":
    main()
