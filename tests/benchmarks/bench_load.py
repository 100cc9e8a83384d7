"""Benchmark: load and soak with a hostile second tenant (issue 15).

    .venv/bin/python tests/benchmarks/bench_load.py [--soak-s 600] [--quick] [--json out.json]

Shared infrastructure is only as good as its worst neighbour. Two real servers, started side
by side on loopback with ``REWARDD_API_KEYS=key1=t1,key2=t2``: ``embedded`` (``rewardd serve
--pool-size C``) and ``distributed`` (``rewardd serve`` with
``REWARDD_BROKER_URL=redis://127.0.0.1:6379/<--db>`` and ``--dist-workers`` ``rewardd worker``
processes with ``C`` verifier slots in all), started and stopped with bench_distributed's
helpers. Tenant ``t1`` may run 64 requests at once (the trainers never meet its limit);
tenant ``t2`` is limited to 2 (``REWARDD_API_KEYS_FILE``).

1. Load. ``t1``'s trainers, 8 and then 32 concurrent asyncio clients
   (:class:`rewardd_client.AsyncRewarddClient`, no retries: a 429 or 503 counts as an error),
   send a fixed number (``--requests``) of ``/v1/score`` requests of ``--load-groups`` x 16
   generated math rollouts (a fresh batch each), once with ``t1`` alone and once while ``t2``
   sends the hostile requests below back to back. Target: ``t1``'s p99 with the hostile
   tenant at most 1.5x its p99 alone.
2. Soak (``--soak-s``, default 600; 0 skips it): both configurations at once, 8 trainers each
   and the hostile tenant throughout. Every ``--sample-s``: the resident memory (RSS) of the
   API process and of the verifier processes (the embedded pool's children; the Celery
   workers' process groups), and the distributed database's Redis key count. Targets: no
   memory growth after warm-up (the first fifth of the soak, at least 30 s, at most half),
   Redis keys bounded and back to their idle count once drained.

The hostile tenant sends, in rotation, issue 15's rows: a ~3 KB request nesting 500 levels in
``reference`` (score, rewards, verify); a 1 MB msgpack ``/v1/advantages`` body whose ``mask``
is 1,000,000 nulls; a lone surrogate ``"\\ud800"`` in a completion (verify, score); a
10^5-group score (a valid one: 10 MB, a 38 MB answer); a 5 MB regex pattern, a new one each
time (verify); 6
concurrent verify and 6 concurrent advantages calls against its limit of 2; and a valid
``/v1/score`` just under the bounds: 60,000 cheap math rollouts (3,750 groups of 16), which
the fair queue of verifier calls (``workers/fairness.py``) must keep from delaying ``t1``.

Design choices, and why:

* The hostile tenant runs in a process of its own, with the ``/healthz`` pinger (every
  0.2 s, in both conditions). In the trainers' event loop, reading a 38 MB answer would
  stall the trainers' own clocks and blame the server for the client's work.
* The conditions alternate in ``--passes`` interleaved passes, their order swapped each pass,
  so a shared machine's drift hits both alike; before every pass the servers' processes must
  be idle (under 0.1 core, read from /proc), so the tail of one pass's hostile request never
  lands in the next. A probe still running when the trainers finish gets ``--probe-grace-s``,
  then is cancelled (the server's work on it is then waited out by the idle check).
* One run gives a p99 per probe: each trainer request (and each ping) is blamed on the probe
  it overlapped longest. The probes run one at a time, but a request held up by a slow probe
  also overlaps the quick ones sent after it, so "overlapped at all" would blame those too.
  The alternative, one load run per probe, costs six times the time.
* A server found not ready after a pass is recorded (the table's restarts column) and
  restarted, so one fatal probe does not void the rest of the run.
* p50/p99 are nearest-rank over all requests of a condition (no median of per-pass figures:
  a pass of 80 requests has no p99 of its own). RSS is summed over processes: pages that
  forked children share count once per process, so the sum overstates the total; its growth
  is what is read.

Every process started here runs in its own process group and is killed at the end, also on
Ctrl-C or an error; the Redis database is flushed before and after. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import multiprocessing
import os
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Iterator

import httpx
import msgpack
import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rewardd_client import AsyncRewarddClient  # noqa: E402
from tests.benchmarks.bench_distributed import (  # noqa: E402
    GROUP_SIZE, Config, flush, load_summary, score_body, start, table, wait_ready)

TRAINER_KEY, HOSTILE_KEY = "key1", "key2"
TRAINER_LIMIT, HOSTILE_LIMIT = 64, 2
TARGET_RATIO = 1.5
QUIET_CORES = 0.1
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------ hostile probes

@dataclass(frozen=True)
class Call:
    """One hostile HTTP request, its body encoded once. A body holding :data:`FRESH` gets a
    new number there on every send (a pattern sent twice would be served from ``re``'s
    cache of compiled patterns; an attacker varies it)."""

    route: str
    body: bytes
    media: str = "application/json"


FRESH = b"@FRESH@"
_sends = itertools.count()


@dataclass(frozen=True)
class Probe:
    """A row of issue 15's table: calls sent one after another, or all at once."""

    name: str
    calls: tuple[Call, ...]
    concurrent: bool = False


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _two_rollouts(verifier: str, reference: str, completions: tuple[str, str]) -> str:
    rollouts = ",".join(f'{{"rollout_id":"r{i}","completion":{json.dumps(c)},"num_tokens":8}}'
                        for i, c in enumerate(completions))
    return (f'{{"rewards":[{{"name":"c","verifier":"{verifier}"}}],"groups":[{{"group_id":'
            f'"h","reference":{reference},"rollouts":[{rollouts}]}}]}}')


UNDER_BOUNDS_ROLLOUTS = 60_000
"""Rollouts of the valid request just under REWARDD_MAX_ROLLOUTS_PER_REQUEST (65,536)."""


def build_probes() -> list[Probe]:
    """Issue 15's hostile requests (rows 1, 2, 4, 5 and 6) and a valid request just under the
    bounds, bodies built once."""
    deep = f'{{"answer":"1","deep":{_nested(500)}}}'
    nested_score = _two_rollouts("math", deep, ("$\\boxed{1}$", "$\\boxed{2}$")).encode()
    nested_verify = f'{{"completion":"$\\\\boxed{{1}}$","reference":{deep}}}'.encode()

    nulls = msgpack.packb({
        "advantage": {"estimator": "grpo", "output": "rle"},
        "groups": [{"group_id": "h", "rollouts": [
            {"rollout_id": "a", "reward": 1.0, "num_tokens": 1_000_000,
             "mask": [None] * 1_000_000},
            {"rollout_id": "b", "reward": 0.0, "num_tokens": 1}]}]})

    # json.dumps escapes the lone surrogate as \ud800: valid JSON, not valid UTF-8 text
    surrogate_verify = json.dumps({"completion": "a\ud800b", "reference": {"answer": "x"}})
    surrogate_score = _two_rollouts("exact_match", '{"answer":"x"}', ("a\ud800b", "x"))

    many = ",".join(f'{{"group_id":"g{i}","reference":{{"answer":"1"}},"rollouts":'
                    f'[{{"rollout_id":"g{i}r","completion":"{i % 2}"}}]}}' for i in range(100_000))
    many_groups = (f'{{"rewards":[{{"name":"c","verifier":"exact_match"}}],"advantage":'
                   f'{{"output":"scalar"}},"groups":[{many}]}}').encode()

    # a valid request just under the bounds (REWARDD_MAX_ROLLOUTS_PER_REQUEST = 65,536):
    # 3,750 groups of 16 cheap math rollouts, 60,000 checks that all run
    under = ",".join(
        f'{{"group_id":"u{g}","reference":{{"answer":"{g % 7}"}},"rollouts":['
        + ",".join(f'{{"rollout_id":"u{g}r{r}","completion":"so $\\\\boxed{{{(g + r) % 7}}}$",'
                   f'"num_tokens":8}}' for r in range(GROUP_SIZE)) + "]}"
        for g in range(UNDER_BOUNDS_ROLLOUTS // GROUP_SIZE))
    under_bounds = (f'{{"rewards":[{{"name":"c","verifier":"math"}}],"advantage":'
                    f'{{"output":"scalar"}},"groups":[{under}]}}').encode()

    regex = json.dumps({"completion": "hello",
                        "params": {"pattern": "a" * 5_000_000 + FRESH.decode()}})

    verify_math = json.dumps({"completion": "Adding the parts gives $\\boxed{\\frac{7}{12}}$.",
                              "reference": {"answer": "\\frac{14}{24}"}}).encode()
    dense = json.dumps({"advantage": {"estimator": "grpo", "output": "dense"}, "groups": [
        {"group_id": f"g{g}", "rollouts": [
            {"rollout_id": f"g{g}r{r}", "reward": float((g + r) % 3), "num_tokens": 4096}
            for r in range(GROUP_SIZE)]} for g in range(16)]}).encode()
    burst = (Call("/v1/verify/math", verify_math),) * 6 + (Call("/v1/advantages", dense),) * 6

    return [
        Probe("nested reference (500 deep)", (Call("/v1/score", nested_score),
                                              Call("/v1/rewards", nested_score),
                                              Call("/v1/verify/math", nested_verify))),
        Probe("1 MB msgpack of nulls", (Call("/v1/advantages", nulls, "application/msgpack"),)),
        Probe("lone surrogate", (Call("/v1/verify/exact_match", surrogate_verify.encode()),
                                 Call("/v1/score", surrogate_score.encode()))),
        Probe("10^5-group score", (Call("/v1/score", many_groups),)),
        Probe("60,000-rollout score (valid, under the bounds)",
              (Call("/v1/score", under_bounds),)),
        Probe("5 MB regex", (Call("/v1/verify/regex", regex.encode()),)),
        Probe("over-limit concurrency (12 at limit 2)", burst, concurrent=True),
    ]


async def _send(client: httpx.AsyncClient, probe: Probe, call: Call) -> dict[str, Any]:
    """One hostile call; its record (status, bytes read, time span). The body is counted,
    never decoded (a 100 MB error list costs the hostile process, not the trainers)."""
    record: dict[str, Any] = {"probe": probe.name, "route": call.route,
                              "t0": time.monotonic(), "bytes": 0, "excerpt": ""}
    headers = {"content-type": call.media, "accept": call.media}
    try:
        body = call.body.replace(FRESH, str(next(_sends)).encode())
        async with client.stream("POST", call.route, content=body,
                                 headers=headers) as response:
            async for chunk in response.aiter_raw():
                if not record["bytes"]:
                    record["excerpt"] = chunk[:240].decode(errors="replace")
                record["bytes"] += len(chunk)
            record["status"] = response.status_code
    except asyncio.CancelledError:
        record["status"] = "cancelled"
        raise
    except Exception as exc:  # a dropped connection or a timeout is the probe's outcome
        record["status"] = type(exc).__name__
    finally:
        record["t1"] = time.monotonic()
    return record


def _pinger(url: str, stop: threading.Event, pings: list[tuple[float, float, int]]) -> None:
    """GET /healthz every 0.2 s: (sent at, seconds, status; 0 when it failed)."""
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                status = client.get(f"{url}/healthz").status_code
            except httpx.HTTPError:
                status = 0
            pings.append((sent, time.monotonic() - sent, status))
            stop.wait(0.2)


async def _hostile_phase(conn: Connection, probes: list[Probe], url: str, index: int,
                         hostile: bool, grace_s: float) -> tuple[list[dict], int]:
    records: list[dict[str, Any]] = []
    stopping = asyncio.Event()

    async def watch() -> None:
        while not conn.poll():
            await asyncio.sleep(0.05)
        conn.recv()
        stopping.set()

    async def send_probes() -> None:
        nonlocal index
        headers = {"authorization": f"Bearer {HOSTILE_KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
            while not stopping.is_set():
                probe = probes[index % len(probes)]
                index += 1
                if probe.concurrent:
                    records.extend(await asyncio.gather(
                        *(_send(client, probe, call) for call in probe.calls)))
                else:
                    for call in probe.calls:
                        records.append(await _send(client, probe, call))

    watcher = asyncio.create_task(watch())
    if not hostile:
        await watcher
        return records, index
    sender = asyncio.create_task(send_probes())
    await asyncio.wait([watcher, sender], return_when=asyncio.FIRST_COMPLETED)
    try:
        await asyncio.wait_for(asyncio.shield(sender), grace_s)
    except asyncio.TimeoutError:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        now = time.monotonic()
        records.append({"probe": probes[(index - 1) % len(probes)].name, "route": "(in flight)",
                        "t0": now, "t1": now, "bytes": 0,
                        "status": f"cancelled after {grace_s:g} s grace"})
    return records, index


def hostile_main(conn: Connection, grace_s: float, without: tuple[str, ...] = ()) -> None:
    """The hostile tenant's process: builds the probes, then serves phases until told to exit.

    ("run", url, probe index, hostile?) starts a phase (the /healthz pinger always runs; the
    probes only when hostile); ("stop",) ends it and is answered with (records, pings, next
    probe index)."""
    probes = [p for p in build_probes() if not any(w in p.name for w in without)]
    conn.send("ready")
    while True:
        message = conn.recv()
        if message[0] == "exit":
            return
        _, url, index, hostile = message
        pings: list[tuple[float, float, int]] = []
        stop = threading.Event()
        pinger = threading.Thread(target=_pinger, args=(url, stop, pings), daemon=True)
        pinger.start()
        records, index = asyncio.run(_hostile_phase(conn, probes, url, index, hostile, grace_s))
        stop.set()
        pinger.join(timeout=70)
        conn.send((records, pings, index))


class Hostile:
    """Handle on one hostile-tenant process (one per server: the soak runs both at once)."""

    def __init__(self, grace_s: float, without: tuple[str, ...] = ()) -> None:
        self.conn, child = multiprocessing.get_context("spawn").Pipe()
        self.proc = multiprocessing.get_context("spawn").Process(
            target=hostile_main, args=(child, grace_s, without), daemon=True)
        self.proc.start()
        self.index = 0

    def ready(self) -> None:
        if self.conn.recv() != "ready":
            raise RuntimeError("the hostile tenant's process did not start")

    def begin(self, url: str, hostile: bool) -> None:
        self.conn.send(("run", url, self.index, hostile))

    def end(self) -> tuple[list[dict], list[tuple[float, float, int]]]:
        self.conn.send(("stop",))
        records, pings, self.index = self.conn.recv()
        return records, pings

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(("exit",))
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


# ------------------------------------------------------------------------------ trainers

@dataclass
class Outcome:
    """One trainer request: its span, and what went wrong (None: a complete answer)."""

    t0: float
    t1: float
    error: str | None = None
    failed_cells: int = 0


async def _one(client: AsyncRewarddClient, body: dict[str, Any], rollouts: int) -> Outcome:
    t0 = time.monotonic()
    try:
        answer = await client.score(body)
    except Exception as exc:
        return Outcome(t0, time.monotonic(), f"{type(exc).__name__}: {exc}"[:200])
    t1 = time.monotonic()
    cells = [r for g in answer["groups"] for r in g["rollouts"]]
    if len(cells) != rollouts:
        return Outcome(t0, t1, f"{len(cells)} rollouts back, {rollouts} sent")
    failed = sum(1 for r in cells if any(s.get("error") for s in r["status"].values()))
    return Outcome(t0, t1, None, failed)


async def trainers(url: str, clients: int, groups: int, seeds: Iterator[int],
                   count: int | None = None, until: float | None = None) -> list[Outcome]:
    """``clients`` concurrent trainers send fresh math batches until ``count`` requests in
    all were sent, or until the monotonic time ``until``."""
    outcomes: list[Outcome] = []
    budget = iter(range(count)) if count is not None else None
    rollouts = groups * GROUP_SIZE

    async def trainer() -> None:
        async with AsyncRewarddClient(url, api_key=TRAINER_KEY, max_retries=0,
                                      timeout=300) as client:
            while (next(budget, None) is not None if budget is not None
                   else time.monotonic() < (until or 0)):
                outcomes.append(await _one(client, score_body(next(seeds), groups), rollouts))

    await asyncio.gather(*(trainer() for _ in range(clients)))
    return outcomes


def summary(outcomes: list[Outcome], wall: float, rollouts: int) -> dict[str, Any]:
    """bench_distributed's load summary (nearest-rank p50/p99, rates) of ``outcomes``."""
    errors = {"http": sum(1 for o in outcomes if o.error),
              "cells": sum(o.failed_cells for o in outcomes)}
    messages = [o.error for o in outcomes if o.error]
    return load_summary([o.t1 - o.t0 for o in outcomes], wall, errors, messages, rollouts)


# ------------------------------------------------------------------------------ processes

def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.append(int(entry))
    return pids


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * TICK_S
    return 0.0


def memory(config: Config) -> tuple[float, float]:
    """(API process RSS, RSS of every verifier process) in MB. The API is the last process
    ``start`` appends; the embedded pool's children share its process group."""
    api = config.procs[-1].proc.pid
    verifiers = [pid for proc in config.procs for pid in _group_pids(proc.proc.pid)
                 if pid != api]
    return _rss_mb(api), sum(_rss_mb(pid) for pid in verifiers)


def wait_quiet(configs: list[Config], limit_s: float = 120.0) -> float:
    """Wait until the servers' processes use under QUIET_CORES of CPU; the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        pids = [pid for c in configs for proc in c.procs for pid in _group_pids(proc.proc.pid)]
        before = sum(_cpu_s(pid) for pid in pids)
        time.sleep(0.5)
        if sum(_cpu_s(pid) for pid in pids) - before < QUIET_CORES * 0.5:
            break
    return time.monotonic() - started


def redis_keys(config: Config) -> int | None:
    if config.db is None:
        return None
    return int(redis.Redis(db=config.db, socket_connect_timeout=3).dbsize())


def readiness(config: Config, within_s: float = 30.0) -> str | None:
    """None when /readyz answers 200 within ``within_s``; else what it said last."""
    deadline, last = time.monotonic() + within_s, ""
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{config.url}/readyz", timeout=10)
            if response.status_code == 200:
                return None
            last = f"HTTP {response.status_code}: {response.text[:160]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"[:160]
        time.sleep(1)
    return last


@dataclass
class Server:
    """A configuration with what is needed to restart it, and what happened to it."""

    config: Config
    concurrency: int
    env: dict[str, str]
    hostile: Hostile
    restarts: list[str] = field(default_factory=list)

    def start(self) -> None:
        if self.config.db is not None:
            flush([self.config.db])
        start(self.config, self.concurrency, self.env)

    def stop(self) -> None:
        for proc in self.config.procs:
            proc.stop()
        self.config.procs.clear()

    def ensure_ready(self, when: str) -> None:
        """Restart the server if it is not ready, recording why."""
        reason = readiness(self.config)
        if reason is not None:
            self.restarts.append(f"{when}: {reason}")
            print(f"[{self.config.name} not ready {when} ({reason}); restarting]",
                  file=sys.stderr, flush=True)
            self.stop()
            self.start()
            wait_ready([self.config])


def tenants_env(directory: Path) -> dict[str, str]:
    """Keys for t1 (trainers) and t2 (hostile); t2 limited to HOSTILE_LIMIT by the keys
    file (REWARDD_API_KEYS gives no per-tenant limits)."""
    path = directory / "tenants.json"
    path.write_text(json.dumps({"tenants": {"t2": {"keys": [HOSTILE_KEY],
                                                   "max_concurrent_jobs": HOSTILE_LIMIT}}}))
    return {"REWARDD_API_KEYS": f"{TRAINER_KEY}=t1,{HOSTILE_KEY}=t2",
            "REWARDD_API_KEYS_FILE": str(path),
            "REWARDD_TENANT_MAX_CONCURRENT_JOBS": str(TRAINER_LIMIT)}


# ------------------------------------------------------------------------------ load

@dataclass
class Condition:
    """Everything measured for one (server, trainers, alone/hostile) condition."""

    outcomes: list[Outcome] = field(default_factory=list)
    wall: float = 0.0
    records: list[dict] = field(default_factory=list)
    pings: list[tuple[float, float, int]] = field(default_factory=list)
    quiet_s: float = 0.0


def load_pass(server: Server, clients: int, hostile: bool, count: int, groups: int,
              seeds: Iterator[int], cond: Condition, everyone: list[Config]) -> None:
    cond.quiet_s += wait_quiet(everyone)
    server.hostile.begin(server.config.url, hostile)
    started = time.monotonic()
    try:
        cond.outcomes += asyncio.run(trainers(server.config.url, clients, groups, seeds, count))
        cond.wall += time.monotonic() - started
    finally:
        records, pings = server.hostile.end()
    cond.records += records
    cond.pings += pings


def blame(t0: float, t1: float, spans: dict[str, list[tuple[float, float]]]) -> str | None:
    """The probe whose calls overlapped the span [t0, t1] longest (None: no overlap). A
    trainer request held up by a slow probe also overlaps the quick probes sent after it;
    the longest overlap names the one that held it."""
    best, most = None, 0.0
    for probe, probe_spans in spans.items():
        overlap = sum(max(0.0, min(t1, e) - max(t0, b)) for b, e in probe_spans)
        if overlap > most:
            best, most = probe, overlap
    return best


def ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.0f}"


def probe_rows(name: str, alone: Condition, hostile: Condition, rollouts: int,
               alone_p99: float) -> list[list[Any]]:
    """Per probe: its answers, and the p99 of the trainer requests (and the slowest
    /healthz) it held up (:func:`blame`)."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    answers: dict[str, Counter] = defaultdict(Counter)
    took: dict[str, list[float]] = defaultdict(list)
    size: dict[str, int] = defaultdict(int)
    for r in hostile.records:
        spans[r["probe"]].append((r["t0"], r["t1"]))
        answers[r["probe"]][f"{r['route']} {r['status']}"] += 1
        took[r["probe"]].append(r["t1"] - r["t0"])
        size[r["probe"]] = max(size[r["probe"]], r["bytes"])
    hits: dict[str | None, list[Outcome]] = defaultdict(list)
    for o in hostile.outcomes:
        hits[blame(o.t0, o.t1, spans)].append(o)
    health: dict[str | None, list[float]] = defaultdict(list)
    for sent, took_s, _ in hostile.pings:
        health[blame(sent, sent + took_s, spans)].append(took_s)
    rows = []
    for probe in spans:
        hit = hits[probe]
        s = summary(hit, 1.0, rollouts) if hit else None
        rows.append([name, probe, "; ".join(f"{k} x{v}" for k, v in answers[probe].items()),
                     ms(max(took[probe])), f"{size[probe] / 1e6:.2f}", len(hit),
                     ms(s["p99_s"]) if s else "-",
                     f"{s['p99_s'] / alone_p99:.2f}x" if s else "-",
                     s["errors"]["http"] + s["errors"]["cells"] if s else "-",
                     ms(max(health[probe])) if health[probe] else "-"])
    return rows


# ------------------------------------------------------------------------------ soak

def soak(servers: list[Server], seconds: float, sample_s: float, groups: int,
         seeds: Iterator[int]) -> dict[str, Any]:
    """Both servers side by side for ``seconds``: 8 trainers each, the hostile tenant on."""
    samples: dict[str, list[tuple[float, float, float, int | None]]] = defaultdict(list)
    done = threading.Event()
    started = time.monotonic()

    def sampler() -> None:
        while True:
            for s in servers:
                api, workers = memory(s.config)
                samples[s.config.name].append((time.monotonic() - started, api, workers,
                                               redis_keys(s.config)))
            if done.wait(sample_s):
                return

    for s in servers:
        s.hostile.begin(s.config.url, True)
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    until = started + seconds

    async def both() -> list[list[Outcome]]:
        return await asyncio.gather(*(trainers(s.config.url, 8, groups, seeds, until=until)
                                      for s in servers))

    try:
        results = asyncio.run(both())
    finally:
        ends = [s.hostile.end() for s in servers]
        done.set()
        thread.join()
    wall = time.monotonic() - started
    drained: dict[str, int | None] = {}
    wait_quiet([s.config for s in servers])
    for s in servers:
        drained[s.config.name] = redis_keys(s.config)
    out = {}
    for s, outcomes, (records, _) in zip(servers, results, ends):
        name = s.config.name
        out[name] = {"load": summary(outcomes, wall, groups * GROUP_SIZE),
                     "samples": samples[name], "drained_keys": drained[name],
                     "probes": Counter(str(r["status"]) for r in records)}
    return out


def growth(samples: list[tuple[float, float, float, int | None]], warmup_s: float,
           column: int) -> tuple[float, float, float]:
    """(value after warm-up, growth since then, least-squares slope per minute) of one
    column of the samples taken after ``warmup_s``."""
    after = [(s[0], s[column]) for s in samples if s[0] >= warmup_s]
    if len(after) < 2:
        return float("nan"), float("nan"), float("nan")
    slope = statistics.linear_regression([t for t, _ in after], [v for _, v in after]).slope
    return after[0][1], after[-1][1] - after[0][1], slope * 60


# ------------------------------------------------------------------------------ main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32],
                        help="concurrent trainers of each load run")
    parser.add_argument("--requests", type=int, default=240,
                        help="load requests of each condition, whatever the trainers")
    parser.add_argument("--passes", type=int, default=3,
                        help="interleaved passes of each condition")
    parser.add_argument("--load-groups", type=int, default=2, help="groups of 16 per request")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="verifier processes of each configuration")
    parser.add_argument("--dist-workers", type=int, choices=(1, 2), default=1,
                        help="rewardd worker processes of the distributed configuration")
    parser.add_argument("--db", type=int, default=9, help="Redis database of the distributed run")
    parser.add_argument("--probe-grace-s", type=float, default=10.0,
                        help="a probe still running when the trainers finish gets this long")
    parser.add_argument("--soak-s", type=float, default=600.0,
                        help="soak duration (both configurations at once); 0: no soak")
    parser.add_argument("--sample-s", type=float, default=15.0, help="soak sampling interval")
    parser.add_argument("--skip-load", action="store_true", help="only the soak")
    parser.add_argument("--without", action="append", default=[], metavar="TEXT",
                        help="leave out the probes whose name contains TEXT (repeatable), "
                             "to tell which probe a cost comes from")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="add to both servers' environment (repeatable): to compare "
                             "settings in one sitting")
    parser.add_argument("--quick", action="store_true",
                        help="8 trainers, 80 requests, 2 passes, a 60 s soak at most")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.requests, args.passes = [8], 80, 2
        args.soak_s = min(args.soak_s, 60.0)
    if args.dist_workers == 2 and args.concurrency % 2:
        parser.error("--concurrency must be even with --dist-workers 2")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python",
                                                "tests/benchmarks/bench_load.py", *sys.argv[1:]])
    load_start, began = os.getloadavg(), time.monotonic()

    def interrupted(signum: int, _: Any) -> None:  # SIGTERM cleans up like Ctrl-C
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    rollouts = args.load_groups * GROUP_SIZE
    seeds = iter(range(10_000_000, 1 << 62))
    split = [args.concurrency // args.dist_workers] * args.dist_workers

    servers: list[Server] = []
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        env = tenants_env(Path(tmp))
        env.update(item.split("=", 1) for item in args.server_env)
        try:
            for config in (Config("embedded", []),
                           Config("distributed", split, args.db)):
                tenant2 = Hostile(args.probe_grace_s, tuple(args.without))
                servers.append(Server(config, args.concurrency, env, tenant2))
            print("[starting the servers; the hostile tenant builds its probes]",
                  file=sys.stderr, flush=True)
            for s in servers:
                s.start()
            wait_ready([s.config for s in servers])
            for s in servers:
                s.hostile.ready()
            everyone = [s.config for s in servers]

            # warm-up: imports, pool start, first math parses
            for s in servers:
                asyncio.run(trainers(s.config.url, 8, args.load_groups, seeds, 32))
            warm = {s.config.name: memory(s.config) for s in servers}

            conds: dict[tuple[str, int, bool], Condition] = defaultdict(Condition)
            if not args.skip_load:
                step = 0
                for clients in args.clients:
                    per_pass = max(1, args.requests // args.passes)
                    for index in range(args.passes):
                        step += 1  # which condition goes first alternates
                        for s in servers[index % 2:] + servers[:index % 2]:
                            for hostile in ((False, True) if step % 2 else (True, False)):
                                print(f"[{s.config.name}, {clients} trainers, pass "
                                      f"{index + 1}/{args.passes}, "
                                      f"{'hostile tenant' if hostile else 'alone'}]",
                                      file=sys.stderr, flush=True)
                                load_pass(s, clients, hostile, per_pass, args.load_groups,
                                          seeds, conds[s.config.name, clients, hostile],
                                          everyone)
                                s.ensure_ready(f"after {clients} trainers, pass {index + 1}, "
                                               f"{'hostile' if hostile else 'alone'}")
            wait_quiet(everyone)
            after_load = {s.config.name: memory(s.config) for s in servers}
            keys_after_load = {s.config.name: redis_keys(s.config) for s in servers}
            soaked = (soak(servers, args.soak_s, args.sample_s, args.load_groups, seeds)
                      if args.soak_s > 0 else {})
        finally:
            for s in servers:
                s.hostile.close()
                s.stop()
            flush([args.db])
    load_end = os.getloadavg()

    # ---- report
    print(f"## Load and soak with a hostile second tenant\n\n`{command}` "
          f"({(time.monotonic() - began) / 60:.1f} min) on "
          f"{os.cpu_count()} cores, load average {load_start[0]:.1f} at the start and "
          f"{load_end[0]:.1f} at the end (other sessions share the machine). Verifier "
          f"processes per configuration: {args.concurrency}; requests of {rollouts} math "
          f"rollouts; tenant t2 (hostile) limited to {HOSTILE_LIMIT} at once.\n")
    load_rows, probe_table, verdicts = [], [], []
    for s in servers:
        name = s.config.name
        for clients in ([] if args.skip_load else args.clients):
            alone, hostile = conds[name, clients, False], conds[name, clients, True]
            a = summary(alone.outcomes, alone.wall, rollouts)
            h = summary(hostile.outcomes, hostile.wall, rollouts)
            ratio = h["p99_s"] / a["p99_s"]
            verdicts.append(ratio <= TARGET_RATIO)
            for label, r, c in (("alone", a, alone), ("with hostile t2", h, hostile)):
                health = max((p[1] for p in c.pings), default=float("nan"))
                load_rows.append([name, clients, label, r["requests"],
                                  f"{r['requests_per_s']:.1f}", ms(r["p50_s"]), ms(r["p99_s"]),
                                  r["errors"]["http"] + r["errors"]["cells"], ms(health),
                                  "" if c is alone else
                                  f"{ratio:.2f}x ({'met' if ratio <= TARGET_RATIO else 'MISSED'})"])
            probe_table += probe_rows(f"{name}, {clients}", alone, hostile, rollouts, a["p99_s"])
            results["probes"] = probe_table
            results.setdefault("load", {})[f"{name}/{clients}"] = {
                "alone": a, "hostile": h, "idle_wait_s": [alone.quiet_s, hostile.quiet_s]}
    if load_rows:
        print(f"### Load: tenant t1's trainers, {args.requests} requests per condition in "
              f"{args.passes} interleaved passes\n")
        table(["configuration", "trainers", "condition", "requests", "requests/s", "p50 ms",
               "p99 ms", "errors", "max /healthz ms", "p99 x alone (target <= 1.5x)"],
              load_rows, ["---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:",
                          "---"])
        print("### Each hostile probe: its answers, and the trainer requests that overlapped "
              "it\n")
        table(["configuration, trainers", "probe", "answers (route status x count)",
               "probe max ms", "max MB back", "requests it held up", "their p99 ms",
               "x alone p99", "their errors", "slowest /healthz it held up, ms"], probe_table,
              ["---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"])
        seen = {}  # what each refusal or failure said, once per (probe, route, status)
        for s in servers:
            for n in args.clients:
                for r in conds[s.config.name, n, True].records:
                    if r["status"] != 200 and r["route"] != "(in flight)":
                        seen.setdefault((r["probe"], r["route"], str(r["status"])),
                                        r["excerpt"][:160].replace("\n", " ").replace("`", "'"))
        for (probe, route, status), excerpt in seen.items():
            print(f"- {probe}, {route} {status}: `{excerpt}`")
        print()
        for s in servers:  # the first few trainer errors of each server, verbatim
            errors = [o.error for n in args.clients for h in (False, True)
                      for o in conds[s.config.name, n, h].outcomes if o.error]
            for message in errors[:3]:
                print(f"- {s.config.name} error: {message}")
        mem_rows = []
        for s in servers:
            (wa, ww), (la, lw) = warm[s.config.name], after_load[s.config.name]
            mem_rows.append([s.config.name, f"{wa:.0f}", f"{la:.0f}", f"{la - wa:+.0f}",
                             f"{ww:.0f}", f"{lw:.0f}", f"{lw - ww:+.0f}",
                             "-" if keys_after_load[s.config.name] is None
                             else keys_after_load[s.config.name],
                             "; ".join(s.restarts) or "none"])
        print("\n### Memory across the load runs (RSS MB, after warm-up -> after the last "
              "pass)\n")
        table(["configuration", "API", "API after", "API growth", "verifiers",
               "verifiers after", "verifiers growth", "Redis keys after", "restarts"],
              mem_rows, ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---"])

    if soaked:
        warmup_s = min(max(30.0, args.soak_s / 5), args.soak_s / 2)
        rows = []
        for s in servers:
            name, r = s.config.name, soaked[s.config.name]
            api = growth(r["samples"], warmup_s, 1)
            workers = growth(r["samples"], warmup_s, 2)
            keys = [k for *_, k in r["samples"] if k is not None]
            load = r["load"]
            rows.append([name, load["requests"], f"{load['requests_per_s']:.1f}",
                         ms(load["p50_s"]), ms(load["p99_s"]),
                         load["errors"]["http"] + load["errors"]["cells"],
                         f"{api[0]:.0f}", f"{api[1]:+.0f} ({api[2]:+.1f}/min)",
                         f"{workers[0]:.0f}", f"{workers[1]:+.0f} ({workers[2]:+.1f}/min)",
                         f"{min(keys)}-{max(keys)}, {r['drained_keys']} drained" if keys else "-",
                         sum(r["probes"].values())])
            results.setdefault("soak", {})[name] = r
        print(f"### Soak: {args.soak_s:g} s, both configurations at once, 8 trainers each "
              f"and the hostile tenant throughout; growth after {warmup_s:g} s of warm-up\n")
        table(["configuration", "requests", "requests/s", "p50 ms", "p99 ms", "errors",
               "API MB", "API growth MB", "verifiers MB", "verifiers growth MB",
               "Redis keys (min-max, after drain)", "hostile calls"],
              rows, ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:",
                     "---:", "---", "---:"])
        for s in servers:
            samples = soaked[s.config.name]["samples"]
            shown = samples[::max(1, len(samples) // 10)]  # about ten points in time
            print(f"- {s.config.name} over time (s: API MB / verifiers MB / Redis keys): " +
                  ", ".join(f"{t:.0f}: {api:.0f}/{workers:.0f}/{'-' if keys is None else keys}"
                            for t, api, workers, keys in shown))
            print(f"- {s.config.name} hostile answers: " + ", ".join(
                f"{k} x{v}" for k, v in soaked[s.config.name]["probes"].most_common()))
    if verdicts:
        print(f"\nTarget (t1's p99 with the hostile tenant <= {TARGET_RATIO}x alone): met in "
              f"{sum(verdicts)} of {len(verdicts)} runs.")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
        print(f"\nRaw figures written to {args.json}.")


if __name__ == "__main__":
    main()
