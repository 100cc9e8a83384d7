"""Offline batch scoring of JSONL files (``rewardd score``) through the service pipeline.

All lines are validated before any work starts, so a typo on line 9,000 costs seconds, not
an hour; every error names its line and field. Results stream to the output file in input
order.

The progress bar counts rollouts, the unit a user sent (not checks, rollout x component,
whose total changes with the reward spec), a group's worth at a time as its last check
settles. It is drawn only where stderr is a terminal (tqdm's ``disable=None``) unless
``--progress`` forces it, so logs and CI output carry the summary alone.

The summary keeps warm-up apart from throughput: the first run of a command pays the imports
(torch, the verifiers in the pool's forkserver) and the pool's start, seconds that say
nothing of how fast scoring is. ``warmup_s`` is that; ``rollouts_per_s`` is rollouts over
``scoring_s``, measured from the moment every worker answered a ping (and the bar starts)
to the last result. ``load_s`` (reading and validating) and ``elapsed_s`` (the whole
command) complete the account.

A request that names a ``run_id`` is recorded into the local run record, the one
``rewardd serve`` writes and ``GET /v1/runs`` reads (REWARDD_DATA_DIR's SQLite file or
REWARDD_DATABASE_URL; REWARDD_RECORD_RUNS, ``--no-record`` to skip): :class:`OfflineRecord`.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import orjson
import torch
from pydantic import ValidationError
from tqdm import tqdm

from rewardd.service import pipeline
from rewardd.service.models import AdvantagesRequest, ScoreRequest
from rewardd.service.records.recorder import Recorder
from rewardd.service.runstate import MemoryRunStore
from rewardd.service.settings import Settings
from rewardd.service.tenancy import DEFAULT_TENANT
from rewardd.advantages.checks import pydantic_errors, validate_advantages
from rewardd.advantages.errors import RequestInvalid
from rewardd.service.validation import size_limits, validate_score


class BatchInvalid(Exception):
    """Input lines that fail validation; the message lists each line and field."""


@dataclass(slots=True)
class Job:
    """One request to run, and the input line each of its groups came from."""

    request: ScoreRequest | AdvantagesRequest
    lines: list[int]


def _read_lines(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                try:
                    yield number, orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise BatchInvalid(f"line {number}: not valid JSON: {exc}") from None


def _jobs(source: Path, spec_path: Path | None, batch_size: int) -> list[tuple[Any, list[int]]]:
    rows = list(_read_lines(source))
    if spec_path is None:
        return [(data, [number]) for number, data in rows]
    spec = orjson.loads(spec_path.read_bytes())
    return [({**spec, "groups": [d for _, d in chunk]}, [n for n, _ in chunk])
            for chunk in (rows[i:i + batch_size] for i in range(0, len(rows), batch_size))]


def _where(loc: list[Any], lines: list[int], spec_mode: bool) -> str:
    """Say where an error lies: an input line and a field path relative to that line, or the
    spec file when a spec field is at fault (once, however many batches share it)."""
    path = ".".join(map(str, loc[1:]))
    if not spec_mode:
        return f"line {lines[0]}: {path}"
    if len(loc) > 2 and loc[1] == "groups" and isinstance(loc[2], int):
        inner = ".".join(map(str, loc[3:]))
        return f"line {lines[loc[2]]}: {inner or 'group'}"
    return f"spec: {path}"


def load(source: Path, spec_path: Path | None, batch_size: int, settings: Settings) -> list[Job]:
    """Parse and validate every request; raise BatchInvalid naming each bad line and field."""
    jobs: list[Job] = []
    problems: dict[str, None] = {}  # ordered and de-duplicated
    for data, lines in _jobs(source, spec_path, batch_size):
        model = ScoreRequest if isinstance(data, dict) and "rewards" in data else AdvantagesRequest
        try:
            request = model.model_validate(data)
            if isinstance(request, ScoreRequest):
                validate_score(request, settings)
            else:
                validate_advantages(request, size_limits(settings))
        except ValidationError as exc:
            errors = pydantic_errors(exc, ("body",))
        except RequestInvalid as exc:
            errors = exc.errors
        else:
            jobs.append(Job(request, lines))
            continue
        for e in errors:
            problems[f"{_where(e['loc'], lines, spec_path is not None)}: {e['msg']}"] = None
    if problems:
        raise BatchInvalid("invalid input, nothing was scored:\n  " + "\n  ".join(problems))
    return jobs


WARM_UP_LIMIT_S = 120.0
"""How long the pool may take to answer its first pings (a cold forkserver imports the
verifiers); past it, scoring starts anyway and unready workers show as failed cells."""


@dataclass(slots=True)
class Clock:
    """perf_counter readings of one ``rewardd score`` run, in the order they happen."""

    started: float
    imported: float = 0.0
    loaded: float = 0.0
    ready: float = 0.0
    scored: float = 0.0
    written: float = 0.0

    def timings(self) -> dict[str, float]:
        return {"warmup_s": round((self.imported - self.started) + (self.ready - self.loaded), 3),
                "load_s": round(self.loaded - self.imported, 3),
                "scoring_s": round(self.scored - self.ready, 3),
                "elapsed_s": round(self.written - self.started, 3)}


RECORD_FLUSH_S = 120.0
"""How long the command waits for the record's writer (before a job's rollouts are queued,
and at the end) while the database is slow or down; what is still queued after that at the
end is dropped, and the summary says how many."""


@dataclass(frozen=True, slots=True)
class RecordReport:
    """What became of the rollouts a command recorded (the summary's ``record``)."""

    written: int
    dropped: int
    last_error: str | None


class OfflineRecord:
    """The run record of one command: the server's :class:`Recorder` (same settings, same
    database), paced so that nothing is dropped while the database is slower than scoring.

    A server must never wait for its record; a command has no trainer waiting, and a
    dropped rollout would simply be missing from the record. So each job's rollouts are
    queued once the previous job's are written (scoring the next job overlaps that write),
    one tenant's share of the queue is the whole queue (there is one tenant), and
    :meth:`close` waits for the last job's before the command exits. Once a wait times out
    (the database is down) the jobs stop waiting: each would wait as long again, and the
    queue's bounds apply as on a server (the summary counts what was dropped)."""

    def __init__(self, settings: Settings, tenant: str = DEFAULT_TENANT) -> None:
        whole_queue = settings.model_copy(update={"record_tenant_queue": settings.record_queue})
        self.recorder = Recorder(whole_queue)
        self._record = self.recorder.for_tenant(tenant)
        self._paced = True

    def __call__(self, run_id: str | None, step: int | None, groups: Sequence[Any],
                 body: Mapping[str, Any], rewards: Sequence[Any] = (),
                 evaluation: bool = False) -> int:
        """:data:`pipeline.BatchRecorder`, in the thread that built the response."""
        if self._paced and self.recorder.health() is not None:  # the previous job's first
            self._paced = self.recorder.writer().flush(RECORD_FLUSH_S)
        return self._record(run_id, step, groups, body, rewards, evaluation)

    def close(self) -> RecordReport | None:
        """Write what is queued (up to :data:`RECORD_FLUSH_S`), then release the database;
        None when nothing was recorded."""
        if self.recorder.health() is None:
            self.recorder.close()
            return None
        self.recorder.writer().flush(RECORD_FLUSH_S)
        health = self.recorder.health()
        assert health is not None
        self.recorder.close(timeout_s=0)  # what is still queued is dropped, counted below
        return RecordReport(health.written, health.dropped + health.queued, health.last_error)


async def _run(jobs: list[Job], settings: Settings, disable: bool | None,
               clock: Clock, record: OfflineRecord | None = None) -> list[dict[str, Any]]:
    """Start the pool and wait for every worker (warm-up), then score every job with the bar
    running (``disable`` as tqdm takes it), noting both moments on ``clock``."""
    from rewardd.workers.embedded import EmbeddedExecutor

    executor = EmbeddedExecutor(settings.pool_size, settings.plugin_modules)
    runs = MemoryRunStore(settings.run_state_ttl_s)  # state lives for this command's run
    try:
        if any(isinstance(job.request, ScoreRequest) for job in jobs):
            await asyncio.gather(*(executor.ready(WARM_UP_LIMIT_S)
                                   for _ in range(settings.pool_size)))
        clock.ready = time.perf_counter()
        results = []
        with tqdm(total=sum(len(g.rollouts) for j in jobs for g in j.request.groups),
                  unit="rollout", desc="scoring", disable=disable, file=sys.stderr) as bar:
            for job in jobs:
                if isinstance(job.request, ScoreRequest):
                    results.append(await pipeline.score(
                        job.request, executor, settings, runs=runs,
                        on_group=_count_rollouts(bar, job.request), record=record))
                else:
                    results.append(pipeline.advantages(job.request, runs, settings))
                    bar.update(sum(len(g.rollouts) for g in job.request.groups))
        clock.scored = time.perf_counter()
        return results
    finally:
        executor.close()


def _count_rollouts(bar: tqdm, request: ScoreRequest) -> pipeline.GroupCallback:
    """An ``on_group`` callback moving the bar by a group's rollouts once it is verified."""
    sizes = [len(group.rollouts) for group in request.groups]
    return lambda gi, _results: bar.update(sizes[gi])


def _import_plugins(modules: list[str]) -> None:
    """Import verifier plugins here too, not only in the pool: validation must know their
    verifiers' names and parameters."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise BatchInvalid(f"plugin {module!r} (--plugins / REWARDD_PLUGINS) cannot be "
                               f"imported: {exc}") from None


def run_file(source: Path, output: Path, spec_path: Path | None, batch_size: int,
             settings: Settings, progress: bool | None = None,
             started: float | None = None, record: bool = True,
             tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
    """Score ``source`` into ``output``; return the summary over all batches.

    ``progress``: True draws the bar, False never, None only when stderr is a terminal.
    ``started``: the perf_counter reading when the command began (before its imports), so
    the imports count as warm-up; defaults to now. ``record``: requests naming a ``run_id``
    are recorded under ``tenant`` (and REWARDD_RECORD_RUNS); the record is written before
    this returns.
    """
    clock = Clock(time.perf_counter() if started is None else started)
    torch.set_num_threads(settings.torch_threads)
    _import_plugins(settings.plugin_modules)
    clock.imported = time.perf_counter()
    jobs = load(source, spec_path, batch_size, settings)
    clock.loaded = time.perf_counter()
    recording = OfflineRecord(settings, tenant) if record and settings.record_runs else None
    try:
        results = asyncio.run(_run(jobs, settings, None if progress is None else not progress,
                                   clock, recording))
    finally:
        report = recording.close() if recording is not None else None
    with output.open("wb") as handle:
        for result in results:
            records = result["groups"] if spec_path is not None else [result]
            for record in records:
                handle.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    clock.written = time.perf_counter()
    return summarise(results, clock, report)


def summarise(results: list[dict[str, Any]], clock: Clock,
              record: RecordReport | None = None) -> dict[str, Any]:
    sums = {k: sum(r["summary"][k] for r in results)
            for k in ("rollouts", "groups", "failed_cells", "excluded_rollouts",
                      "zero_spread_groups", "singleton_groups")}
    rewards = [(r["summary"]["reward_mean"], r["summary"]["rollouts"] -
                r["summary"]["excluded_rollouts"]) for r in results
               if r["summary"]["reward_mean"] is not None]
    weight = sum(n for _, n in rewards)
    zero = [(r["summary"]["zero_advantage_fraction"], r["summary"]["rollouts"]) for r in results
            if r["summary"]["zero_advantage_fraction"] is not None]
    timings = clock.timings()
    return {"requests": len(results), **sums,
            "reward_mean": sum(m * n for m, n in rewards) / weight if weight else None,
            "zero_advantage_fraction": (sum(f * n for f, n in zero) / sum(n for _, n in zero)
                                        if zero else None),
            **timings,
            "rollouts_per_s": (round(sums["rollouts"] / timings["scoring_s"], 1)
                               if timings["scoring_s"] else None),
            "record": (None if record is None else
                       {"written": record.written, "dropped": record.dropped,
                        "last_error": record.last_error})}
