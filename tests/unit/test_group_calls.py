"""Group calls through a real EmbeddedExecutor: real worker processes, real kills, no mocks.

One group per call; each sample keeps its own limit (soft deadline in the worker, hard limit
per call as a backstop), and a killed or crashed group is replayed sample by sample so only
the culprit fails. No bound on the wall clock: a check that was cut is told from one that
ran by order (answered before its sleep of :data:`SLEEP_S` could have ended) and by its
outcome's own detail, and that a kill costs no SIGTERM grace by the workers' signal
disposition, so a slow or busy machine cannot fail them.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import pebble
import pytest

import tests.plugins.faulty  # noqa: F401 - registers the test verifiers in this process
from rewardd.service import pipeline
from rewardd.service.models import RewardsRequest
from rewardd.service.settings import Settings
from tests.support.server import REPO_ROOT, child_env
from rewardd.verifiers.base import Sample
from rewardd.workers.deadline import can_arm
from rewardd.workers.embedded import EmbeddedExecutor, _context
from rewardd.workers.executor import CallResult, VerifyCall

PLUGINS = ("tests.plugins.faulty",)
SLEEP_S = 30.0
"""How long the misbehaving checks sleep: a timer never fires early, so an answer sooner
shows they were cut, however slow the machine."""
HANG_S = 120.0  # bounds against a hang, never a measurement


@pytest.fixture(scope="module")
def executor() -> Iterator[EmbeddedExecutor]:
    pool = EmbeddedExecutor(2, PLUGINS)
    assert asyncio.run(pool.ready(wait_s=120.0))  # forkserver up, workers warm
    yield pool
    pool.close()


def group_call(verifier: str, completions: list[str], timeout_s: float,
               **params: Any) -> VerifyCall:
    return VerifyCall(verifier, tuple(Sample(c) for c in completions), {}, params, timeout_s)


async def run_one(executor: EmbeddedExecutor, call: VerifyCall) -> tuple[CallResult, float]:
    started = time.perf_counter()
    [result] = await executor.run([call])
    return result, time.perf_counter() - started


def rewards(result: CallResult) -> list[float | None]:
    return [item.outcome.reward for item in result.items]


def errors(result: CallResult) -> list[str | None]:
    return [item.outcome.error.value if item.outcome.error else None for item in result.items]


def test_pebble_runs_tasks_in_the_workers_main_thread() -> None:
    """The soft deadline needs it: SIGALRM handlers run only in the main thread."""
    pool = pebble.ProcessPool(max_workers=1, context=_context(PLUGINS))
    try:
        assert pool.schedule(can_arm).result(timeout=120) is True
    finally:
        pool.stop()
        pool.join(timeout=10)


def test_hard_limit_is_the_sum_of_the_soft_limits_plus_a_small_margin() -> None:
    assert group_call("test_echo", ["1"], 2.0).hard_limit_s() == pytest.approx(2.1)
    eight = group_call("test_echo", ["1"] * 8, 2.0).hard_limit_s()
    assert 16.0 < eight <= 16.0 + 0.1 + 7 * 0.05


async def test_a_sleeper_times_out_alone_in_about_one_limit(executor: EmbeddedExecutor) -> None:
    limit = 1.0
    result, took = await run_one(executor, group_call(
        "test_sleep", ["1", "2", "3", "4"], limit, seconds=SLEEP_S, when=["3"]))
    assert rewards(result) == [1.0, 2.0, None, 4.0]
    assert errors(result) == [None, None, "timeout", None]
    sleeper = result.items[2]
    assert sleeper.outcome.detail["limit_s"] == limit and sleeper.elapsed_s == limit
    assert "interrupted" in sleeper.outcome.detail["message"]  # the soft deadline, no kill
    assert not result.replayed
    assert took < SLEEP_S  # answered before the sleep could have ended


async def test_every_sample_keeps_its_own_limit(executor: EmbeddedExecutor) -> None:
    """Three sleepers in one group: three soft timeouts, in about three limits, no kill."""
    result, took = await run_one(executor, group_call("test_sleep", ["1", "2", "3"], 0.5,
                                                      seconds=SLEEP_S))
    assert errors(result) == ["timeout"] * 3 and not result.replayed
    assert took < SLEEP_S  # answered before even the first sleep could have ended


async def test_an_uninterruptible_sample_is_killed_and_the_group_replayed(
        executor: EmbeddedExecutor) -> None:
    limit = 0.5
    call = group_call("test_block", ["1", "2", "3"], limit, seconds=SLEEP_S, when=["2"])
    result, took = await run_one(executor, call)
    assert result.replayed
    assert rewards(result) == [1.0, None, 3.0]
    assert errors(result) == [None, "timeout", None]
    culprit = result.items[1].outcome
    assert culprit.detail["limit_s"] == limit and "killed" in culprit.detail["message"]
    # killed, not waited for: answered before the sleep could have ended (the kill's cost, no
    # SIGTERM grace, is test_a_stopped_worker_ends_at_once)
    assert took < SLEEP_S
    # the pool recovered: a later call on the same executor works
    later, _ = await run_one(executor, group_call("test_echo", ["5", "6"], limit))
    assert rewards(later) == [5.0, 6.0] and not later.replayed


async def test_c_level_spin_is_cut_off_within_its_limit_plus_a_little(
        executor: EmbeddedExecutor) -> None:
    """No SIGALRM and no Python SIGTERM handler can stop it (it would spin for hours): the
    worker dies by the hard limit, at once rather than after pebble's 3 s SIGTERM grace
    (test_a_stopped_worker_ends_at_once)."""
    limit = 0.5
    result, _ = await run_one(executor, group_call("test_spin", ["0"], limit))
    assert errors(result) == ["timeout"] and not result.replayed
    assert result.items[0].outcome.detail["limit_s"] == limit
    group, _ = await run_one(executor, group_call("test_spin", ["1", "x", "3"], limit,
                                                  when=["x"]))
    assert rewards(group) == [1.0, None, 3.0] and group.replayed
    assert errors(group) == [None, "timeout", None]


def test_a_stopped_worker_ends_at_once(executor: EmbeddedExecutor) -> None:
    """pebble stops a worker that overran its hard limit with SIGTERM, and SIGKILLs it only
    3 s later if it is still alive; a Python SIGTERM handler cannot run while the worker is
    stuck in C code, so each kill would cost the limit plus 3 s. The executor's workers take
    SIGTERM's default disposition (rewardd.workers.tasks.init_worker): the kernel ends them
    at once. Checked in the executor's own workers, not timed."""
    disposition = executor._pool.schedule(signal.getsignal, args=(signal.SIGTERM,))
    assert disposition.result(timeout=HANG_S) == signal.SIG_DFL


async def test_a_crashing_sample_fails_alone(executor: EmbeddedExecutor) -> None:
    result, _ = await run_one(executor, group_call("test_crash", ["1", "2", "3", "4"], 5.0,
                                                   when=["2"]))
    assert result.replayed
    assert rewards(result) == [1.0, None, 3.0, 4.0]
    assert errors(result) == [None, "crashed", None, None]
    assert result.items[1].outcome.detail["exitcode"] == -9
    later, _ = await run_one(executor, group_call("test_echo", ["7"], 5.0))
    assert rewards(later) == [7.0]


async def test_a_sample_whose_result_cannot_travel_fails_alone(
        executor: EmbeddedExecutor) -> None:
    result, _ = await run_one(executor, group_call("test_unpicklable", ["1", "2"], 5.0,
                                                   when=["2"]))
    assert result.replayed
    assert rewards(result) == [1.0, None] and errors(result) == [None, "unavailable"]


async def test_progress_counts_samples(executor: EmbeddedExecutor) -> None:
    seen: list[int] = []
    calls = [group_call("test_echo", ["1", "2", "3"], 5.0),
             group_call("test_crash", ["1", "2"], 5.0, when=["2"]),  # replayed: still 2
             group_call("test_echo", ["4"], 5.0)]
    results = await executor.run(calls, seen.append)
    assert sum(seen) == 6 == sum(len(r.items) for r in results)
    assert sorted(seen) == [1, 2, 3]


async def test_pipeline_maps_group_results_back_to_rollout_cells(
        executor: EmbeddedExecutor) -> None:
    """Two groups x two components: 10 checks in 4 calls, each cell where it belongs."""
    request = RewardsRequest.model_validate({
        "groups": [
            {"group_id": "a", "rollouts": [{"rollout_id": f"a{c}", "completion": c}
                                           for c in ("1", "2", "3")]},
            {"group_id": "b", "rollouts": [{"rollout_id": f"b{c}", "completion": c}
                                           for c in ("4", "5")]}],
        "rewards": [{"name": "echo", "verifier": "test_echo"},
                    {"name": "slow", "verifier": "test_sleep", "timeout_s": 0.5,
                     "params": {"seconds": 30, "when": ["5"]}}]})
    seen: list[int] = []
    result = await pipeline.rewards(request, executor, Settings(), seen.append)
    assert sum(seen) == 10
    cells = {r["rollout_id"]: (r["rewards"]["echo"], r["rewards"]["slow"],
                               r["status"]["slow"]["ok"])
             for g in result["groups"] for r in g["rollouts"]}
    assert cells == {"a1": (1.0, 1.0, True), "a2": (2.0, 2.0, True), "a3": (3.0, 3.0, True),
                     "b4": (4.0, 4.0, True), "b5": (5.0, None, False)}
    b5 = result["groups"][1]["rollouts"][1]["status"]["slow"]
    assert b5["error"] == "timeout" and b5["detail"]["limit_s"] == 0.5


def test_a_later_executor_gets_its_plugins_whatever_the_forkserver_preloaded() -> None:
    """One forkserver per process, preloaded for the first executor only: a second executor
    with plugins must still find its verifiers (its workers import them themselves)."""
    script = """
import asyncio
from rewardd.verifiers.base import Sample
from rewardd.workers.embedded import EmbeddedExecutor
from rewardd.workers.executor import VerifyCall

async def main():
    first = EmbeddedExecutor(1)
    assert await first.ready(wait_s=120)
    second = EmbeddedExecutor(1, ("tests.plugins.faulty",))
    [result] = await second.run([VerifyCall("test_echo", (Sample("2.5"),), {}, {}, 5.0)])
    print(result.items[0].outcome.reward, result.items[0].outcome.error)
    first.close(); second.close()

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=180, env=child_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["2.5", "None"], out.stdout
