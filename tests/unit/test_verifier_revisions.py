"""A verifier's revision changes whenever its verdicts change (issue 29's receipts).

Receipts name the revision and the verdict cache keys on it, so verdicts that moved under an
unchanged revision would let a cache shared across pods answer with the old ones. Each
verifier runs over its labelled corpus and is compared with the verdicts recorded for its
revision (``tests/data/verdicts.json``, written by ``tests/support/verdict_snapshot.py``).
"""

from __future__ import annotations

import json

import pytest

from rewardd.verifiers import REGISTRY
from tests.support import verdict_snapshot
from tests.support.verdict_snapshot import NEEDS_A_MODEL, SNAPSHOT, Case, cases

RECORDED = json.loads(SNAPSHOT.read_text())
CASES = cases()
BUILT_IN = sorted(name for name, v in REGISTRY.items()
                  if type(v).__module__.startswith("rewardd."))


def test_every_built_in_verifier_has_a_corpus_or_needs_a_model():
    with_corpus = {case.verifier for case in CASES}
    assert set(BUILT_IN) == with_corpus | NEEDS_A_MODEL, (
        "a new verifier needs cases in tests/data/verifier_corpus.jsonl")
    assert with_corpus == set(RECORDED), "record again: python -m tests.support.verdict_snapshot"
    assert all(REGISTRY[name].judged or name == "reward_model" for name in NEEDS_A_MODEL)
    assert {"rubric", "arena"} <= with_corpus  # judges against the rule-based judge server


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_verdicts_move_only_with_the_revision(name):
    recorded = RECORDED[name]
    revision = REGISTRY[name].revision
    assert revision == recorded["revision"], (
        f"{name}: revision {revision!r}, recorded {recorded['revision']!r}: record the "
        "verdicts of the new revision (python -m tests.support.verdict_snapshot)")
    today = verdict_snapshot.verdicts_of(name)
    moved = {case_id: (recorded["verdicts"].get(case_id), now)
             for case_id, now in today.items() if recorded["verdicts"].get(case_id) != now}
    assert not moved, (
        f"{name}: {len(moved)} verdicts changed under revision {revision!r} (recorded, now): "
        f"{dict(list(moved.items())[:5])}; bump {type(REGISTRY[name]).__name__}.revision and "
        "record again (python -m tests.support.verdict_snapshot)")


def test_a_changed_verdict_under_the_same_revision_is_caught(monkeypatch):
    """The check itself: a verifier whose verdicts move (here one case's reward, faked)
    without a new revision fails it."""
    case = next(c for c in CASES if c.verifier == "exact_match")
    real = verdict_snapshot.verdict

    def moved(c: Case) -> list:
        reward, error = real(c)
        return [1.0 - reward, error] if c.id == case.id else [reward, error]

    monkeypatch.setattr(verdict_snapshot, "verdict", moved)
    with pytest.raises(AssertionError, match="1 verdicts changed"):
        test_verdicts_move_only_with_the_revision("exact_match")
