"""The Celery executor against the embedded one: same batch, same bytes; same failures, same
types. Two real ``rewardd worker`` processes (two prefork children each) on Redis."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterator

import pytest
import redis

import tests.plugins.faulty  # noqa: F401 - registers the test verifiers in this process
from rewardd.service import pipeline
from rewardd.service.models import ScoreRequest
from tests.integration.conftest import PLUGINS, make_settings, result_keys
from tests.support.server import REPO_ROOT
from rewardd.verifiers.base import Sample
from rewardd.workers.celery_app import PING_TASK
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.embedded import EmbeddedExecutor
from rewardd.workers.executor import CallResult, VerifyCall

SETTINGS = make_settings()
SLEEP_S = 60
"""How long the misbehaving checks sleep: a timer never fires early, so an answer sooner
shows they were cut, on a machine of any speed (order, not a wall-clock bound)."""


@pytest.fixture(scope="module")
def workers(fleet_for: Any) -> Any:
    fleet = fleet_for(SETTINGS)
    return fleet.start(2, concurrency=2)


@pytest.fixture(scope="module")
def celery(workers: Any) -> Iterator[CeleryExecutor]:
    executor = CeleryExecutor(SETTINGS)
    yield executor
    executor.close()


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedExecutor]:
    executor = EmbeddedExecutor(2, (PLUGINS,))
    assert asyncio.run(executor.ready(wait_s=120.0))
    yield executor
    executor.close()


def batch() -> ScoreRequest:
    """The bundled example (8 groups of 4: math and regex rewards) plus exact_match."""
    body = json.loads((REPO_ROOT / "openapi" / "examples" / "math_batch.json").read_text())
    body["rewards"].append({"name": "exact", "verifier": "exact_match", "weight": 0.5,
                            "params": {"extract": "boxed"}})
    return ScoreRequest.model_validate(body)


def group_call(verifier: str, completions: list[str], timeout_s: float,
               **params: Any) -> VerifyCall:
    return VerifyCall(verifier, tuple(Sample(c) for c in completions), {}, params, timeout_s)


def cells(result: CallResult) -> list[tuple[Any, ...]]:
    """What must match across executors: reward, failure kind and the typed details."""
    return [(item.outcome.ok, item.outcome.reward,
             item.outcome.error.value if item.outcome.error else None,
             item.outcome.detail.get("limit_s"), item.outcome.detail.get("exitcode"))
            for item in result.items]


def test_worker_children_run_tasks_in_their_main_thread(celery: CeleryExecutor) -> None:
    """The per-sample soft deadline (SIGALRM) arms only in a main thread; prefork children
    run tasks in theirs."""
    result = celery.app.tasks[PING_TASK].apply_async(queue="cpu")
    try:
        answer = result.get(timeout=60)
    finally:
        result.forget()
    assert answer["pong"] == "pong"
    assert answer["soft_deadline"] is True


async def test_same_batch_same_response(celery: CeleryExecutor,
                                        embedded: EmbeddedExecutor) -> None:
    req = batch()
    local = await pipeline.score(req, embedded, SETTINGS)
    seen: list[int] = []
    distributed = await pipeline.score(req, celery, SETTINGS, progress=seen.append)
    assert distributed == local
    assert sum(seen) == 8 * 4 * 3  # every check of every component, once
    assert local["summary"]["failed_cells"] == 0
    rewards = {r["rollout_id"]: r["rewards"] for g in local["groups"] for r in g["rollouts"]}
    assert rewards["q0-0"] == {"correct": 1.0, "format": 1.0, "exact": 1.0}
    assert rewards["q0-3"]["correct"] == 0.0 and rewards["q0-3"]["exact"] == 0.0


async def test_failures_are_typed_like_embedded(celery: CeleryExecutor,
                                                embedded: EmbeddedExecutor) -> None:
    calls = [
        # soft deadline inside a group: only the sleeper times out, nothing is replayed
        group_call("test_sleep", ["1", "2", "3", "4"], 0.5, seconds=SLEEP_S, when=["3"]),
        # a crash inside a group: replayed one sample per call, only the culprit crashed
        group_call("test_crash", ["1", "2", "3"], 5.0, when=["2"]),
        # a hang signals cannot stop: killed at the hard limit, replayed, culprit timeout
        group_call("test_spin", ["1", "2"], 0.5, when=["2"]),
        # SIGALRM blocked: Celery's soft time limit / pebble's kill, either way a timeout
        group_call("test_block", ["1"], 0.5, seconds=SLEEP_S),
        group_call("test_swallow", ["1", "2"], 0.5, seconds=SLEEP_S, when=["1"]),
        group_call("test_raise", ["1", "2"], 2.0, when=["1"]),
        group_call("test_unpicklable", ["1", "2"], 2.0, when=["2"]),
        group_call("test_echo", ["0.25", "7"], 2.0),
    ]
    started = time.perf_counter()
    distributed = await celery.run(calls)
    took = time.perf_counter() - started
    local = await embedded.run(calls)
    for call, a, b in zip(calls, distributed, local):
        assert cells(a) == cells(b), call.verifier
        assert a.replayed == b.replayed, call.verifier
    by_name = {call.verifier: cells(result) for call, result in zip(calls, distributed)}
    assert by_name["test_sleep"] == [(True, 1.0, None, None, None), (True, 2.0, None, None, None),
                                     (False, None, "timeout", 0.5, None),
                                     (True, 4.0, None, None, None)]
    assert by_name["test_crash"][1] == (False, None, "crashed", None, -9)
    assert [c[2] for c in by_name["test_crash"]] == [None, "crashed", None]
    assert by_name["test_spin"][1][2] == "timeout"
    assert by_name["test_block"][0][2] == "timeout"
    assert by_name["test_swallow"][0][2] == "timeout"
    assert by_name["test_raise"][0][2] == "error"
    assert by_name["test_unpicklable"][1][2] == "unavailable"
    assert [r.replayed for r in distributed] == [False, True, True, False, False, False, True,
                                                 False]
    assert took < SLEEP_S, took  # about 3 s: answered before any sleep could have ended


async def test_groups_beyond_the_task_size_are_split_and_reassembled(workers: Any) -> None:
    executor = CeleryExecutor(make_settings(task_max_samples=3))
    try:
        echo = group_call("test_echo", [str(i) for i in range(10)], 2.0)
        crash = group_call("test_crash", [str(i) for i in range(7)], 5.0, when=["5"])
        seen: list[int] = []
        [a, b] = await executor.run([echo, crash], progress=seen.append)
    finally:
        executor.close()
    assert [item.outcome.reward for item in a.items] == [float(i) for i in range(10)]
    assert not a.replayed
    assert [item.outcome.reward for item in b.items] == [0.0, 1.0, 2.0, 3.0, 4.0, None, 6.0]
    assert b.items[5].outcome.error.value == "crashed" and b.replayed
    assert sorted(seen) == [1, 1, 3, 3, 3, 3, 3]  # per task of three (or the rest)


async def test_small_groups_share_tasks_when_they_outnumber_the_worker_slots(
        workers: Any) -> None:
    """40 groups of two on 4 worker slots: packed to about 4 tasks per slot (6 samples, three
    groups a task), each group checked against its own items; a crash in a pack replays that
    pack's samples one by one, so only the culprit fails and only its pack is replayed."""
    executor = CeleryExecutor(SETTINGS)
    try:
        census = await executor.census()
        assert census["slots_by_queue"]["cpu"] == 4  # two workers of two children
        calls = [group_call("test_crash", [str(2 * g), str(2 * g + 1)], 5.0, when=["13"])
                 for g in range(40)]
        seen: list[int] = []
        done: list[tuple[int, CallResult]] = []
        results = await executor.run(calls, progress=seen.append,
                                     on_call_done=lambda i, r: done.append((i, r)))
    finally:
        executor.close()
    assert sorted(seen) == [2] + [6] * 13  # 13 tasks of three groups, one of the last group
    for g, result in enumerate(results):
        expected = [float(2 * g), float(2 * g + 1)]
        if g == 6:
            assert [item.outcome.reward for item in result.items] == [12.0, None]
            assert result.items[1].outcome.error.value == "crashed"
        else:
            assert [item.outcome.reward for item in result.items] == expected, g
        assert result.replayed == (g in (6, 7, 8)), g  # groups 6..8 shared the crashed task
    assert sorted(i for i, _ in done) == list(range(40))
    assert all(result == results[i] for i, result in done)


async def test_without_a_census_nothing_is_packed(workers: Any) -> None:
    executor = CeleryExecutor(SETTINGS)
    try:
        seen: list[int] = []
        results = await executor.run(
            [group_call("test_echo", [str(g), str(g)], 2.0) for g in range(40)],
            progress=seen.append)
    finally:
        executor.close()
    assert seen == [2] * 40
    assert [r.items[0].outcome.reward for r in results] == [float(g) for g in range(40)]


async def test_no_result_is_left_in_redis(celery: CeleryExecutor, redis_db: redis.Redis) -> None:
    """Results are deleted as they are read. The one exception: Celery stores a hard time
    limit twice, and the second copy may land after the delete; the executor deletes it
    again shortly after, and meanwhile it carries the TTL like everything a worker stores."""
    calls = [group_call("test_echo", [str(i), str(i + 1)], 2.0) for i in range(20)]
    calls.append(group_call("test_crash", ["1", "2"], 5.0, when=["1"]))
    calls.append(group_call("test_spin", ["1"], 0.3))  # killed at its hard time limit
    results = await celery.run(calls)
    assert [len(r.items) for r in results] == [2] * 21 + [1]
    assert results[-1].items[0].outcome.error.value == "timeout"
    assert await celery.ready(wait_s=30)
    deadline = time.monotonic() + 15
    while True:
        left = result_keys(redis_db)
        assert all(0 < ttl <= SETTINGS.result_ttl_s for ttl in left.values()), left
        if not left:
            break
        assert time.monotonic() < deadline, {key: redis_db.get(key) for key in left}
        await asyncio.sleep(0.1)
    assert not list(redis_db.scan_iter("rewardd-deliveries-*"))
    # and what nobody reads expires: a worker stores every result with the TTL
    result = celery.app.tasks[PING_TASK].apply_async(queue="cpu")
    deadline = time.monotonic() + 60
    while not result_keys(redis_db) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    ttls = result_keys(redis_db)
    assert len(ttls) == 1 and all(0 < ttl <= SETTINGS.result_ttl_s for ttl in ttls.values()), ttls
    result.forget()
    assert result_keys(redis_db) == {}
