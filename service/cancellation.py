"""A cancellation that a library swallowed still stops the loop it was meant for.

asyncio stops a task by throwing ``CancelledError`` into it at its next ``await``. Code that
catches it and carries on leaves the task running with the request still pending
(``Task.cancelling()`` above 0) and the next ``await`` not cancelled, so whoever awaits the
task's end waits forever. redis-py's asyncio client (8.2, Python 3.11) does so when the cancel
lands inside a command: seen on a loaded machine in the session sweeper, whose
``SMEMBERS``/pipeline read returned normally after the lifespan's shutdown had cancelled it,
and the shutdown then hung. A loop that must end when cancelled checks at each turn.

Rejected: cancelling again on a timer in each ``stop()`` (a polling delay in every shutdown,
and every owner of a loop must remember it); shielding the Redis calls (the cancel would then
wait for them, and the library's swallowing is not confined to the calls we know).
"""

from __future__ import annotations

import asyncio


def stop_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task was asked to stop and something it
    awaited swallowed the request."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
