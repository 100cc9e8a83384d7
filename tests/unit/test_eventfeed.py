"""Event streams read their history in pages and share one store probe per resource
(issue 28, rows 3 and 8).

A late stream on a long history used to copy all of it at its first read (+157 MB per
stream); a thousand watchers of one job were a thousand polls of the store. Here: the stores'
paged reads (memory and Redis, jobs and sessions) are bounded by events and bytes; many
watchers of one resource cost one probe per change, and a caught-up watcher reads nothing;
a watcher that is behind reads one page at a time, only as its client takes them.
The Redis store uses its own database (:data:`STATE_DB`), flushed before and after.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest
import redis
import redis.asyncio

from rewardd.service.eventfeed import Changed, Feeds
from rewardd.service.events import PAGE_BYTES, PAGE_EVENTS, Event, decode_page, encode_event
from rewardd.service.jobs.store import Job, MemoryJobStore, RedisJobStore
from rewardd.service.sessions.redis_store import RedisStore
from rewardd.service.sessions.store import MemoryStore

STATE_DB = 13
"""A Redis database of its own (see tests/unit/test_last_event_id.py for the others)."""
STATE_URL = f"redis://127.0.0.1:6379/{STATE_DB}"


def raw(i: int, size: int = 10) -> bytes:
    return encode_event("group", {"i": i, "pad": "x" * size})


def test_a_page_stops_at_its_byte_bound_but_holds_at_least_one_event() -> None:
    big = [raw(i, PAGE_BYTES // 3) for i in range(10)]
    page = decode_page(big, 4)
    assert [e.seq for e in page] == [5, 6]  # a third would pass PAGE_BYTES
    huge = [raw(0, 2 * PAGE_BYTES), raw(1)]
    assert [e.seq for e in decode_page(huge, 0)] == [1]  # however big, one goes


async def test_memory_stores_read_one_page_when_asked_and_everything_when_not() -> None:
    jobs = MemoryJobStore(ttl_s=60)
    job = await jobs.create(Job(id="a" * 32, tenant="t", tenant_limit=1), b"{}", "me")
    await jobs.record(job.id, 0, [raw(i) for i in range(250)])
    sessions = MemoryStore(ttl_s=60)
    sessions._events["s"] = [raw(i) for i in range(250)]
    for read in (lambda a, n: jobs.events(job.id, a, n),
                 lambda a, n: sessions.events("s", a, n)):
        page = await read(7, PAGE_EVENTS)
        assert [e.seq for e in page] == list(range(8, 8 + PAGE_EVENTS))
        assert [e.seq for e in await read(240, PAGE_EVENTS)] == list(range(241, 251))
        assert await read(250, PAGE_EVENTS) == []
    assert len(await jobs.events(job.id)) == len(await sessions.events("s")) == 250


@pytest.fixture
async def redis_client() -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(STATE_URL, socket_connect_timeout=3)
    try:
        await client.ping()
    except (redis.ConnectionError, OSError):
        await client.aclose()
        pytest.skip("no Redis at 127.0.0.1:6379 (run under /work/wt/bin/isolated or make test)")
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()


async def test_redis_stores_read_one_bounded_page(redis_client: redis.asyncio.Redis) -> None:
    jobs = RedisJobStore(redis_client, ttl_s=60)
    job = await jobs.create(Job(id="b" * 32, tenant="t", tenant_limit=1), b"{}", "me")
    await jobs.record(job.id, 0, [raw(i) for i in range(250)])
    sessions = RedisStore(redis_client, ttl_s=60)
    await redis_client.rpush("rewardd:sess:s:events", *[raw(i) for i in range(250)])
    for read in (lambda a, n: jobs.events(job.id, a, n),
                 lambda a, n: sessions.events("s", a, n)):
        assert [e.seq for e in await read(7, PAGE_EVENTS)] == list(range(8, 8 + PAGE_EVENTS))
        assert [e.seq for e in await read(240, PAGE_EVENTS)] == list(range(241, 251))
        assert await read(250, PAGE_EVENTS) == []
    assert [e.seq for e in await jobs.events(job.id, 245)] == [246, 247, 248, 249, 250]
    await redis_client.rpush("rewardd:sess:big:events",
                             *[raw(i, PAGE_BYTES // 3) for i in range(5)])
    assert len(await sessions.events("big", 0, PAGE_EVENTS)) == 2  # the byte bound


class Log:
    """A resource's event list, counting the reads the feeds make of it."""

    def __init__(self) -> None:
        self.raws: list[bytes] = []
        self.ended = False
        self.probes = 0
        self.page_reads: list[tuple[int, int]] = []

    async def probe(self) -> tuple[int, bool]:
        self.probes += 1
        return len(self.raws), self.ended

    async def read(self, after: int, limit: int) -> list[Event]:
        self.page_reads.append((after, limit))
        return decode_page(self.raws[after:after + limit], after)


async def collect(feeds: Feeds[bool], log: Log, after: int, out: list[int]) -> None:
    async for item in feeds.follow("r", log.probe, log.read, after, 3600.0,
                                   lambda event: event.kind == "closed"):
        if isinstance(item, Event):
            out.append(item.seq)
        elif isinstance(item, Changed) and item.state:
            return


async def settled(log: Log, probes: int) -> None:
    for _ in range(1000):
        await asyncio.sleep(0)
        if log.probes >= probes:
            return
    raise AssertionError(f"the feed made {log.probes} probes, expected {probes}")


async def test_many_watchers_share_one_probe_per_change_and_read_no_page_when_caught_up(
        ) -> None:
    feeds: Feeds[bool] = Feeds(lambda: 3600.0)  # no ticks: only pokes wake the feed
    log = Log()
    outs: list[list[int]] = [[] for _ in range(200)]
    tasks = [asyncio.create_task(collect(feeds, log, 0, out)) for out in outs]
    await settled(log, 1)
    for change in range(1, 6):
        log.raws.append(raw(change))
        feeds.poke("r")
        await settled(log, 1 + change)
        await asyncio.sleep(0.01)  # let every watcher take the change
    log.raws.append(encode_event("closed", {}))
    log.ended = True
    feeds.poke("r")
    await asyncio.gather(*tasks)
    assert all(out == [1, 2, 3, 4, 5, 6] for out in outs)
    assert log.probes == 7  # one per change for all 200 watchers, not one per watcher
    assert len(log.page_reads) == 6  # the feed's tail reads; no watcher read a page
    assert feeds.get("r") is None  # the last watcher gone, the feed stopped


async def test_a_late_watcher_reads_one_page_at_a_time_as_it_is_taken() -> None:
    feeds: Feeds[bool] = Feeds(lambda: 3600.0)
    log = Log()
    log.raws = [raw(i) for i in range(1000)]
    stream = feeds.follow("r", log.probe, log.read, 0, 3600.0, lambda event: False)
    first = await anext(stream)
    assert isinstance(first, Event) and first.seq == 1
    # a client that takes nothing more: the stream read the feed's tail and one page
    assert log.page_reads == [(1000 - PAGE_EVENTS, PAGE_EVENTS), (0, PAGE_EVENTS)]
    seqs = [first.seq]
    while len(seqs) < 1000:
        item = await anext(stream)
        assert isinstance(item, Event)
        seqs.append(item.seq)
    assert seqs == list(range(1, 1001))  # in order, none lost between pages
    # pages until the tail, whose events came from memory
    assert log.page_reads[1:] == [(after, PAGE_EVENTS)
                                  for after in range(0, 1000 - PAGE_EVENTS, PAGE_EVENTS)]
    await stream.aclose()
    assert feeds.get("r") is None


async def test_a_failing_store_reaches_every_watcher() -> None:
    feeds: Feeds[bool] = Feeds(lambda: 3600.0)

    async def probe() -> tuple[int, bool]:
        raise ConnectionError("redis is down")

    async def read(after: int, limit: int) -> list[Event]:
        return []

    stream = feeds.follow("r", probe, read, 0, 3600.0, lambda event: False)
    with pytest.raises(ConnectionError, match="redis is down"):
        await anext(stream)
    await stream.aclose()


async def test_a_quiet_feed_sends_heartbeats() -> None:
    feeds: Feeds[bool] = Feeds(lambda: 3600.0)
    log = Log()
    stream = feeds.follow("r", log.probe, log.read, 0, 0.01, lambda event: False)
    assert isinstance(await anext(stream), Changed)  # the first probe
    assert await anext(stream) is None  # then silence: a heartbeat
    await stream.aclose()
