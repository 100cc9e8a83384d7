"""Where jobs live: their record, request, result and events, with a time to live.

A job is one ``POST /v1/score`` body run in the background. Its states::

    queued -> running -> succeeded | failed | cancelled

``queued`` lasts from the submit until a runner picks the job up (at once on the pod that
took it, or when a pod resumes it after its first pod died); ``running`` until the result is
stored. The three final states never change again.

Two stores share the interface :class:`JobStore`:

* :class:`MemoryJobStore` (embedded mode, no Redis): jobs live in the API process and are
  **lost when it restarts** (and are not seen by a second API process). Fine for one
  process on one machine, which is what embedded mode is.
* :class:`RedisJobStore` (``REWARDD_STATE_URL`` or the broker set): shared by every API pod,
  and durable across pod restarts. Keys, all under ``rewardd:job:<id>``:

  - ``rewardd:job:<id>`` (hash): tenant, tenant limit, state, done/total, created, started
    and finished times (unix seconds), error, attempts, idempotency key digest, body digest;
  - ``...:body``: the validated request as JSON (deleted once the job finished: only a job
    that must be resumed needs it);
  - ``...:result``: the ``/v1/score`` response as JSON bytes, exactly what the route sends;
  - ``...:events``: the job's event list (group and terminal events) for the SSE stream; an
    event's id is its position in the list (1-based), so ``Last-Event-ID`` resumes exactly
    (the route accepts only ids from 0 to the list's length: LRANGE takes signed 64-bit
    indexes, and an id past the end names no event the client could have seen);
  - ``...:lease``: the pod running the job (see :mod:`rewardd.service.jobs.runner`), with an expiry
    the runner renews;

  and ``rewardd:job-idem:<tenant>:<sha256 of the key>`` -> job id, for ``Idempotency-Key``.
  While a job is active its keys live :data:`ACTIVE_TTL_S` (a generous bound, so nothing
  leaks for ever if every pod vanished); when it finishes, every one of them gets the TTL
  ``job_ttl_s`` and the body and lease are deleted. The set ``rewardd:jobs:active`` lists
  active jobs (for the sweeper that resumes orphans), and one sorted set per state
  (``rewardd:jobs:state:<state>``, scored by the entry's expiry) makes the per-state counts
  of ``rewardd_jobs`` one cheap round trip. Every transition is one Lua script, so two pods
  never both finish a job, and a cancel cannot be overwritten by a late success.
"""

from __future__ import annotations

import abc
import hashlib
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any

from rewardd.service.events import (Event, decode_event, decode_page, encode_event,
                                    read_redis_list)
from rewardd.service.timestamps import iso

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued", "running", "succeeded", "failed", "cancelled")
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
SCORE, REVERIFY = "score", "reverify"
"""Job kinds: a /v1/score body, or a replay of a recorded run."""
ACTIVE = frozenset({QUEUED, RUNNING})
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})

ACTIVE_TTL_S = 7 * 24 * 3600
"""How long the keys of a job that never finishes may live (its pods all vanished)."""

LEASE_S = 10.0
"""A job's lease outlives the last renewal by this long; then another pod resumes it."""


def key_digest(idempotency_key: str) -> str:
    """What is stored of an ``Idempotency-Key``: its SHA-256, never the key itself."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


@dataclass(slots=True)
class Job:
    """A job's record (everything but its request, result and events)."""

    id: str
    tenant: str
    tenant_limit: int
    """The tenant's max_concurrent_jobs at submit (a resumed job re-acquires its slot)."""
    total: int = 0
    """Checks to run: rollouts x reward components."""
    done: int = 0
    state: str = QUEUED
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    attempts: int = 0
    """Times a runner started it (more than 1: resumed after its pod died)."""
    idempotency: str | None = None
    """SHA-256 of the Idempotency-Key it was submitted with."""
    digest: str = ""
    """SHA-256 of the request (to tell a retried submit from a reused key)."""
    kind: str = SCORE
    """What it runs: ``score`` (a /v1/score body) or ``reverify`` (a run's replay)."""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def view(self) -> dict[str, Any]:
        """The job as ``GET /v1/jobs/{id}`` shows it, without ``result``."""
        return {"id": self.id, "state": self.state,
                "progress": {"done": self.done, "total": self.total},
                "created_at": iso(self.created_at), "started_at": iso(self.started_at),
                "finished_at": iso(self.finished_at), "error": self.error,
                "attempts": self.attempts}

    def terminal_event(self, state: str, error: str | None) -> bytes:
        return encode_event(state, {"id": self.id, "state": state, "error": error})

    def to_fields(self) -> dict[str, str]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = "" if value is None else str(value)
        return out

    @classmethod
    def from_fields(cls, raw: dict[Any, Any]) -> Job:
        data = {(k.decode() if isinstance(k, bytes) else k):
                (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}

        def opt_float(name: str) -> float | None:
            return float(data[name]) if data.get(name) else None

        return cls(id=data["id"], tenant=data["tenant"], tenant_limit=int(data["tenant_limit"]),
                   total=int(data.get("total") or 0), done=int(data.get("done") or 0),
                   state=data["state"], created_at=float(data.get("created_at") or 0.0),
                   started_at=opt_float("started_at"), finished_at=opt_float("finished_at"),
                   error=data.get("error") or None, attempts=int(data.get("attempts") or 0),
                   idempotency=data.get("idempotency") or None, digest=data.get("digest", ""),
                   kind=data.get("kind") or SCORE)


class JobStore(abc.ABC):
    """Job records, requests, results and events."""

    durable: bool = False
    """True when jobs outlive this process (other pods can resume them)."""

    def __init__(self, ttl_s: int) -> None:
        self.ttl_s = max(1, int(ttl_s))

    @abc.abstractmethod
    async def create(self, job: Job, body: bytes, owner: str) -> Job:
        """Store a new job, leased to ``owner``. When the tenant already has a live job
        with the same idempotency key, store nothing and return that job instead."""

    @abc.abstractmethod
    async def find(self, tenant: str, idempotency: str) -> Job | None:
        """The tenant's live job submitted with this idempotency key digest."""

    @abc.abstractmethod
    async def get(self, job_id: str) -> Job | None: ...

    @abc.abstractmethod
    async def body(self, job_id: str) -> bytes | None:
        """The request as JSON, kept by durable stores until the job finished (to resume
        it on another pod); None otherwise."""

    @abc.abstractmethod
    async def result(self, job_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def start(self, job_id: str) -> Job | None:
        """Mark the job running (progress back to 0, one more attempt); None when it is no
        longer active (cancelled before it started) or gone."""

    @abc.abstractmethod
    async def record(self, job_id: str, done: int, events: list[bytes]) -> bool:
        """Store progress and append events, only while the job is active; False when it
        is not (cancelled meanwhile)."""

    @abc.abstractmethod
    async def finish(self, job: Job, state: str, *, result: bytes | None = None,
                     error: str | None = None, done: int | None = None) -> Job | None:
        """Move an active job to a final state, append its terminal event, and give every
        key the TTL. A job already final stays as it was. Returns the job afterwards."""

    @abc.abstractmethod
    async def events(self, job_id: str, after: int = 0, limit: int | None = None
                     ) -> list[Event]:
        """Events with ``seq > after``, in order; with ``limit``, one page of them: at most
        ``limit`` events and :data:`~rewardd.service.events.PAGE_BYTES` bytes (at least one
        event when there is one), what a stream reads at a time."""

    @abc.abstractmethod
    async def last_event(self, job_id: str) -> int:
        """The id (``seq``) of the job's latest stored event; 0 before the first."""

    @abc.abstractmethod
    async def renew(self, job_id: str, owner: str) -> str:
        """Renew ``owner``'s lease. ``"ok"``; ``"lost"`` when another pod holds it;
        ``"gone"`` when the job expired; else the job's final state (e.g. cancelled)."""

    @abc.abstractmethod
    async def release(self, job_id: str, owner: str) -> None:
        """Drop ``owner``'s lease (another pod may resume the job at once)."""

    @abc.abstractmethod
    async def orphans(self) -> list[str]:
        """Active jobs whose lease expired (their pod died)."""

    @abc.abstractmethod
    async def claim(self, job_id: str, owner: str) -> bool:
        """Take the lease of an orphan: atomic, so exactly one pod resumes it."""

    @abc.abstractmethod
    def counts(self) -> dict[str, int]:
        """Jobs by state, for ``rewardd_jobs`` (synchronous, thread-safe, one round trip)."""

    async def get_for(self, tenant: str, job_id: str) -> Job | None:
        """The job if it exists **and** belongs to ``tenant`` (else None, the same answer
        as for a job that never existed)."""
        if not _valid_id(job_id):
            return None
        job = await self.get(job_id)
        return job if job is not None and job.tenant == tenant else None

    async def close(self) -> None:
        """Release connections."""


def _valid_id(job_id: str) -> bool:
    return len(job_id) == 32 and all(c in "0123456789abcdef" for c in job_id)


# ---- in the API process ---------------------------------------------------------------------

@dataclass(slots=True)
class _Entry:
    job: Job
    body: bytes | None
    result: bytes | None = None
    events: list[bytes] = field(default_factory=list)
    expires: float = float("inf")


class MemoryJobStore(JobStore):
    """Jobs in this process (embedded mode): gone when it stops, invisible to others."""

    def __init__(self, ttl_s: int) -> None:
        super().__init__(ttl_s)
        self._jobs: dict[str, _Entry] = {}
        self._idem: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()  # counts() runs in the scrape's thread

    def _live(self, job_id: str) -> _Entry | None:
        entry = self._jobs.get(job_id)
        if entry is not None and entry.expires < time.monotonic():
            self._drop(job_id)
            return None
        return entry

    def _drop(self, job_id: str) -> None:
        entry = self._jobs.pop(job_id, None)
        if entry is not None and entry.job.idempotency is not None:
            key = (entry.job.tenant, entry.job.idempotency)
            if self._idem.get(key) == job_id:
                del self._idem[key]

    def _prune(self) -> None:
        now = time.monotonic()
        for job_id in [k for k, e in self._jobs.items() if e.expires < now]:
            self._drop(job_id)

    async def create(self, job: Job, body: bytes, owner: str) -> Job:
        with self._lock:
            self._prune()
            if job.idempotency is not None:
                existing = self._idem.get((job.tenant, job.idempotency))
                if existing is not None and existing in self._jobs:
                    return _copy(self._jobs[existing].job)
                self._idem[(job.tenant, job.idempotency)] = job.id
            # the body is kept only by durable stores: here nobody could resume the job
            self._jobs[job.id] = _Entry(_copy(job), None)
            return _copy(job)

    async def find(self, tenant: str, idempotency: str) -> Job | None:
        with self._lock:
            job_id = self._idem.get((tenant, idempotency))
            entry = self._live(job_id) if job_id is not None else None
            return _copy(entry.job) if entry is not None else None

    async def get(self, job_id: str) -> Job | None:
        with self._lock:
            entry = self._live(job_id)
            return _copy(entry.job) if entry is not None else None

    async def body(self, job_id: str) -> bytes | None:
        entry = self._live(job_id)
        return entry.body if entry is not None else None

    async def result(self, job_id: str) -> bytes | None:
        entry = self._live(job_id)
        return entry.result if entry is not None else None

    async def start(self, job_id: str) -> Job | None:
        with self._lock:
            entry = self._live(job_id)
            if entry is None or not entry.job.active:
                return None
            job = entry.job
            job.state, job.done, job.attempts = RUNNING, 0, job.attempts + 1
            job.started_at = job.started_at or time.time()
            return _copy(job)

    async def record(self, job_id: str, done: int, events: list[bytes]) -> bool:
        with self._lock:
            entry = self._live(job_id)
            if entry is None or not entry.job.active:
                return False
            entry.job.done = done
            entry.events.extend(events)
            return True

    async def finish(self, job: Job, state: str, *, result: bytes | None = None,
                     error: str | None = None, done: int | None = None) -> Job | None:
        with self._lock:
            entry = self._live(job.id)
            if entry is None:
                return None
            current = entry.job
            if current.active:
                current.state, current.error, current.finished_at = state, error, time.time()
                if done is not None:
                    current.done = done
                entry.result, entry.body = result, None
                entry.events.append(current.terminal_event(state, error))
                entry.expires = time.monotonic() + self.ttl_s
            return _copy(current)

    async def events(self, job_id: str, after: int = 0, limit: int | None = None
                     ) -> list[Event]:
        entry = self._live(job_id)
        if entry is None:
            return []
        if limit is None:
            return [decode_event(seq, raw)
                    for seq, raw in enumerate(entry.events[after:], start=after + 1)]
        return decode_page(entry.events[after:after + max(1, limit)], after)

    async def last_event(self, job_id: str) -> int:
        entry = self._live(job_id)
        return len(entry.events) if entry is not None else 0

    async def renew(self, job_id: str, owner: str) -> str:
        entry = self._live(job_id)
        if entry is None:
            return "gone"
        return "ok" if entry.job.active else entry.job.state

    async def release(self, job_id: str, owner: str) -> None:
        pass

    async def orphans(self) -> list[str]:
        return []  # one process: nobody else could have run them

    async def claim(self, job_id: str, owner: str) -> bool:
        return False

    def counts(self) -> dict[str, int]:
        with self._lock:
            self._prune()
            out = dict.fromkeys(STATES, 0)
            for entry in self._jobs.values():
                out[entry.job.state] += 1
            return out


def _copy(job: Job) -> Job:
    return Job(**{f.name: getattr(job, f.name) for f in fields(job)})


# ---- in Redis, shared by every API pod ------------------------------------------------------

PREFIX = "rewardd:job:"
IDEM_PREFIX = "rewardd:job-idem:"
ACTIVE_SET = "rewardd:jobs:active"
STATE_PREFIX = "rewardd:jobs:state:"

_CREATE = """
local t = tonumber(redis.call('TIME')[1])
if #KEYS > 5 then
  local existing = redis.call('GET', KEYS[6])
  if existing and redis.call('EXISTS', ARGV[6] .. existing) == 1 then return existing end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[4])
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], t + tonumber(ARGV[4]), ARGV[1])
if #KEYS > 5 then redis.call('SET', KEYS[6], ARGV[1], 'EX', ARGV[4]) end
return ARGV[1]
"""

_START = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
local t = tonumber(redis.call('TIME')[1])
if (redis.call('HGET', KEYS[1], 'started_at') or '') == '' then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[2])
end
redis.call('HSET', KEYS[1], 'state', 'running', 'done', '0')
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], t + tonumber(ARGV[3]), ARGV[1])
return 1
"""

_RECORD = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'done', ARGV[1])
if #ARGV > 2 then
  for i = 3, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return 1
"""

_FINISH = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -1 end
if state ~= 'queued' and state ~= 'running' then return 0 end
local t = tonumber(redis.call('TIME')[1])
local ttl = ARGV[8]
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'finished_at', ARGV[3], 'error', ARGV[4])
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'done', ARGV[9]) end
if ARGV[5] == '1' then redis.call('SET', KEYS[2], ARGV[6], 'EX', ttl) end
redis.call('RPUSH', KEYS[3], ARGV[7])
redis.call('DEL', KEYS[4], KEYS[5])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
if #KEYS > 9 then redis.call('EXPIRE', KEYS[10], ttl) end
redis.call('SREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('ZREM', KEYS[8], ARGV[1])
redis.call('ZADD', KEYS[9], t + tonumber(ttl), ARGV[1])
return 1
"""

_RENEW = """
local state = redis.call('HGET', KEYS[2], 'state')
if not state then return 'gone' end
if state ~= 'queued' and state ~= 'running' then return state end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 'lost' end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 'ok'
"""

_CLAIM = """
local state = redis.call('HGET', KEYS[2], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_COUNT = """
local t = tonumber(redis.call('TIME')[1])
local out = {}
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', t)
  out[i] = redis.call('ZCARD', key)
end
return out
"""


def job_key(job_id: str, part: str = "") -> str:
    return f"{PREFIX}{job_id}{':' + part if part else ''}"


def idem_key(tenant: str, idempotency: str) -> str:
    return f"{IDEM_PREFIX}{tenant}:{idempotency}"


def state_key(state: str) -> str:
    return STATE_PREFIX + state


class RedisJobStore(JobStore):
    """Jobs in Redis, shared by every API pod (see the module docstring for the keys)."""

    durable = True

    def __init__(self, client: Any, ttl_s: int, url: str | None = None,
                 lease_s: float = LEASE_S) -> None:
        super().__init__(ttl_s)
        self.client = client
        self.url = url
        self.lease_ms = int(lease_s * 1000)
        self._create = client.register_script(_CREATE)
        self._start = client.register_script(_START)
        self._record = client.register_script(_RECORD)
        self._finish = client.register_script(_FINISH)
        self._renew = client.register_script(_RENEW)
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)
        self._sync: Any = None
        self._sync_lock = threading.Lock()

    async def create(self, job: Job, body: bytes, owner: str) -> Job:
        keys = [job_key(job.id), job_key(job.id, "body"), job_key(job.id, "lease"), ACTIVE_SET,
                state_key(QUEUED)]
        if job.idempotency is not None:
            keys.append(idem_key(job.tenant, job.idempotency))
        pairs = [x for item in job.to_fields().items() for x in item]
        stored = await self._create(keys=keys, args=[job.id, owner, self.lease_ms,
                                                     ACTIVE_TTL_S, body, PREFIX, *pairs])
        stored = stored.decode() if isinstance(stored, bytes) else stored
        if stored == job.id:
            return job
        existing = await self.get(stored)
        return existing if existing is not None else job

    async def find(self, tenant: str, idempotency: str) -> Job | None:
        job_id = await self.client.get(idem_key(tenant, idempotency))
        if job_id is None:
            return None
        job = await self.get(job_id.decode())
        return job if job is not None and job.tenant == tenant else None

    async def get(self, job_id: str) -> Job | None:
        raw = await self.client.hgetall(job_key(job_id))
        return Job.from_fields(raw) if raw else None

    async def body(self, job_id: str) -> bytes | None:
        return await self.client.get(job_key(job_id, "body"))

    async def result(self, job_id: str) -> bytes | None:
        return await self.client.get(job_key(job_id, "result"))

    async def start(self, job_id: str) -> Job | None:
        ok = await self._start(keys=[job_key(job_id), state_key(QUEUED), state_key(RUNNING)],
                               args=[job_id, repr(time.time()), ACTIVE_TTL_S])
        return await self.get(job_id) if ok else None

    async def record(self, job_id: str, done: int, events: list[bytes]) -> bool:
        ok = await self._record(keys=[job_key(job_id), job_key(job_id, "events")],
                                args=[done, ACTIVE_TTL_S, *events])
        return bool(ok)

    async def finish(self, job: Job, state: str, *, result: bytes | None = None,
                     error: str | None = None, done: int | None = None) -> Job | None:
        keys = [job_key(job.id), job_key(job.id, "result"), job_key(job.id, "events"),
                job_key(job.id, "body"), job_key(job.id, "lease"), ACTIVE_SET,
                state_key(QUEUED), state_key(RUNNING), state_key(state)]
        if job.idempotency is not None:
            keys.append(idem_key(job.tenant, job.idempotency))
        await self._finish(keys=keys, args=[
            job.id, state, repr(time.time()), error or "", "1" if result is not None else "0",
            result if result is not None else b"", job.terminal_event(state, error),
            self.ttl_s, "" if done is None else done])
        return await self.get(job.id)

    async def events(self, job_id: str, after: int = 0, limit: int | None = None
                     ) -> list[Event]:
        return await read_redis_list(self.client, job_key(job_id, "events"), after, limit)

    async def last_event(self, job_id: str) -> int:
        return int(await self.client.llen(job_key(job_id, "events")))

    async def renew(self, job_id: str, owner: str) -> str:
        status = await self._renew(keys=[job_key(job_id, "lease"), job_key(job_id)],
                                   args=[owner, self.lease_ms])
        return status.decode() if isinstance(status, bytes) else str(status)

    async def release(self, job_id: str, owner: str) -> None:
        await self._release(keys=[job_key(job_id, "lease")], args=[owner])

    async def orphans(self) -> list[str]:
        ids = sorted(m.decode() for m in await self.client.smembers(ACTIVE_SET))
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.exists(job_key(job_id))
                pipe.exists(job_key(job_id, "lease"))
            flags = await pipe.execute()
        gone = [job_id for i, job_id in enumerate(ids) if not flags[2 * i]]
        if gone:  # expired while active (ACTIVE_TTL_S): forget them
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.srem(ACTIVE_SET, *gone)
                for state in ACTIVE:
                    pipe.zrem(state_key(state), *gone)
                await pipe.execute()
        return [job_id for i, job_id in enumerate(ids)
                if flags[2 * i] and not flags[2 * i + 1]]

    async def claim(self, job_id: str, owner: str) -> bool:
        ok = await self._claim(keys=[job_key(job_id, "lease"), job_key(job_id)],
                               args=[owner, self.lease_ms])
        return bool(ok)

    def counts(self) -> dict[str, int]:
        with self._sync_lock:
            if self._sync is None:
                if self.url is None:
                    raise RuntimeError("RedisJobStore without a URL cannot count jobs")
                import redis

                self._sync = redis.Redis.from_url(self.url, socket_connect_timeout=1,
                                                  socket_timeout=1)
                self._count = self._sync.register_script(_COUNT)
        values = self._count(keys=[state_key(s) for s in STATES])
        return {state: int(n) for state, n in zip(STATES, values)}

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
