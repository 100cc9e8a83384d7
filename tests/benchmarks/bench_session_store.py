"""Benchmark: the CPU a streaming session costs its API process, per rollout, through the
session manager's public interface (no HTTP, an executor that answers at once).

    .venv/bin/python tests/benchmarks/bench_session_store.py [--store memory|redis|both]
                                                             [--repeat 5] [--json out.json]
    .venv/bin/python tests/benchmarks/bench_session_store.py --codec

32 groups of 16 rollouts arrive one rollout per ``add`` (the per-sample trainers' pattern,
the most store updates per rollout), each group is waited for, then the session closes. The
figure is the process's CPU time (user + system: the event loop, the stores' encoding and
decoding, the advantage code), the median of ``--repeat`` runs, per rollout. With
``--store redis`` the session lives in Redis (``--url``, database 14 by default, emptied
before and after: run it under the tests' lock), so every update also encodes and decodes
the group's stored JSON.

Written against the interface every version of the manager has, so the same script measures
a change side by side (run it on both checkouts, one after the other).

``--codec`` measures what a Redis store pays per update of a 16-rollout group, encoding and
decoding its JSON: as plain dicts (what the store did before the records were typed), through
the typed records' ``to_json`` / ``from_json``, and through equivalent pydantic models (the
choice :mod:`rewardd.service.sessions.records` did not make).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.service.services import build_services  # noqa: E402
from rewardd.service.settings import Settings  # noqa: E402
from rewardd.verifiers.base import Outcome  # noqa: E402
from rewardd.workers.executor import (CallDoneCallback, CallResult, ItemResult,  # noqa: E402
                                      ProgressCallback, VerifyCall)
from tests.support.executors import RefusingExecutor  # noqa: E402

GROUPS, SIZE = 32, 16
SPEC = {"rewards": [{"name": "r", "verifier": "exact_match"}], "group_size": SIZE,
        "advantage": {"estimator": "grpo", "output": "dense"}}


class InstantExecutor(RefusingExecutor):
    """Rewards float(completion) at once: the benchmark measures the session, not checks."""

    kind = "instant"

    async def run(self, calls: Sequence[VerifyCall], progress: ProgressCallback | None = None,
                  on_call_done: CallDoneCallback | None = None) -> list[CallResult]:
        results = [CallResult([ItemResult(Outcome.success(float(s.completion)), 0.0)
                               for s in call.samples]) for call in calls]
        if on_call_done is not None:
            for index, result in enumerate(results):
                on_call_done(index, result)
        return results


def rollouts() -> list[tuple[str, dict[str, Any]]]:
    """(group id, rollout) in arrival order: the groups' rollouts interleaved."""
    return [(f"g{g}", {"rollout_id": f"g{g}#{i}", "completion": str((g + i) % 2),
                       "num_tokens": 64 + i})
            for i in range(SIZE) for g in range(GROUPS)]


async def one_session(settings: Settings) -> float:
    services = build_services(settings, executor=InstantExecutor())
    manager = services.sessions
    await manager.start()
    try:
        sid = await manager.open("bench", SPEC)
        seen: set[str] = set()
        start = time.process_time()
        for gid, rollout in rollouts():
            group: dict[str, Any] = {"group_id": gid, "rollouts": [rollout]}
            if gid not in seen:
                seen.add(gid)
                group.update(prompt=f"prompt {gid}", reference={"answer": "1"})
            await manager.add("bench", sid, [group])
        for g in range(GROUPS):
            got = await manager.wait_group("bench", sid, f"g{g}", 60.0)
            assert got is not None, f"group g{g} did not complete"
        closed = await manager.close("bench", sid)
        assert closed["state"] == "closed", closed
        return time.process_time() - start
    finally:
        await manager.stop()
        if services.runtime.redis is not None:
            await services.runtime.redis.aclose()


def measure(store: str, url: str, repeat: int) -> dict[str, float]:
    overrides = {"state_url": url} if store == "redis" else {}
    settings = Settings(session_max_inflight=10**6, **overrides)
    if store == "redis":
        import redis

        redis.Redis.from_url(url).flushdb()
    try:
        asyncio.run(one_session(settings))  # warm-up: imports, first compilations
        runs = [asyncio.run(one_session(settings)) for _ in range(repeat)]
    finally:
        if store == "redis":
            redis.Redis.from_url(url).flushdb()
    per = [r / (GROUPS * SIZE) * 1e6 for r in runs]
    return {"median_us_per_rollout": statistics.median(per), "min_us_per_rollout": min(per),
            "max_us_per_rollout": max(per)}


def codec(repeat: int) -> dict[str, float]:
    """Microseconds per encode + decode of one stored 16-rollout group, by way."""
    import timeit

    from pydantic import BaseModel

    from rewardd.service.sessions.records import GroupRecord, RolloutEntry

    class RolloutModel(BaseModel):
        id: str
        digest: str
        owner: str
        checked: bool
        cells: dict[str, dict[str, Any]]
        body: dict[str, Any]

    class GroupModel(BaseModel):
        group_id: str
        index: int
        first: float
        prompt: str
        reference: dict[str, Any]
        data_source: str | None
        state: str
        reason: str | None
        failed: bool
        whole_owner: str | None
        whole_done: bool
        event: dict[str, Any] | None
        rollouts: list[RolloutModel]

    group = GroupRecord(group_id="g0", index=0, first=time.time(), prompt="p" * 200,
                        reference={"answer": "42"}, data_source=None, rollouts=[
                            RolloutEntry(id=f"g0#{i}", digest="d" * 64, owner="host:1:abcd",
                                         checked=True, body={"rollout_id": f"g0#{i}",
                                                             "completion": "c" * 400,
                                                             "num_tokens": 100 + i},
                                         cells={"r": {"ok": True, "reward": 1.0,
                                                      "error": None, "detail": {}}})
                            for i in range(SIZE)])
    plain = group.to_json()
    raw = orjson.dumps(plain)
    ways = {
        "dicts (before)": lambda: orjson.loads(orjson.dumps(plain)),
        "typed records": lambda: GroupRecord.from_json(orjson.loads(orjson.dumps(
            group.to_json()))),
        "pydantic models": lambda: GroupModel.model_validate_json(
            GroupModel.model_validate_json(raw).model_dump_json()),
    }
    out = {}
    for name, way in ways.items():
        runs = timeit.repeat(way, number=2000, repeat=max(3, repeat))
        out[name] = min(runs) / 2000 * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["memory", "redis", "both"], default="both")
    parser.add_argument("--url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--codec", action="store_true",
                        help="measure the stored JSON's encoding and decoding only")
    args = parser.parse_args()
    if args.codec:
        for name, us in codec(args.repeat).items():
            print(f"{name:16s}  {us:6.1f} us per encode + decode of a {SIZE}-rollout group")
        return
    stores = ["memory", "redis"] if args.store == "both" else [args.store]
    out = {store: measure(store, args.url, args.repeat) for store in stores}
    for store, figures in out.items():
        print(f"{store:6s}  CPU per rollout: median {figures['median_us_per_rollout']:.0f} us "
              f"(min {figures['min_us_per_rollout']:.0f}, max {figures['max_us_per_rollout']:.0f})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
