"""Offline batch scoring of JSONL files (``rewardd score``) through the service pipeline.

All lines are validated before any work starts, so a typo on line 9,000 costs seconds, not
an hour; every error names its line and field. Results stream to the output file in input
order; a progress bar counts verifier checks (rollout x component) as they finish.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import orjson
import torch
from pydantic import ValidationError
from tqdm import tqdm

from rewardd.service import pipeline
from rewardd.service.models import AdvantagesRequest, ScoreRequest
from rewardd.service.runstate import MemoryRunStore
from rewardd.service.settings import Settings
from rewardd.service.validation import (RequestInvalid, pydantic_errors, validate_advantages,
                                validate_score)


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
                validate_advantages(request)
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


async def _run(jobs: list[Job], settings: Settings, bar: tqdm) -> list[dict[str, Any]]:
    from rewardd.workers.embedded import EmbeddedExecutor

    executor = EmbeddedExecutor(settings.pool_size, settings.plugin_modules)
    runs = MemoryRunStore(settings.run_state_ttl_s)  # state lives for this command's run
    try:
        results = []
        for job in jobs:
            if isinstance(job.request, ScoreRequest):
                results.append(await pipeline.score(job.request, executor, settings, bar.update,
                                                    runs))
            else:
                results.append(pipeline.advantages(job.request, runs))
                bar.update(sum(len(g.rollouts) for g in job.request.groups))
        return results
    finally:
        executor.close()


def run_file(source: Path, output: Path, spec_path: Path | None, batch_size: int,
             settings: Settings, progress: bool = True) -> dict[str, Any]:
    """Score ``source`` into ``output``; return the summary over all batches."""
    started = time.perf_counter()
    torch.set_num_threads(settings.torch_threads)
    jobs = load(source, spec_path, batch_size, settings)
    total = sum(len(g.rollouts) * max(1, len(getattr(j.request, "rewards", ())))
                for j in jobs for g in j.request.groups)
    with tqdm(total=total, unit="check", disable=not progress, desc="scoring") as bar:
        results = asyncio.run(_run(jobs, settings, bar))
    with output.open("wb") as handle:
        for result in results:
            records = result["groups"] if spec_path is not None else [result]
            for record in records:
                handle.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return summarise(results, time.perf_counter() - started)


def summarise(results: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    sums = {k: sum(r["summary"][k] for r in results)
            for k in ("rollouts", "groups", "failed_cells", "excluded_rollouts",
                      "zero_spread_groups", "singleton_groups")}
    rewards = [(r["summary"]["reward_mean"], r["summary"]["rollouts"] -
                r["summary"]["excluded_rollouts"]) for r in results
               if r["summary"]["reward_mean"] is not None]
    weight = sum(n for _, n in rewards)
    zero = [(r["summary"]["zero_advantage_fraction"], r["summary"]["rollouts"]) for r in results
            if r["summary"]["zero_advantage_fraction"] is not None]
    return {"requests": len(results), **sums,
            "reward_mean": sum(m * n for m, n in rewards) / weight if weight else None,
            "zero_advantage_fraction": (sum(f * n for f, n in zero) / sum(n for _, n in zero)
                                        if zero else None),
            "elapsed_s": round(elapsed, 3),
            "rollouts_per_s": round(sums["rollouts"] / elapsed, 1) if elapsed else None}
