"""The worker census and the queue depths of the Celery executor: how many workers and worker
slots consume each queue, and how many messages wait in each.

The census is one broadcast (:data:`~rewardd.workers.celery_app.CENSUS_COMMAND`) that collects
replies for :data:`CENSUS_TIMEOUT_S`, taken in the background at most every
:data:`CENSUS_EVERY_S` and read by /readyz, the worker metrics, the packing of small groups
into tasks (:mod:`rewardd.workers.packing`) and each queue's dispatch window
(:mod:`rewardd.workers.publisher`). A scrape never waits for a broadcast of its own: it reads
the last census and starts a new one when that is stale. Whether a queue has a *live*
consumer is the watchdog's question (:mod:`rewardd.workers.watchdog`, from heartbeats); the
census answers how big the fleet is.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypedDict
from urllib.parse import urlsplit

import redis
from celery import Celery

from rewardd.workers.broker_probe import queue_lists
from rewardd.workers.celery_app import CENSUS_COMMAND
from rewardd.workers.routing import Router
from rewardd.workers.settings import WorkerSettings

CENSUS_TIMEOUT_S = 0.5
CENSUS_EVERY_S = 10.0
"""The worker census (for /readyz, the worker metrics and packing) is one broadcast that
collects replies for CENSUS_TIMEOUT_S, taken in the background at most every
CENSUS_EVERY_S."""

CENSUS_EMPTY_EVERY_S = 1.0
"""A census that heard no worker (or failed) is retaken after this instead: a fleet that
scales up from zero, or an API that started before its workers, shows its workers in the
metrics and the packing within a second or two, not after CENSUS_EVERY_S (under load the
first broadcast can miss a worker that is still starting)."""

DEPTH_TIMEOUT_S = 1.0
"""Connect and read timeout of the queue-depth reads of a /metrics scrape."""


class CensusReport(TypedDict, total=False):
    """The last census, as /readyz shows it (``describe()``)."""

    workers: int | None
    """Workers that answered; None when the broadcast failed (then ``error`` says why)."""
    error: str
    workers_by_queue: dict[str, int]
    slots_by_queue: dict[str, int]
    """Pool processes of the workers consuming each queue."""


class FleetCensus:
    """The census (see the module doc) and the queue depths. Its methods are callable from
    any thread (the loop's /readyz, the /metrics scrape's thread); the census itself runs in
    the executor's broker I/O pool."""

    def __init__(self, app: Celery, router: Router, settings: WorkerSettings,
                 io: ThreadPoolExecutor) -> None:
        self.app = app
        self.router = router
        self.settings = settings
        self.closed = False
        self._io = io
        self._report: CensusReport | None = None
        self._taken_at: float | None = None
        self._job: Future[None] | None = None
        self._lock = threading.Lock()
        self._depth_client: redis.Redis | None = None
        self._depth_keys: dict[str, list[str]] | None = None

    def soon(self) -> None:
        """Start a census in an I/O thread unless one is running or the last is recent."""
        with self._lock:
            if self.closed or (self._job is not None and not self._job.done()):
                return
            if self._taken_at is not None and \
                    time.monotonic() - self._taken_at < self._refresh_after_s():
                return
            try:
                self._job = self._io.submit(self.take)
            except RuntimeError:  # the I/O pool shut down (closing)
                pass

    def _refresh_after_s(self) -> float:
        """CENSUS_EVERY_S after a census that heard workers, CENSUS_EMPTY_EVERY_S after one
        that heard none or failed."""
        heard = (self._report or {}).get("workers")
        return CENSUS_EVERY_S if heard else CENSUS_EMPTY_EVERY_S

    def take(self) -> None:
        """In an I/O thread: which workers answer a broadcast, the queues each consumes and
        its pool size (:func:`rewardd.workers.celery_app.rewardd_census`), summed per queue."""
        try:
            replies: list[dict[str, object]] = []
            for _ in range(2):  # a broadcast right after another sometimes hears nothing
                replies = self.app.control.broadcast(CENSUS_COMMAND, reply=True,
                                                     timeout=CENSUS_TIMEOUT_S) or []
                if replies:
                    break
        except Exception as exc:
            self._report = {"workers": None, "error": f"{type(exc).__name__}: {exc}"}
        else:
            workers = {name: answer for reply in replies for name, answer in reply.items()
                       if isinstance(answer, dict)}
            by_queue: dict[str, int] = {}
            slots: dict[str, int] = {}
            for answer in workers.values():
                size = answer.get("slots")
                for queue in answer.get("queues") or []:
                    by_queue[queue] = by_queue.get(queue, 0) + 1
                    if isinstance(size, int) and size > 0:
                        slots[queue] = slots.get(queue, 0) + size
            self._report = {"workers": len(workers), "workers_by_queue": by_queue,
                            "slots_by_queue": slots}
        self._taken_at = time.monotonic()

    def report(self) -> CensusReport:
        """The last census (empty before the first)."""
        return CensusReport(**(self._report or {}))

    def workers_by_queue(self) -> dict[str, int] | None:
        """Workers consuming each queue (every routed queue, 0 when none), from the last
        census; None before the first successful one. Starts a background census when the
        last is older than CENSUS_EVERY_S, so scrapes add no broadcast of their own."""
        self.soon()
        census = self._report
        if not census or census.get("workers") is None:
            return None
        counts = dict.fromkeys(self.router.queues, 0)
        counts.update(census.get("workers_by_queue") or {})
        return counts

    def slots_by_queue(self) -> dict[str, int]:
        """Worker slots (pool processes) consuming each queue at the last census; empty
        before the first successful one (then nothing is packed)."""
        census = self._report
        return dict(census.get("slots_by_queue") or {}) if census else {}

    def queue_depths(self) -> dict[str, int] | None:
        """Messages waiting in each routed queue: with the Redis transport a queue is a
        list named like it plus one list per priority step (``cpu\\x06\\x163``...), all
        summed; one pipeline of LLENs on a client of its own with short timeouts. Blocking:
        call it off the event loop. None for a broker that is not Redis."""
        if self.closed:
            return None
        keys, url = self.queue_keys(), self.settings.broker_url
        if keys is None or url is None:
            return None
        if self._depth_client is None:
            self._depth_client = redis.Redis.from_url(
                url, socket_connect_timeout=DEPTH_TIMEOUT_S,
                socket_timeout=DEPTH_TIMEOUT_S)
        with self._depth_client.pipeline(transaction=False) as pipe:
            for names in keys.values():
                for name in names:
                    pipe.llen(name)
            sizes = iter(pipe.execute())
        return {queue: sum(next(sizes) for _ in names) for queue, names in keys.items()}

    def queue_keys(self) -> dict[str, list[str]] | None:
        """Redis lists of each queue, as kombu's Redis transport names them; None for a
        broker that is not Redis."""
        if self._depth_keys is None:
            scheme = urlsplit(self.settings.broker_url or "").scheme
            if scheme not in ("redis", "rediss"):
                return None
            self._depth_keys = queue_lists(self.app.conf.broker_transport_options or {},
                                           self.router.queues)
        return self._depth_keys

    def describe(self) -> dict[str, object]:
        """The last census and its age, for /readyz; empty before the first."""
        if self._report is None or self._taken_at is None:
            return {}
        return {**self._report, "census_age_s": round(time.monotonic() - self._taken_at, 1)}

    def close(self) -> None:
        """No census is started any more; the queue-depth client is closed."""
        self.closed = True
        if self._depth_client is not None:
            try:
                self._depth_client.close()
            except Exception:
                pass
