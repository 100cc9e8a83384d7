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
verifier's accepting, rejecting and edge cases). The judges (``judged`` verifiers) and the
reward model need a model to decide, so they are not here; their revisions are bumped by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

DATA = Path(__file__).resolve().parents[1] / "data"
SNAPSHOT = DATA / "verdicts.json"
MATH_CORPORA = ("math_cases.jsonl", "math_heldout.jsonl", "math_real_compare.jsonl",
                "math_real_extract.jsonl")
CORPUS = DATA / "verifier_corpus.jsonl"
NEEDS_A_MODEL = frozenset({"rubric", "arena", "refusal_judge", "continuation", "reward_model"})


@dataclass(frozen=True)
class Case:
    id: str
    verifier: str
    completion: str
    reference: dict[str, Any]
    params: dict[str, Any]
    prompt: str = ""
    num_tokens: int | None = None


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text().splitlines():
        if line.strip():
            yield json.loads(line)


def cases() -> list[Case]:
    found = [Case(c["id"], "math", c["prediction"], {"answer": c["reference"]},
                  c.get("params", {}))
             for name in MATH_CORPORA for c in _lines(DATA / name)]
    found += [Case(c["id"], c["verifier"], c["completion"], c["reference"], c["params"],
                   c.get("prompt", ""), c.get("num_tokens")) for c in _lines(CORPUS)]
    return found


def verdict(case: Case) -> list[Any]:
    """``[reward, error]`` of the case as its verifier decides it today."""
    from rewardd.verifiers import REGISTRY, Sample, run_verifier

    outcome = run_verifier(REGISTRY[case.verifier],
                           Sample(case.completion, case.prompt, case.num_tokens),
                           case.reference, case.params)
    return [outcome.reward, outcome.error.value if outcome.error else None]


def record() -> dict[str, Any]:
    """Today's revision and verdicts of every verifier with a corpus."""
    from rewardd.verifiers import REGISTRY

    out: dict[str, Any] = {}
    for case in cases():
        entry = out.setdefault(case.verifier, {"revision": REGISTRY[case.verifier].revision,
                                               "verdicts": {}})
        entry["verdicts"][case.id] = verdict(case)
    return dict(sorted(out.items()))


def main() -> None:
    SNAPSHOT.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")


if __name__ == "__main__":
    main()
