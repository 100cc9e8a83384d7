"""Stored events and their server-sent-event framing, shared by job and session streams.

A job and a session each keep an append-only list of events in their store (in memory, or in
Redis where every API pod reads the same list). An event's id is its 1-based position in that
list, so a client that lost its connection reconnects to any pod with ``Last-Event-ID`` and
gets exactly the events after it (:func:`resume_after`). REST frames them as
``text/event-stream`` (:func:`sse`, :data:`KEEP_ALIVE`); gRPC's WatchJob sends the same
events as messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import orjson

from rewardd.advantages.errors import Loc, RequestInvalid, error

HEARTBEAT_S = 15.0
"""A stream silent this long sends a keep-alive (REST: a comment line), so proxies that cut
idle connections leave it open."""

KEEP_ALIVE = b": keep-alive\n\n"
"""The SSE comment line a quiet stream sends every :data:`HEARTBEAT_S`."""

LAST_EVENT_ID: Loc = ("header", "Last-Event-ID")

PAGE_EVENTS = 100
"""A stream reads its stored history at most this many events at a time (and the next page
only after this one went to its client), so a slow or stalled reader holds one page, never
the whole history (:mod:`rewardd.service.eventfeed`)."""
PAGE_BYTES = 1024 * 1024
"""...and at most this many bytes of events per page (at least one event, however big)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One stored event: ``seq`` is its id in the stream (1, 2, ...)."""

    seq: int
    kind: str
    data: bytes
    """The event's JSON."""


def encode_event(kind: str, data: dict[str, Any]) -> bytes:
    """Stored form: ``kind\\n<json>`` (orjson never writes a raw newline)."""
    return kind.encode() + b"\n" + orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_event(seq: int, raw: bytes) -> Event:
    """The stored form back as the ``seq``-th event of its stream."""
    kind, _, data = raw.partition(b"\n")
    return Event(seq, kind.decode(), data)


def decode_page(raws: Iterable[bytes], after: int, max_bytes: int = PAGE_BYTES
                ) -> list[Event]:
    """Stored events ``raws`` (the ones after id ``after``, in order) decoded up to
    ``max_bytes`` of them: at least the first, then while the page stays under the bound."""
    page: list[Event] = []
    size = 0
    for seq, raw in enumerate(raws, start=after + 1):
        if page and size + len(raw) > max_bytes:
            break
        page.append(decode_event(seq, raw))
        size += len(raw)
    return page


async def read_redis_list(client: Any, list_key: str, after: int, limit: int | None
                          ) -> list[Event]:
    """The events after id ``after`` of the Redis list ``list_key`` (jobs' and sessions'
    stores); with ``limit``, one page (:func:`decode_page`) read with one bounded LRANGE."""
    end = -1 if limit is None else after + max(1, limit) - 1
    raw = await client.lrange(list_key, after, end)
    if limit is not None:
        return decode_page(raw, after)
    return [decode_event(seq, item) for seq, item in enumerate(raw, start=after + 1)]


def sse(event_id: int | None, kind: str, data: bytes) -> bytes:
    """One event as ``text/event-stream`` (no ``id:`` line for ``event_id`` None: an event
    the client cannot resume after, such as a job's progress)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\n".encode() + b"data: " + data + b"\n\n"


class EventLog(Protocol):
    """What :func:`resume_after` needs of a store of streams (jobs, sessions)."""

    async def last_event(self, stream_id: str) -> int:
        """The id of the stream's latest event (0: none yet)."""
        ...


_EVENT_ID = re.compile(r"[0-9]{1,19}")


async def resume_after(log: EventLog, stream_id: str, header: str | None,
                       loc: Loc = LAST_EVENT_ID) -> int:
    """The event id a ``Last-Event-ID`` header resumes after (0 without one); a 422 naming
    the header unless it is an id the stream has sent.

    An id past the end is refused rather than read as "resume from the end": it names no
    event the client could have seen, so the client has lost track of the stream, and an
    empty stream would hide that."""
    text = (header or "").strip()
    if not text:
        return 0
    last = await log.last_event(stream_id)
    if _EVENT_ID.fullmatch(text) is None or int(text) > last:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise RequestInvalid([error(
            loc, f"must be the id of an event this job's stream has "
            f"sent: an integer from 0 to {last} (its latest event so far); got {shown!r}. "
            "Omit the header to read the stream from its start")])
    return int(text)
