"""One shared reader per watched stream in this process, and reads of its history in pages.

Every open event stream (a job's or a session's, REST or gRPC) used to poll the store on its
own, every 0.1-0.25 s, and read *every* stored event after its position at each read: a
thousand watchers of one job were a thousand polls (most of an API's CPU), and a client that
opened a stream late and never read held a copy of the whole history (hundreds of MB).

Here the watchers of one resource in this process share one :class:`Feed`: a single task
probes the store (its latest event id and the little state a watcher needs, e.g. a job's
progress) every ``poll_s``, or at once when this process changed the resource
(:meth:`Feeds.poke`), keeps the newest page of events it saw appear (the *tail*), and wakes
every watcher when something changed. A watcher that is caught up takes its new events from
the tail without reading the store; one that is behind (it resumed from an old
``Last-Event-ID``, or reads slowly) reads its own pages, each at most
:data:`~rewardd.service.events.PAGE_EVENTS` events and
:data:`~rewardd.service.events.PAGE_BYTES` bytes, and the next page only after the previous
one went to its client. So a stalled reader holds one page, and the store is read once per
change per resource, not once per watcher per tick.

Another pod's changes (Redis) are seen by the probe, one per resource per process.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Generic, TypeVar

from rewardd.service.events import PAGE_EVENTS, Event

S = TypeVar("S")

Probe = Callable[[], Awaitable[tuple[int, S]]]
"""``() -> (the id of the resource's latest stored event, the state its watchers need)``;
compared to the previous probe's answer to tell a change."""
PageReader = Callable[[int, int], Awaitable[list[Event]]]
"""``(after, limit) -> at most limit events with ids after ``after``, in order`` (the store's
paged read, which may also stop early at its byte bound)."""


@dataclass(frozen=True, slots=True)
class Changed(Generic[S]):
    """The resource changed; ``state`` is what the probe saw (after the events it counted)."""

    state: S


class Feed(Generic[S]):
    """The shared view of one resource (see the module docstring)."""

    def __init__(self, probe: Probe[S], read: PageReader,
                 poll_s: Callable[[], float]) -> None:
        self.probe = probe
        self.read = read
        self.poll_s = poll_s
        self.version = 0
        """Bumped at every change the probe saw (the first probe is version 1)."""
        self.snapshot: tuple[int, S] | None = None
        self.error: BaseException | None = None
        """The last probe's failure (the store is down): each watcher raises it."""
        self.tail: list[Event] = []
        self.reads = 0
        """Store reads made by this feed (probes and tail reads): what the watchers share."""
        self.watchers = 0
        self._changed = asyncio.Event()
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def poke(self) -> None:
        """This process changed the resource: probe now rather than at the next tick."""
        self._poked.set()

    async def _run(self) -> None:
        while True:
            self._poked.clear()
            try:
                await self._probe()
            except Exception as exc:  # the store failed: every watcher hears it
                self.error = exc
                self._publish()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poked.wait(), self.poll_s())

    async def _probe(self) -> None:
        snapshot = await self.probe()
        self.reads += 1
        if snapshot == self.snapshot and self.error is None:
            return
        seen = self.snapshot[0] if self.snapshot is not None else 0
        last = snapshot[0]
        if last > seen:  # the newest page of what appeared: the caught-up watchers' events
            self.tail = await self.read(max(seen, last - PAGE_EVENTS), PAGE_EVENTS)
            self.reads += 1
        elif last < seen:  # the stream was dropped and made anew (a standing session)
            self.tail = []
        self.snapshot, self.error = snapshot, None
        self._publish()

    def _publish(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, seen: int, timeout: float) -> bool:
        """True once the feed changed since version ``seen`` (at once if it already has);
        False after ``timeout`` seconds without a change. Raises the store's error."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while self.version <= seen:
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return False
        if self.error is not None:
            raise self.error
        return True

    def cached(self, after: int) -> list[Event]:
        """The tail's events after ``after`` when the tail holds the very next one, else []."""
        tail = self.tail
        if not tail or not tail[0].seq <= after + 1 <= tail[-1].seq:
            return []
        return tail[after + 1 - tail[0].seq:]

    async def events(self, after: int, upto: int) -> AsyncIterator[Event]:
        """The stored events after ``after``, at least up to ``upto``, one page at a time:
        from the shared tail when it holds them, else read from the store (the next page
        only once the caller took every event of this one)."""
        while after < upto:
            page = self.cached(after) or await self.read(after, PAGE_EVENTS)
            if not page:  # the history ended early (expired, or made anew)
                return
            for event in page:
                yield event
                after = event.seq


class Feeds(Generic[S]):
    """The feeds of one kind of resource (jobs, sessions) in this process, by id; a feed
    lives while someone watches it."""

    def __init__(self, poll_s: Callable[[], float]) -> None:
        self.poll_s = poll_s
        self._feeds: dict[str, Feed[S]] = {}

    @contextlib.asynccontextmanager
    async def watch(self, key: str, probe: Probe[S], read: PageReader
                    ) -> AsyncIterator[Feed[S]]:
        """The feed of resource ``key`` (started by its first watcher with ``probe`` and
        ``read``; stopped when its last watcher leaves)."""
        feed = self._feeds.get(key)
        if feed is None:
            feed = self._feeds[key] = Feed(probe, read, self.poll_s)
            feed.start()
        feed.watchers += 1
        try:
            yield feed
        finally:
            feed.watchers -= 1
            if feed.watchers == 0 and self._feeds.get(key) is feed:
                del self._feeds[key]
                feed.stop()

    async def follow(self, key: str, probe: Probe[S], read: PageReader, after: int,
                     heartbeat_s: float, ends: Callable[[Event], bool]
                     ) -> AsyncIterator[Event | Changed[S] | None]:
        """A stream of resource ``key`` from event id ``after``: its events in order, after
        each change a :class:`Changed` with the probe's state (the caller ends the stream
        on it, or tells its client), ``None`` after ``heartbeat_s`` without an event; ends
        after an event for which ``ends`` is true."""
        loop = asyncio.get_running_loop()
        quiet, seen = loop.time(), 0
        async with self.watch(key, probe, read) as feed:
            while True:
                if not await feed.wait(seen, heartbeat_s - (loop.time() - quiet)):
                    yield None
                    quiet = loop.time()
                    continue
                seen = feed.version
                assert feed.snapshot is not None  # a feed that changed has a snapshot
                last, state = feed.snapshot
                async for event in feed.events(after, last):
                    yield event
                    after, quiet = event.seq, loop.time()
                    if ends(event):
                        return
                yield Changed(state)

    def poke(self, key: str) -> None:
        """This process changed resource ``key``: its watchers here hear it at once."""
        feed = self._feeds.get(key)
        if feed is not None:
            feed.poke()

    def get(self, key: str) -> Feed[S] | None:
        """The live feed of ``key`` (for tests and metrics)."""
        return self._feeds.get(key)
