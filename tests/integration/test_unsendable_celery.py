"""A reference nested 500 levels deep on the Celery path: the call's typed failure, never a
dead worker.

kombu's JSON carries such a reference (json nests about twice as deep as pickle), but the
worker's prefork pool pickles every task's arguments again to hand them to a child, and the
``RecursionError`` there is Celery's "Unrecoverable error": the worker process exits, and the
message, acknowledged late, is redelivered to the next worker, which dies the same way. The
executor refuses such a call before publishing it, as the embedded pool's seal does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import tests.plugins.faulty  # noqa: F401 - the workers load the same plugins
from rewardd.verifiers.base import Sample
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.executor import VerifyCall
from tests.integration.conftest import make_settings
from tests.support.hostile import UNSENDABLE_MESSAGE, nested

SETTINGS = make_settings()
HANG_S = 60.0  # a bound against hangs only



def call(reference: dict[str, Any]) -> VerifyCall:
    return VerifyCall("exact_match", (Sample("4"), Sample("5")), reference, {}, 5.0)


async def test_a_reference_nested_500_deep_fails_its_call_and_the_worker_lives(
        fleet_for: Any) -> None:
    [worker] = fleet_for(SETTINGS).start(1, concurrency=1)
    executor = CeleryExecutor(SETTINGS)
    try:
        deep, fine = await asyncio.wait_for(executor.run(
            [call({"answer": "4", "extra": nested()}), call({"answer": "4"})]), HANG_S)
        assert [item.outcome.error.value for item in deep.items] == ["invalid_reference"] * 2
        assert deep.items[0].outcome.detail["message"] == UNSENDABLE_MESSAGE
        assert [item.outcome.reward for item in fine.items] == [1.0, 0.0]
        [after] = await asyncio.wait_for(executor.run([call({"answer": "5"})]), HANG_S)
        assert [item.outcome.reward for item in after.items] == [0.0, 1.0]
        assert worker.proc.poll() is None, worker.output()
        assert "Unrecoverable error" not in worker.output()
    finally:
        executor.close()
