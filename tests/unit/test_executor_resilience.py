"""The embedded executor survives any payload, and a pool that dies anyway is replaced.

Real worker processes, no mocks of pebble. A reference nested 500 levels deep cannot be
pickled (pickle spends two of the interpreter's 1,000 recursion levels per level of nesting);
before the seal, pebble's scheduler thread died on it, the call hung and every later call was
``unavailable``. Waits are generous bounds against hangs (``asyncio.wait_for`` of a minute),
never measurements.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient

import tests.plugins.faulty  # noqa: F401 - registers the test verifiers in this process
from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.verifiers.base import Sample
from rewardd.workers.embedded import EmbeddedExecutor
from rewardd.workers.executor import CallResult, VerifyCall
from rewardd.workers.tasks import ping_task
from tests.support.hostile import UNSENDABLE_MESSAGE, nested

PLUGINS = ("tests.plugins.faulty",)
HANG_S = 60.0  # a bound against hangs only



def call(reference: dict[str, Any], completions: tuple[str, ...] = ("4", "5"),
         verifier: str = "exact_match", **params: Any) -> VerifyCall:
    return VerifyCall(verifier, tuple(Sample(c) for c in completions), reference, params, 5.0)


def errors(result: CallResult) -> list[str | None]:
    return [item.outcome.error.value if item.outcome.error else None for item in result.items]


def run(executor: EmbeddedExecutor, *calls: VerifyCall) -> list[CallResult]:
    return asyncio.run(asyncio.wait_for(executor.run(calls), HANG_S))


class PicklingBomb:
    """Raises in pebble's own scheduler thread when pebble pickles it: what any unforeseen
    failure there does (the seal keeps payloads from ever doing it)."""

    def __reduce__(self) -> Any:
        raise RecursionError("maximum recursion depth exceeded while pickling an object")


@pytest.fixture
def executor() -> Iterator[EmbeddedExecutor]:
    pool = EmbeddedExecutor(1, PLUGINS)
    assert asyncio.run(pool.ready(wait_s=120.0))
    yield pool
    pool.close()


def test_a_reference_nested_500_deep_fails_its_own_call_and_the_pool_keeps_serving(
        executor: EmbeddedExecutor) -> None:
    deep, fine = run(executor, call({"answer": "4", "extra": nested()}),
                     call({"answer": "4"}))
    assert errors(deep) == ["invalid_reference", "invalid_reference"]
    assert not deep.replayed  # a refused call is its own answer, never replayed
    detail = deep.items[0].outcome.detail
    assert detail["unsendable"] == "reference"
    assert detail["message"] == UNSENDABLE_MESSAGE
    assert [item.outcome.reward for item in fine.items] == [1.0, 0.0]
    [after] = run(executor, call({"answer": "5"}))
    assert [item.outcome.reward for item in after.items] == [0.0, 1.0]
    assert executor.describe()["rebuilds"] == 0
    assert asyncio.run(executor.ready())


def test_params_that_cannot_be_sent_are_an_error_naming_params(
        executor: EmbeddedExecutor) -> None:
    [result] = run(executor, call({"answer": "4"}, deep=nested(600)))
    assert errors(result) == ["error", "error"]
    assert result.items[0].outcome.detail["unsendable"] == "params"
    assert result.items[0].outcome.detail["message"].startswith(
        "the group's params could not be sent to a worker of verifier 'exact_match' "
        "(RecursionError")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_pool_is_replaced_its_pending_calls_fail_unavailable_and_it_serves_again(
        executor: EmbeddedExecutor) -> None:
    async def scenario() -> tuple[list[CallResult], dict[str, Any], list[CallResult], bool]:
        pending = asyncio.ensure_future(executor.run(
            [call({}, ("1",), verifier="test_sleep", seconds=30.0)]))
        await asyncio.sleep(0.3)  # the sleeper is running in the one worker
        executor._pool.schedule(ping_task, args=(PicklingBomb(),))  # pebble's thread dies
        lost = await asyncio.wait_for(pending, HANG_S)  # settled by the watchdog, no hang
        described = executor.describe()
        after = await asyncio.wait_for(executor.run([call({"answer": "4"})]), HANG_S)
        return lost, described, after, await executor.ready()

    lost, described, after, ready = asyncio.run(scenario())
    assert errors(lost[0]) == ["unavailable"]
    assert lost[0].items[0].outcome.detail["message"] == (
        "the worker pool failed (its task scheduler thread died) while this call was "
        "pending; a new pool serves from now on: retry the request")
    assert described["rebuilds"] == 1 and described["active"] is True
    assert described["fault"] == (
        "the worker pool failed (its task scheduler thread died) and was replaced by a new "
        "one (replacement 1); waiting for its workers to answer")
    assert [item.outcome.reward for item in after[0].items] == [1.0, 0.0]
    assert ready and executor.describe()["fault"] is None  # a pong clears the fault


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_pool_is_replaced_by_the_next_call_without_any_pending(
        executor: EmbeddedExecutor) -> None:
    dying = executor._pool
    dying.schedule(ping_task, args=(PicklingBomb(),))
    hang = time.monotonic() + HANG_S
    while dying.active:  # until the bomb has killed pebble's thread (order, not a pause)
        assert time.monotonic() < hang, "the bomb never reached pebble's thread"
        time.sleep(0.01)
    [result] = run(executor, call({"answer": "4"}))
    assert [item.outcome.reward for item in result.items] == [1.0, 0.0]
    assert executor.describe()["rebuilds"] == 1


def test_closing_settles_pending_calls_as_unavailable(executor: EmbeddedExecutor) -> None:
    async def scenario() -> list[CallResult]:
        pending = asyncio.ensure_future(executor.run(
            [call({}, ("1",), verifier="test_sleep", seconds=30.0)]))
        await asyncio.sleep(0.3)
        executor.close()
        return await asyncio.wait_for(pending, HANG_S)

    [result] = asyncio.run(scenario())
    assert errors(result) == ["unavailable"]
    assert result.items[0].outcome.detail["message"] == (
        "executor closed (the server is shutting down)")


class DeadExecutor(EmbeddedExecutor):
    """An executor whose pool died and whose replacement has not answered yet."""

    def __init__(self) -> None:  # no pool: ready() is all /readyz asks of it here
        self.pool_size, self.rebuilds, self._closed = 1, 1, False
        self.fault = ("the worker pool failed (its task scheduler thread died) and was "
                      "replaced by a new one (replacement 1); waiting for its workers to "
                      "answer")

    async def ready(self, wait_s: float = 5.0) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "rebuilds": self.rebuilds, "fault": self.fault}

    def close(self) -> None:
        pass


def test_readyz_is_not_ready_with_the_reason_while_the_pool_is_replaced() -> None:
    dead = DeadExecutor()
    with TestClient(create_app(Settings(), executor=dead)) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not_ready"
    assert body["reason"] == dead.fault
