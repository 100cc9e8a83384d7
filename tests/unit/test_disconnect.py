"""A client that leaves cancels its request's handler; one that stays gets its answer
(service/disconnect.py), driven through the ASGI interface directly."""

from __future__ import annotations

import asyncio
from typing import Any

from rewardd.service.disconnect import CancelOnDisconnect


class SlowApp:
    """Reads the body, then waits ``work_s`` before answering; records what happened."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.cancelled = False
        self.answered = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        try:
            await asyncio.sleep(self.work_s)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        self.answered = True


def drive(app: SlowApp, path: str, leave_after_s: float | None) -> list[dict]:
    """One POST whose client disconnects after ``leave_after_s`` (None: never)."""
    sent: list[dict] = []

    async def main() -> None:
        messages: asyncio.Queue[dict] = asyncio.Queue()
        await messages.put({"type": "http.request", "body": b"{}", "more_body": False})

        async def receive() -> dict:
            return await messages.get()

        async def send(message: dict) -> None:
            sent.append(message)

        async def leave() -> None:
            if leave_after_s is not None:
                await asyncio.sleep(leave_after_s)
                await messages.put({"type": "http.disconnect"})

        leaving = asyncio.create_task(leave())
        scope = {"type": "http", "method": "POST", "path": path}
        await asyncio.wait_for(CancelOnDisconnect(app)(scope, receive, send), timeout=30)
        leaving.cancel()

    asyncio.run(main())
    return sent


def test_a_client_that_leaves_cancels_the_work() -> None:
    app = SlowApp(work_s=60)
    assert drive(app, "/v1/score", leave_after_s=0.05) == []
    assert app.cancelled and not app.answered


def test_a_client_that_stays_gets_its_answer() -> None:
    app = SlowApp(work_s=0.05)
    sent = drive(app, "/v1/verify/math", leave_after_s=None)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert app.answered and not app.cancelled


def test_a_submitted_job_outlives_its_client() -> None:
    app = SlowApp(work_s=0.2)
    drive(app, "/v1/jobs", leave_after_s=0.01)  # not watched: a job runs on by design
    assert app.answered and not app.cancelled
