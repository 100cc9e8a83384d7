"""Job events: the server-sent event stream of ``GET /v1/jobs/{id}/events``, resumed after a
dropped connection, and waiting for a job's result.

The server (``service/api/jobs.py``) sends ``progress`` events (no id), one ``group`` event
per finished group and a terminal ``succeeded``/``failed``/``cancelled`` event (ids are the
job's event sequence numbers, stored with the job), then ends the stream. A reconnect with
``Last-Event-ID: <last id seen>`` gets only later events, on any API pod, so the iterator
here reconnects by itself after a connection drops (with the client's retry policy; the
budget restarts after every event received) and yields each event once.

Why SSE parsing here rather than a dependency (httpx-sse, sseclient): the format the server
writes is three fields and a blank line; a thirty-line parser keeps the client at two
dependencies.

The iteration logic is a small state machine (:class:`EventCursor`) that the blocking and the
asyncio mixins drive; they differ only in ``for`` versus ``async for``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Union

import httpx

from rewardd_client.errors import JobFailed
from rewardd_client.retry import RetryPolicy, Retrying

FINAL_STATES = ("succeeded", "failed", "cancelled")
EventId = Union[int, str]


@dataclass(frozen=True)
class JobEvent:
    """One event: ``event`` is ``progress``, ``group`` or a final state; ``data`` its JSON
    payload; ``id`` its sequence number (None for progress events, which are not stored)."""

    event: str
    data: Any
    id: int | None = None

    @property
    def final(self) -> bool:
        return self.event in FINAL_STATES


class SSEParser:
    """Server-sent events, one line at a time (line endings already stripped)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._event = "message"
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> JobEvent | None:
        """The event this line completes (a blank line ends one), else None."""
        if not line:
            if not self._data:  # nothing to dispatch (a lone id or comment)
                self._reset()
                return None
            raw = "\n".join(self._data)
            ident = self._id
            event = JobEvent(self._event, json.loads(raw) if raw else None,
                             int(ident) if ident and ident.isdigit() else None)
            self._reset()
            return event
        if line.startswith(":"):  # a comment: the server's keep-alive
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None


class EventCursor:
    """Where a job's event stream stands: the last id seen (for ``Last-Event-ID``), whether
    the final event came, and the reconnect budget."""

    def __init__(self, policy: RetryPolicy, job_id: str, last_event_id: EventId | None) -> None:
        self.policy = policy
        self.job_id = job_id
        self.path = f"/v1/jobs/{job_id}/events"
        self.last_id = last_event_id
        self.done = False
        self._parser = SSEParser()
        self._retrying = self._fresh()

    def _fresh(self) -> Retrying:
        return Retrying(self.policy, "GET", self.path, resendable=True)

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        return headers

    def connected(self) -> None:
        self._parser = SSEParser()  # an event cut mid-way is sent again whole

    def feed(self, line: str) -> JobEvent | None:
        event = self._parser.feed(line)
        if event is not None:
            if event.id is not None:
                self.last_id = event.id
            self.done = event.final
            self._retrying = self._fresh()  # progress: the budget restarts
        return event

    def reconnect_wait(self, dropped: httpx.TransportError | None) -> float:
        """Seconds to wait before reconnecting after the stream ended early (``dropped``:
        the connection error, None for a clean end); raises once the budget is spent."""
        return self._retrying.after_error(dropped or httpx.RemoteProtocolError(
            "the event stream ended before the job's final event"))


def _outcome(job: dict[str, Any]) -> dict[str, Any]:
    if job["state"] != "succeeded":
        raise JobFailed(job)
    return job["result"]


class SyncJobs:
    """Event iteration and waiting for :class:`rewardd_client.RewarddClient`."""

    retry: RetryPolicy  # what the client provides
    _send: Callable[..., tuple[httpx.Response, int]]
    get_job: Callable[[str], dict[str, Any]]

    def iter_events(self, job_id: str, last_event_id: EventId | None = None
                    ) -> Iterator[JobEvent]:
        """The job's events as they happen, ending after its final event; from after
        ``last_event_id`` when given. A dropped connection is resumed from the last id seen,
        so each stored event is yielded once."""
        cursor = EventCursor(self.retry, job_id, last_event_id)
        while True:
            response, _ = self._send("GET", cursor.path, resendable=True,
                                     headers=cursor.headers(), stream=True)
            cursor.connected()
            dropped = None
            try:
                for line in response.iter_lines():
                    event = cursor.feed(line)
                    if event is not None:
                        yield event
                        if cursor.done:
                            return
            except httpx.TransportError as exc:
                dropped = exc
            finally:
                response.close()
            if dropped is None and self.get_job(job_id)["state"] in FINAL_STATES:
                return  # its final event came before last_event_id
            time.sleep(cursor.reconnect_wait(dropped))

    def wait_job(self, job_id: str) -> dict[str, Any]:
        """Block until the job reaches a final state; the job as ``get_job`` shows it then."""
        for _ in self.iter_events(job_id):
            pass
        return self.get_job(job_id)

    def result(self, job_id: str) -> dict[str, Any]:
        """The job's ``/v1/score`` response once it succeeded; :class:`JobFailed` if it
        failed or was cancelled."""
        return _outcome(self.wait_job(job_id))


class AsyncJobs:
    """The same as :class:`SyncJobs`, for :class:`rewardd_client.AsyncRewarddClient`."""

    retry: RetryPolicy
    _send: Callable[..., Awaitable[tuple[httpx.Response, int]]]
    get_job: Callable[[str], Awaitable[dict[str, Any]]]

    async def iter_events(self, job_id: str, last_event_id: EventId | None = None
                          ) -> AsyncIterator[JobEvent]:
        """See :meth:`SyncJobs.iter_events`."""
        cursor = EventCursor(self.retry, job_id, last_event_id)
        while True:
            response, _ = await self._send("GET", cursor.path, resendable=True,
                                           headers=cursor.headers(), stream=True)
            cursor.connected()
            dropped = None
            try:
                async for line in response.aiter_lines():
                    event = cursor.feed(line)
                    if event is not None:
                        yield event
                        if cursor.done:
                            return
            except httpx.TransportError as exc:
                dropped = exc
            finally:
                await response.aclose()
            if dropped is None and (await self.get_job(job_id))["state"] in FINAL_STATES:
                return
            await asyncio.sleep(cursor.reconnect_wait(dropped))

    async def wait_job(self, job_id: str) -> dict[str, Any]:
        """See :meth:`SyncJobs.wait_job`."""
        async for _ in self.iter_events(job_id):
            pass
        return await self.get_job(job_id)

    async def result(self, job_id: str) -> dict[str, Any]:
        """See :meth:`SyncJobs.result`."""
        return _outcome(await self.wait_job(job_id))
