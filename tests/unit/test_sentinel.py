"""Issue 30, item 3: the sentinel, accepted on simulated runs (tests/support/policy_sim.py).

A scripted policy is scored by the real pipeline (math and regex verifiers, a strict math
audit) and its batches turned into step statistics by the record's own code; one exploit per
signal drifts in from step 20 over 10 steps. Each exploit must raise its own signal within
10 steps of its onset; clean runs with the same noise must raise nothing. The default suite
runs 5 clean runs; the full acceptance (each exploit on ten seeds; 50 clean runs: at most
one false alarm) is ``make test-acceptance`` (marker ``acceptance``), whose figures are in the README."""

from __future__ import annotations

import functools

import pytest

from rewardd.service import sentinel
from rewardd.service.stepstats import StepStats
from tests.support.policy_sim import EXPLOITS, ONSET, simulate

WITHIN = 10


@functools.lru_cache(maxsize=None)
def exploit_run(name: str) -> tuple:
    return tuple(simulate(seed=1, exploit=name))


@pytest.mark.parametrize("signal", sorted(EXPLOITS))
def test_each_exploit_is_flagged_within_10_steps_of_its_onset(signal: str) -> None:
    alerts = [a for a in sentinel.evaluate(exploit_run(signal)) if a.signal == signal]
    assert alerts, f"{signal} was not flagged"
    first = alerts[0]
    assert ONSET <= first.step <= ONSET + WITHIN, first
    assert first.onset is not None and ONSET - 2 <= first.onset <= first.step
    assert first.message and first.threshold == sentinel.BY_NAME[signal].threshold


def test_no_alert_before_an_exploits_onset() -> None:
    for name in EXPLOITS:
        assert all(a.step >= ONSET for a in sentinel.evaluate(exploit_run(name))), name


@pytest.mark.parametrize("seed", range(5))
def test_a_clean_run_raises_nothing(seed: int) -> None:
    assert sentinel.evaluate(simulate(seed=100 + seed)) == []


@pytest.mark.acceptance
@pytest.mark.parametrize("signal", sorted(EXPLOITS))
def test_each_exploit_is_flagged_within_10_steps_on_ten_seeds(signal: str) -> None:
    for seed in range(10, 20):
        alerts = [a for a in sentinel.evaluate(simulate(seed=seed, exploit=signal))
                  if a.signal == signal]
        assert alerts and ONSET <= alerts[0].step <= ONSET + WITHIN, (seed, alerts[:1])


@pytest.mark.acceptance
def test_at_most_one_false_alarm_in_50_clean_runs() -> None:
    alarmed = [seed for seed in range(200, 250) if sentinel.evaluate(simulate(seed=seed))]
    assert len(alarmed) <= 1, alarmed


def test_latest_agrees_with_evaluate_at_every_step() -> None:
    """What the writer counts (the newest step only) is what the full evaluation raises."""
    series = list(exploit_run("hedging"))
    raised = {(a.signal, a.component, a.step) for a in sentinel.evaluate(series)}
    seen = set()
    for end in range(1, len(series) + 1):
        newly, active = sentinel.latest(series[max(0, end - sentinel.WINDOW - 1):end])
        assert {a.signal for a in newly} <= {a.signal for a in active}
        seen |= {(a.signal, a.component, a.step) for a in newly}
    assert seen == raised


def test_a_run_is_watched_from_its_15th_step() -> None:
    short = list(exploit_run("lenient_fallback"))[:14]
    assert sentinel.evaluate(short) == []
    assert sentinel.raised_at(short, 13, "lenient_fallback", None) is None


def test_step_statistics_merge_exactly() -> None:
    """A step that arrived in several batches is the sum of them: the same as one batch."""
    series = exploit_run("audit_divergence")
    a, b = series[25][1], series[26][1]
    merged = StepStats.from_document(a.to_document()).merge(
        StepStats.from_document(b.to_document()))
    assert merged.rollouts == a.rollouts + b.rollouts
    assert merged.reward_sum == a.reward_sum + b.reward_sum
    assert len(merged.audit["strict"]) == len(a.audit["strict"]) + len(b.audit["strict"])
    assert merged.to_document() == StepStats.from_document(merged.to_document()).to_document()


def test_remembered_alerts_are_bounded_per_tenant() -> None:
    """What a process keeps for summary.sentinel: at most MAX_WATCHED_RUNS runs a tenant, its
    least recently written going first; a tenant with many runs never pushes out another's."""
    from rewardd.service.records.recorder import MAX_WATCHED_RUNS, Recorder
    from rewardd.service.settings import Settings

    recorder = Recorder(Settings(record_runs=False))
    held = [sentinel.Alert("hedging", 20, 18, 0.3, 0.1, "hedged")]
    recorder.remember("quiet", "run", held)
    for i in range(MAX_WATCHED_RUNS + 5):
        recorder.remember("busy", f"run-{i}", [])
    assert recorder.active_alerts("quiet", "run") == held
    assert recorder.active_alerts("busy", "run-0") is None  # its oldest went
    assert recorder.active_alerts("busy", f"run-{MAX_WATCHED_RUNS + 4}") == []
    assert recorder.active_alerts("other", "run") is None
