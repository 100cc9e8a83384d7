"""What a canary's verdicts say is wrong, in words an operator can act on.

A failed probe alone says little ("the accept probe got 0"); the verifier's own evidence
(the failure kind and message, the extracted answer and the rule that found it, the per-test
verdicts of a program) says why. Each rule below reads that evidence and names the likely
misconfiguration: the answer under another reference key, answers inside ``<think>`` only, a
sandbox without its runtime or below the isolation required, a judge whose replies do not
parse, a verifier that gives 0 to everything, tests whose expected outputs are wrong. One
message per canaried group and component, the first rule that applies: a verifier that
cannot read its reference also rejects every probe, and saying so twice hides the cause.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import FailureKind, Outcome
from rewardd.verifiers.probes import Probe

FULL = 1.0 - 1e-9
EVIDENCE_KEYS = ("extracted", "rule", "decided_by", "compared", "expected", "reason")
"""Outcome detail worth quoting in a message (the verifier's own account of its verdict)."""


def passes(probe: Probe, outcome: Outcome) -> bool:
    """True when ``outcome`` is what a correct verifier gives ``probe``."""
    if not outcome.ok or outcome.reward is None:
        return False
    if probe.expect == "full":
        return outcome.reward >= FULL
    if probe.expect == "below_full":
        return outcome.reward < FULL
    return True  # "verdict": any reward the judge gave


def findings(component: str, verifier: str, group_id: str, reference: Mapping[str, Any],
             probes: Sequence[Probe], outcomes: Sequence[Outcome]) -> list[str]:
    """The problems one canaried group shows for one component (empty: none)."""
    where = f"{component} ({verifier}), group {group_id!r}: "
    failed = [(p, o) for p, o in zip(probes, outcomes) if not o.ok]
    if failed:
        return [where + _failure(verifier, reference, failed[0][1])]
    missed = [(p, o) for p, o in zip(probes, outcomes) if p.kind == "accept" and not passes(p, o)]
    wrong = [(p, o) for p, o in zip(probes, outcomes) if p.kind == "reject" and not passes(p, o)]
    problems = []
    if missed:
        problems.append(where + _missed(verifier, reference, probes, outcomes, missed))
    if wrong:
        probe, outcome = wrong[0]
        problems.append(where + f"the verifier accepted {probe.label} (a wrong answer) with "
                        f"reward {outcome.reward:g}{_evidence(outcome)}: it rewards answers "
                        "it should reject")
    return problems


def _failure(verifier: str, reference: Mapping[str, Any], outcome: Outcome) -> str:
    kind, message = outcome.error, str(outcome.detail.get("message", ""))
    if kind is FailureKind.invalid_reference:
        fields = sorted(_fields(verifier))
        keys = sorted(str(k) for k in reference)
        if fields and not any(f in reference for f in fields):
            return (f"the verifier could not read the reference ({message}): it reads "
                    f"{_names(fields)} and this reference has {_names(keys) or 'no keys'}: "
                    f"the answer is probably under another key{_candidates(reference)}")
        return (f"the verifier could not read the reference ({message}): check what "
                f"{_names(fields) or 'its fields'} hold")
    if kind is FailureKind.unavailable:
        return f"the verifier cannot run at all (unavailable): {message}"
    if kind is FailureKind.judge_unparseable:
        raw = str(outcome.detail.get("raw") or "")[:160]
        return (f"the judge's reply to a canary could not be read as a verdict ({message}; "
                f"the reply began {raw!r}): the judge model, its template or verdict_pattern "
                "do not match, and every rollout it grades fails the same way")
    if kind in (FailureKind.judge_unavailable, FailureKind.judge_refused):
        return f"the judge did not grade a canary ({kind.value}): {message}"
    return f"a canary failed ({kind.value if kind else 'error'}): {message}"


def _missed(verifier: str, reference: Mapping[str, Any], probes: Sequence[Probe],
            outcomes: Sequence[Outcome], missed: list[tuple[Probe, Outcome]]) -> str:
    probe, outcome = missed[0]
    tests = outcome.detail.get("tests")
    if isinstance(tests, list):
        return _code(outcome, tests)
    plain = [(p, o) for p, o in missed if not p.shaped]
    if not plain:
        accepted = next((p for p, o in zip(probes, outcomes)
                         if p.kind == "accept" and not p.shaped), probe)
        return (f"the verifier accepts {accepted.label} but gives {outcome.reward:g} to the "
                f"same inside <think> with nothing after it{_evidence(outcome)}, which is how "
                "most of this group's completions end: the answers are inside <think> only (a "
                "chat template or the length limit cut the text after </think>) and this "
                "verifier does not read them there")
    probe, outcome = plain[0]
    if all(o.reward == 0 for o in outcomes):
        return (f"the verifier gave 0 to every canary, {probe.label} included"
                f"{_evidence(outcome)}: it gives 0 to everything (a broken verifier, wrong "
                "params, or a reference it misreads)")
    keys = sorted(str(k) for k in reference)
    return (f"the verifier rejected {probe.label} with reward {outcome.reward:g}"
            f"{_evidence(outcome)}: it reads {_names(sorted(_fields(verifier)))} of the "
            f"reference (this one has {_names(keys)}); an answer under another key or "
            "written in another form is misread")


def _code(outcome: Outcome, tests: list[Any]) -> str:
    verdicts = [t for t in tests if isinstance(t, dict)]
    missing = next((str(t.get("message")) for t in verdicts
                    if "not installed" in str(t.get("message", ""))), None)
    language = outcome.detail.get("language", "the reference's language")
    if missing is not None:
        return (f"the sandbox cannot run {language} programs ({missing}): every {language} "
                "rollout scores 0")
    total = int(outcome.detail.get("total") or len(verdicts))
    passed = int(outcome.detail.get("passed") or 0)
    first = next((t for t in verdicts if t.get("verdict") != "passed"), {})
    shown = ", ".join(f"{k} {first[k]!r}" for k in ("verdict", "got", "expected") if k in first)
    return (f"the reference's own solution fails {total - passed} of {total} tests: the "
            f"expected outputs are probably wrong (first failure: {shown})")


def _candidates(reference: Mapping[str, Any]) -> str:
    """The reference's short scalar values, where the answer may be (" (`ground_truth` holds
    '42')")."""
    shown = [f"`{k}` holds {v!r}" for k, v in reference.items()
             if isinstance(v, (str, int, float)) and len(str(v)) <= 80][:3]
    return f" ({', '.join(shown)})" if shown else ""


def _fields(verifier: str) -> set[str]:
    impl = REGISTRY.get(verifier)
    return set(impl.reference_fields) if impl is not None else set()


def _names(keys: Sequence[str]) -> str:
    return ", ".join(f"`{k}`" for k in keys)


def _evidence(outcome: Outcome) -> str:
    shown = [f"{k}={outcome.detail[k]!r}" for k in EVIDENCE_KEYS
             if outcome.detail.get(k) is not None]
    return f" ({', '.join(shown)})" if shown else ""


__all__ = ["findings", "passes"]
