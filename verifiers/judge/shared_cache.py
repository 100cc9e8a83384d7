"""Judge replies cached in Redis, shared by every worker process (``REWARDD_JUDGE_CACHE_URL``).

Why beside the per-process cache of :mod:`rewardd.verifiers.judge.openai_compat`: that one only
helps the process that sees a request twice. A batch the trainer sends again after a client
timeout, an evaluation run repeated on the same checkpoint, or an arena's agreement round on
another worker lands on other processes, and the judge would be asked, and paid, again.

Entries are the reply's text, finish reason, refusal and token counts (orjson), under
``rewardd:judge-reply:<request digest>`` with a time to live; the digest is the same
(backend, endpoint, model, rendered prompt, sampling) key as the per-process cache's.
Failures are never stored. When Redis cannot be reached the cache is a miss (logged once)
and judging goes on.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Iterable, Mapping

import orjson

from rewardd.verifiers.judge.backend import ChatReply
from rewardd.verifiers.judge.fleet import check_redis_url

log = logging.getLogger(__name__)

KEY_PREFIX = "rewardd:judge-reply:"
DEFAULT_TTL_S = 86_400.0


class SharedReplyCache:
    """get/put of many replies at once, one Redis round trip each."""

    def __init__(self, url: str, ttl_s: float = DEFAULT_TTL_S) -> None:
        check_redis_url(url, "the judge reply cache URL")
        if not ttl_s > 0:
            raise ValueError(f"the judge reply cache TTL must be positive, not {ttl_s}")
        self.url, self.ttl_ms = url, int(ttl_s * 1000)
        self._client: Any = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._warned = False
        self.hits = self.misses = 0

    def _redis(self) -> Any:
        """A client of this process (made again after a fork)."""
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                import redis

                self._client = redis.Redis.from_url(self.url, socket_connect_timeout=1,
                                                    socket_timeout=2)
                self._pid = os.getpid()
            return self._client

    def get_many(self, keys: Iterable[str]) -> dict[str, ChatReply]:
        keys = list(keys)
        if not keys:
            return {}
        try:
            raw = self._redis().mget([KEY_PREFIX + k for k in keys])
        except Exception as exc:  # Redis down: a miss, never a failed judgement
            self._unavailable(exc)
            return {}
        found = {}
        for key, value in zip(keys, raw):
            if value is not None:
                try:
                    found[key] = ChatReply(**orjson.loads(value))
                except (TypeError, ValueError):  # written by another version: ask again
                    continue
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def put_many(self, replies: Mapping[str, ChatReply]) -> None:
        if not replies:
            return
        try:
            pipe = self._redis().pipeline(transaction=False)
            for key, reply in replies.items():
                pipe.set(KEY_PREFIX + key, orjson.dumps({
                    "text": reply.text, "finish_reason": reply.finish_reason,
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens, "refusal": reply.refusal}),
                    px=self.ttl_ms)
            pipe.execute()
        except Exception as exc:
            self._unavailable(exc)

    def _unavailable(self, exc: Exception) -> None:
        if not self._warned:
            log.warning("judge reply cache at %s unavailable (%s: %s); asking the judge",
                        self.url, type(exc).__name__, exc)
            self._warned = True
