"""Judge backend for OpenAI-compatible chat endpoints: vLLM, SGLang, hosted APIs.

httpx does the HTTP; what is written here is what a judge needs around it and no client
library gives as one piece: a batch of requests sent concurrently under a bound per backend,
retries with backoff on 429, 5xx, timeouts and connection errors only (honouring
``Retry-After``), a process-wide reply cache keyed by (backend, model, rendered prompt,
sampling parameters), and usage per reply. (The ``openai`` package would add a dependency
for one endpoint and retries that cannot be told apart from ours in the usage counts.)

Verifiers run synchronously in worker processes, so each process keeps one event loop in a
daemon thread (:class:`_LoopThread`) that owns the connection pools; :meth:`chat` hands it a
batch and waits. The thread and the pools are made again after a fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import replace
from typing import Annotated, Any, Coroutine, Sequence

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

from rewardd.verifiers.judge.backend import (ChatBackend, ChatReply, ChatRequest, ChatResult,
                                     JudgeUnavailable)
from rewardd.verifiers.judge.fleet import FleetSlots, new_lease_token
from rewardd.verifiers.judge.shared_cache import DEFAULT_TTL_S, SharedReplyCache

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
"""Worth another try: rate limits, overload and gateway errors. Any other 4xx means the
request itself is wrong, and asking again would only be refused again."""

BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 8.0
"""Full-jitter exponential backoff between attempts: uniform in [0, min(max, base * 2^k)],
or the server's ``Retry-After`` when it sent one (capped at BACKOFF_MAX_S)."""

CACHE_ENTRIES = 20_000
DEFAULT_MAX_CONCURRENCY = 16


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class OpenAIConfig:
    """One OpenAI-compatible backend, validated when built (a backends file with
    ``"max_concurrency": 0`` is refused at the first call, with the field and the reason,
    rather than hanging or failing deep inside a batch)."""

    name: str
    base_url: str
    model: str
    api_key: str | None = None
    max_concurrency: Annotated[int, Field(ge=1, le=4096)] = DEFAULT_MAX_CONCURRENCY
    """Requests in flight at once from one process (each worker process has its own)."""
    endpoint_max_concurrency: Annotated[int, Field(ge=1, le=4096)] | None = None
    """The configured backend's own bound, shared in this process by every backend built
    from it with a request's override (another model, timeout or a lower bound), so that
    overrides cannot multiply what the operator allowed; None: only ``max_concurrency``."""
    fleet_max_concurrency: Annotated[int, Field(ge=1)] | None = None
    """Requests in flight at once from every process together (Redis leases,
    :mod:`rewardd.verifiers.judge.fleet`); None: no fleet-wide bound."""
    state_url: str | None = None
    """Redis for the fleet bound (see :func:`rewardd.verifiers.judge.fleet.state_url`)."""
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    max_retries: Annotated[int, Field(ge=0, le=20)] = 4
    cost_per_1k_prompt: Annotated[float, Field(ge=0)] = 0.0
    cost_per_1k_completion: Annotated[float, Field(ge=0)] = 0.0
    cache: bool = True
    """Answer equal requests from the caches (this process's, and the shared one if set)."""
    shared_cache_url: str | None = None
    """Redis for replies shared by every process (:mod:`rewardd.verifiers.judge.shared_cache`)."""
    shared_cache_ttl_s: Annotated[float, Field(gt=0)] = DEFAULT_TTL_S


class ReplyCache:
    """A bounded LRU of replies by :meth:`ChatRequest.cache_key`, shared by the backends of a
    process. Only answers are cached, never failures."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self._data: OrderedDict[str, ChatReply] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> ChatReply | None:
        with self._lock:
            reply = self._data.get(key)
            if reply is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return reply

    def put(self, key: str, reply: ChatReply) -> None:
        with self._lock:
            self._data[key] = reply
            self._data.move_to_end(key)
            while len(self._data) > self.entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


CACHE = ReplyCache()

_ENDPOINT_BOUNDS: dict[tuple[int, str, str], asyncio.Semaphore] = {}
"""(process, backend name, base_url) -> the configured bound every override of that backend
shares (all used on the process's one loop thread)."""
_NO_BOUND = contextlib.nullcontext()


class _LoopThread:
    """An event loop in a daemon thread, one per process (made again after a fork)."""

    _instance: _LoopThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="rewardd-judge-io",
                                  daemon=True)
        thread.start()

    @classmethod
    def get(cls) -> _LoopThread:
        with cls._lock:
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = cls()
            return cls._instance

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop and wait for it. If the wait is interrupted (a check's
        soft deadline raises into this thread), the coroutine is cancelled with it: its
        requests are dropped and their concurrency slots freed at once, instead of staying
        held for a group that has already given up."""
        future: Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise


class OpenAIChatBackend(ChatBackend):
    """``POST {base_url}/chat/completions`` for every request of a batch, concurrently."""

    def __init__(self, config: OpenAIConfig, cache: ReplyCache | None = CACHE) -> None:
        self.config = config
        self.name = config.name
        self.model = config.model
        self.cost_per_1k_tokens = (config.cost_per_1k_prompt, config.cost_per_1k_completion)
        self._cache = cache if config.cache else None
        self._shared_cache = (SharedReplyCache(config.shared_cache_url,
                                               config.shared_cache_ttl_s)
                              if self._cache is not None and config.shared_cache_url
                              else None)
        self._client: Any = None
        self._semaphore: asyncio.Semaphore | None = None
        self._endpoint_bound: asyncio.Semaphore | None = None
        self._pid: int | None = None
        self.posts = 0
        """HTTP requests this backend has sent in this process (retries included)."""
        self._fleet: FleetSlots | None = None
        if config.fleet_max_concurrency is not None:
            if not config.state_url:
                raise ValueError(f"judge backend {config.name!r}: fleet_max_concurrency needs "
                                 "Redis: set REWARDD_STATE_URL (or REWARDD_JUDGE_STATE_URL)")
            self._fleet = FleetSlots(config.state_url, f"rewardd:judge-slots:{config.name}",
                                     config.fleet_max_concurrency, config.timeout_s)

    def chat(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        if not requests:
            return []
        results: list[ChatResult | None] = [None] * len(requests)
        # the endpoint is part of the key: a request may point a backend name elsewhere
        keys = [r.cache_key(f"{self.name}@{self.config.base_url}", self.model) for r in requests]
        todo: dict[str, list[int]] = {}  # equal requests of one batch are sent once
        for i, key in enumerate(keys):
            hit = self._cache.get(key) if self._cache is not None else None
            if hit is not None:
                results[i] = _cached(hit)
            elif self._cache is not None:
                todo.setdefault(key, []).append(i)
            else:
                todo[f"{i}"] = [i]
        if todo and self._shared_cache is not None:
            for key, reply in self._shared_cache.get_many(todo).items():
                for i in todo.pop(key):
                    results[i] = _cached(reply)
                self._cache.put(key, reply)  # type: ignore[union-attr]
        if todo:
            firsts = [indexes[0] for indexes in todo.values()]
            answers = _LoopThread.get().run(self._send_all([requests[i] for i in firsts]))
            fresh: dict[str, ChatReply] = {}
            for (key, indexes), answer in zip(todo.items(), answers):
                results[indexes[0]] = answer
                for i in indexes[1:]:
                    results[i] = (_cached(answer) if isinstance(answer, ChatReply)
                                  else replace(answer, duplicate=True))
                if self._cache is not None and isinstance(answer, ChatReply):
                    self._cache.put(key, answer)
                    fresh[key] = answer
            if self._shared_cache is not None:
                self._shared_cache.put_many(fresh)
        return results  # type: ignore[return-value]

    async def _send_all(self, requests: list[ChatRequest]) -> list[ChatResult]:
        self._ensure_client()
        answers = await asyncio.gather(*(self._send(r) for r in requests),
                                       return_exceptions=True)
        # one request's unforeseen error is its own failure, never the whole batch's
        return [JudgeUnavailable(f"{self.name}: {type(a).__name__}: {a}")
                if isinstance(a, Exception) else a for a in answers]

    def _ensure_client(self) -> None:
        """The client and the bound belong to this process's loop thread."""
        if self._client is None or self._pid != os.getpid():
            import httpx

            headers = {"Content-Type": "application/json"}
            if self.config.api_key:
                headers["Authorization"] = f"Bearer {self.config.api_key}"
            limit = max(self.config.max_concurrency, 1)
            self._client = httpx.AsyncClient(
                base_url=self.config.base_url.rstrip("/"), headers=headers,
                timeout=httpx.Timeout(self.config.timeout_s, connect=min(self.config.timeout_s,
                                                                         10.0)),
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit))
            self._semaphore = asyncio.Semaphore(limit)
            self._endpoint_bound = None
            if self.config.endpoint_max_concurrency is not None:
                key = (os.getpid(), self.name, self.config.base_url)
                self._endpoint_bound = _ENDPOINT_BOUNDS.setdefault(
                    key, asyncio.Semaphore(self.config.endpoint_max_concurrency))
            self._pid = os.getpid()

    async def _send(self, request: ChatRequest) -> ChatResult:
        import httpx

        assert self._semaphore is not None
        body = request.payload(self.model)
        last = "no attempt made"
        status: int | None = None
        attempts = 0
        for attempt in range(self.config.max_retries + 1):
            attempts = attempt + 1
            wait: float | None = None
            async with self._endpoint_bound or _NO_BOUND, self._semaphore:
                # the lease's token exists before it is taken, so that a batch cancelled
                # while the slot is being taken still gives the slot back
                lease = new_lease_token() if self._fleet is not None else None
                try:
                    if self._fleet is not None:
                        await self._fleet.acquire(lease)
                    self.posts += 1
                    response = await self._client.post("/chat/completions", json=body)
                except (httpx.TimeoutException, httpx.TransportError) as exc:
                    status, last = None, f"{type(exc).__name__}: {exc}"
                except httpx.HTTPError as exc:  # e.g. a body that does not decode: not transient
                    status, last = None, f"{type(exc).__name__}: {exc}"
                    break
                else:
                    status = response.status_code
                    if status == 200:
                        return _reply(response, attempts)
                    last = f"HTTP {status}: {response.text[:300]}"
                    if status not in RETRY_STATUSES:
                        break
                    wait = _retry_after(response.headers.get("retry-after"))
                finally:
                    if self._fleet is not None:
                        await self._fleet.release(lease)
            if attempt < self.config.max_retries:
                cap = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** attempt)
                await asyncio.sleep(wait if wait is not None else random.uniform(0, cap))
        return JudgeUnavailable(f"{self.name} ({self.model}) at {self.config.base_url}: {last}"
                                f" (after {attempts} attempt{'s' if attempts > 1 else ''})",
                                status, attempts)


def _cached(reply: ChatReply) -> ChatReply:
    """A reply served without asking (its usage is not spent again)."""
    return ChatReply(reply.text, reply.finish_reason, reply.prompt_tokens,
                     reply.completion_tokens, reply.refusal, cached=True)


def _reply(response: Any, attempts: int) -> ChatResult:
    try:
        data = response.json()
        choice = data["choices"][0]
        message = choice.get("message") or {}
        usage = data.get("usage") or {}
        return ChatReply(text=message.get("content") or "",
                         finish_reason=choice.get("finish_reason"),
                         prompt_tokens=int(usage.get("prompt_tokens") or 0),
                         completion_tokens=int(usage.get("completion_tokens") or 0),
                         refusal=message.get("refusal"), attempts=attempts)
    except Exception as exc:  # a 200 that is not a chat completion
        return JudgeUnavailable(f"malformed chat completion ({type(exc).__name__}: {exc}): "
                                f"{response.text[:300]}", 200, attempts)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form only), capped."""
    if not value:
        return None
    try:
        return min(max(float(value), 0.0), BACKOFF_MAX_S)
    except ValueError:
        return None
