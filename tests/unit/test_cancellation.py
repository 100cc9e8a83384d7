"""A loop whose awaited call swallowed its cancellation still stops (service/cancellation.py).

Order, not timing: the swallowing call has provably started (an event) before the cancel;
:data:`HANG_S` only bounds a loop that would run on forever."""

from __future__ import annotations

import asyncio

from rewardd.service.app import create_app
from rewardd.service.cancellation import stop_if_cancelled
from rewardd.service.settings import Settings
from tests.support.executors import GatedExecutor

HANG_S = 30.0  # bounds against a hang, never a measurement


async def test_a_loop_stops_when_a_call_it_awaited_swallowed_the_cancel() -> None:
    entered, swallowed = asyncio.Event(), asyncio.Event()

    async def swallowing_call() -> None:  # what redis-py's client did inside a command
        entered.set()
        try:
            await asyncio.sleep(HANG_S * 10)
        except asyncio.CancelledError:
            if swallowed.is_set():  # once: a failing test's own cancel below still ends it
                raise
            swallowed.set()

    async def sweep_forever() -> None:
        while True:
            await swallowing_call()
            stop_if_cancelled()
            await asyncio.sleep(0)

    task = asyncio.create_task(sweep_forever())
    await entered.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=HANG_S)
    if not done:
        task.cancel()
    assert task in done and task.cancelled() and swallowed.is_set()


async def test_nothing_happens_without_a_cancel() -> None:
    stop_if_cancelled()  # a task that was not asked to stop goes on


async def test_the_session_sweeper_stops_although_its_store_swallowed_the_cancel() -> None:
    """The hang seen on a loaded machine: the lifespan's shutdown waited forever for a
    session sweeper whose Redis read had swallowed the cancel."""
    manager = create_app(Settings(), executor=GatedExecutor()).state.services.sessions
    entered, swallowed = asyncio.Event(), asyncio.Event()

    async def swallowing_active() -> list[str]:
        entered.set()
        try:
            await asyncio.sleep(HANG_S * 10)
        except asyncio.CancelledError:
            if swallowed.is_set():
                raise
            swallowed.set()
        return []

    manager.store.active = swallowing_active  # type: ignore[method-assign]
    await manager.start()
    await entered.wait()
    stopping = asyncio.create_task(manager.stop())
    done, _ = await asyncio.wait({stopping}, timeout=HANG_S)
    if not done:  # a failing run: end what the first cancel did not
        for task in asyncio.all_tasks() - {asyncio.current_task(), stopping}:
            task.cancel()
    assert stopping in done and swallowed.is_set()
