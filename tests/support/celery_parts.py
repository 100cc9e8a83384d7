"""The Celery executor's parts wired as :class:`rewardd.workers.distributed.CeleryExecutor`
wires them, for the tests of one part. Publishing is recorded instead of sent (no task reaches
a worker) and revokes are recorded too."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import redis

from rewardd.service.settings import Settings
from rewardd.workers.celery_app import create_celery
from rewardd.workers.census import FleetCensus
from rewardd.workers.collector import ResultCollector
from rewardd.workers.fairness import Flow
from rewardd.workers.packing import Pack
from rewardd.workers.publisher import Publisher
from rewardd.workers.routing import Router
from rewardd.workers.watchdog import FleetWatchdog

DEAD_BROKER = "redis://127.0.0.1:1/0"
"""Nothing listens there: connecting fails at once."""

PARTS_DB = 15
"""The Redis database of the parts' integration tests; no other test uses it."""


@contextlib.contextmanager
def empty_parts_db(host: str, port: int) -> Iterator[redis.Redis]:
    """:data:`PARTS_DB`, flushed before and after."""
    client = redis.Redis(host=host, port=port, db=PARTS_DB)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()


class CeleryParts:
    """Settings, app, router, the broker I/O pool and the four parts. ``collector`` replaces
    the real result collector (a test's recorder); ``published`` lists the first sample of
    every task published, in order; ``revoked`` every revoke broadcast."""

    def __init__(self, broker_url: str = DEAD_BROKER, collector: Any = None,
                 **overrides: Any) -> None:
        self.settings = Settings(**{"broker_url": broker_url, **overrides})
        self.app = create_celery(self.settings)
        self.router = Router.from_text(self.settings.queue_routes)
        self.io = ThreadPoolExecutor(2, thread_name_prefix="test-celery-io")
        self.collector = collector or ResultCollector(self.app.backend, self.settings)
        self.census = FleetCensus(self.app, self.router, self.settings, self.io)
        self.publisher = Publisher(self.app, self.router, self.settings, self.io,
                                   self.collector, self.census)
        self.watchdog = FleetWatchdog(self.app, self.router, self.settings, self.io,
                                      self.publisher, self.collector, self.census)
        self.published: list[str] = []
        self.publisher.publish = self.record  # type: ignore[method-assign]
        self.revoked: list[list[str]] = []
        self.app.control.revoke = self.revoked.append  # type: ignore[method-assign]

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """As the executor does on its first call in ``loop``."""
        if isinstance(self.collector, ResultCollector):
            self.collector.bind(loop)
        self.publisher.bind(loop)
        self.watchdog.reset()

    def record(self, jobs: list[tuple[str, Pack]],
               flows: dict[str, Flow] | None = None) -> dict[str, Exception]:
        self.published.extend(pack.samples[0].completion for _, pack in jobs)
        return {}

    def close(self) -> None:
        for part in (self.publisher, self.census, self.watchdog):
            part.close()
        if isinstance(self.collector, ResultCollector):
            self.collector.close()
        self.io.shutdown(wait=False, cancel_futures=True)
        self.app.close()
