"""Stuck work, read from the broker at scrape time: unacknowledged tasks and the age of the
oldest message waiting in each queue.

Why this reads kombu's Redis layout instead of asking Celery: Celery has no API for either
(``inspect reserved`` is a broadcast that only live workers answer, and a worker that died
holding a message is exactly the case to see). kombu's Redis transport keeps every delivered,
unacknowledged message in one hash (``unacked``: delivery tag -> JSON ``[message, exchange,
routing_key]``) and its delivery time in a sorted set (``unacked_index``); a queue is a list
that is ``LPUSH``-ed and ``BRPOP``-ed, so its oldest message is at index -1.

Both reads run as one Lua script each, so Redis sends back counts and timestamps, not the
messages (a task can carry megabytes of completions): the script scans the values in Redis's
memory (one pass; the unacked hash holds at most one message per worker slot, since workers
prefetch one) and returns, per routing key, the count and the earliest delivery time; and,
per queue, the ``expires`` header of its oldest message. A message's publication time is
that expiry minus REWARDD_QUEUE_TIMEOUT_S (the executor sets ``expires`` on every task), so
the API and the workers must share that setting (they must already).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

import redis
from kombu.transport.redis import PRIORITY_STEPS, Channel

UNACKED_SCRIPT = """
local counts, oldest = {}, {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local rk = string.match(all[i + 1], '"([^"]*)"%]$') or ''
  counts[rk] = (counts[rk] or 0) + 1
  local at = tonumber(redis.call('ZSCORE', KEYS[2], all[i]))
  if at and (oldest[rk] == nil or at < oldest[rk]) then oldest[rk] = at end
end
local out = {}
for rk, n in pairs(counts) do
  table.insert(out, rk); table.insert(out, n); table.insert(out, tostring(oldest[rk] or ''))
end
return out
"""
"""Per routing key: ``rk, count, earliest delivery (epoch seconds, '' if unknown)``."""

OLDEST_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  local msg = redis.call('LINDEX', key, -1)
  local at = ''
  if msg then at = string.match(msg, '"expires": "([^"]*)"') or '' end
  table.insert(out, at)
end
return out
"""
"""Per list key: the ``expires`` header (ISO 8601) of its oldest message, '' if none."""


class BrokerProbe:
    """Reads unacknowledged tasks and queue ages from a Redis broker; see the module doc.

    ``keys``: per queue, the Redis lists kombu uses for it (one per priority step);
    ``prefix``: the transport's ``global_keyprefix``."""

    def __init__(self, client: Any, keys: Mapping[str, Sequence[str]], prefix: str,
                 queue_timeout_s: float) -> None:
        self.client = client
        self.keys = {queue: list(names) for queue, names in keys.items()}
        self.prefix = prefix
        self.queue_timeout_s = queue_timeout_s
        self._unacked = client.register_script(UNACKED_SCRIPT)
        self._oldest = client.register_script(OLDEST_SCRIPT)

    def unacked(self, now: float | None = None) -> tuple[dict[str, int], dict[str, float]]:
        """(unacknowledged tasks per queue, seconds since the oldest was delivered); every
        known queue is present (0)."""
        now = time.time() if now is None else now
        raw = self._unacked(keys=[f"{self.prefix}unacked", f"{self.prefix}unacked_index"])
        counts = dict.fromkeys(self.keys, 0)
        ages = dict.fromkeys(self.keys, 0.0)
        for i in range(0, len(raw), 3):
            queue = _text(raw[i])
            counts[queue] = counts.get(queue, 0) + int(raw[i + 1])
            at = _text(raw[i + 2])
            if at:
                ages[queue] = max(ages.get(queue, 0.0), now - float(at))
        return counts, ages

    def oldest_age(self, now: float | None = None) -> dict[str, float]:
        """Seconds the oldest message of each queue has waited (0 when the queue is empty or
        its oldest message has no expiry, e.g. one a foreign client published)."""
        now = time.time() if now is None else now
        flat = [(queue, key) for queue, names in self.keys.items() for key in names]
        if not flat:
            return {}
        raw = self._oldest(keys=[key for _, key in flat])
        ages = dict.fromkeys(self.keys, 0.0)
        for (queue, _), expires in zip(flat, raw):
            text = _text(expires)
            if not text:
                continue
            published = datetime.fromisoformat(text).timestamp() - self.queue_timeout_s
            ages[queue] = max(ages[queue], now - published)
        return ages


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def queue_lists(transport_options: Mapping[str, Any],
                queues: Iterable[str]) -> dict[str, list[str]]:
    """The Redis lists of each queue, as kombu's Redis transport names them: the queue's own
    list plus one per priority step (``cpu\\x06\\x163``...), under the transport's
    ``global_keyprefix``."""
    prefix = transport_options.get("global_keyprefix", "")
    steps = sorted(set(transport_options.get("priority_steps", PRIORITY_STEPS)) | {0})
    sep = transport_options.get("sep", Channel.sep)
    return {queue: [f"{prefix}{queue}" if step == 0 else f"{prefix}{queue}{sep}{step}"
                    for step in steps] for queue in queues}


def probe_for(executor: Any) -> BrokerProbe | None:
    """The probe of a Celery executor's Redis broker (its queues, key prefix and priority
    steps, as kombu names them); None for any other executor or broker."""
    settings = getattr(executor, "settings", None)
    router = getattr(executor, "router", None)
    app = getattr(executor, "app", None)
    url = getattr(settings, "broker_url", None) or ""
    if router is None or app is None or not url.startswith(("redis://", "rediss://")):
        return None
    options = app.conf.broker_transport_options or {}
    client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
    return BrokerProbe(client, queue_lists(options, router.queues),
                       options.get("global_keyprefix", ""), settings.queue_timeout_s)
