"""Benchmark: reading a long run back from the record (issue 29: ``GET /v1/runs/{id}/rollouts``
filtered, p99 under 200 ms on 1,000 steps x 512 rollouts in PostgreSQL).

    .venv/bin/python tests/benchmarks/bench_record_query.py [--steps 1000] [--url URL]

Fills a scratch database (created on ``--url``'s server, default the machine's PostgreSQL,
dropped at the end) with one run of ``--steps`` x 512 rollouts (two components, ~10% failed,
four sources, 300-character completions) through ``RecordStore.write``, then times the store's
queries as the route runs them (``RecordStore.rollouts``, a page of 100; ``RecordStore.steps``)
for each filter: ``--queries`` random ones each, p50 and p99. The route adds JSON encoding of
the page (about 1 ms here) and the HTTP hop.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.service.records.models import RolloutQuery, RolloutRecord, Verdict  # noqa: E402
from rewardd.service.records.store import RecordStore  # noqa: E402
from tests.support.postgres import MACHINE_URL, scratch_database  # noqa: E402

PER_STEP = 512
SOURCES = ("gsm8k", "math", "aime", "code")
TEXT = "Let us reason carefully about each quantity before the final answer. " * 4


def rollouts_of(step: int, rng: random.Random) -> list[RolloutRecord]:
    out = []
    for i in range(PER_STEP):
        failed = rng.random() < 0.1
        math = (Verdict("math", None, "timeout", {"ok": False, "error": "timeout"}) if failed
                else Verdict("math", float(rng.random() < 0.5), "ok",
                             {"ok": True, "detail": {"extracted": str(i), "rule": "boxed"}}))
        out.append(RolloutRecord(
            tenant="bench", run_id="long-run", group_id=f"s{step}-g{i // 8}",
            rollout_id=f"s{step}-r{i}", recorded_at=1e9 + step,
            verdicts=(Verdict("format", 1.0, "ok", {"ok": True}), math), step=step,
            source=SOURCES[i % 4], summary={"reward": 1.0, "excluded": False},
            completion=f"{TEXT} answer {rng.randint(0, 10**6)}", num_tokens=64,
            zero_advantage=False))
    return out


def timed(fn: Callable[[], object], count: int) -> tuple[float, float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--url", default=MACHINE_URL, help="a PostgreSQL server to use")
    args = parser.parse_args()
    rng = random.Random(0)
    with scratch_database(args.url, prefix="rewardd_bench") as url:
        store = RecordStore.open(url)
        started = time.perf_counter()
        for step in range(args.steps):
            store.write(rollouts_of(step, rng))
            if step % 100 == 99:
                print(f"{step + 1}/{args.steps} steps written", file=sys.stderr)
        fill_s = time.perf_counter() - started
        with store.engine.begin() as connection:  # committed: statistics as autovacuum keeps
            connection.exec_driver_sql("ANALYZE")

        def page(**filters: object) -> Callable[[], object]:
            def run() -> object:
                chosen = {k: (v() if callable(v) else v) for k, v in filters.items()}
                return store.rollouts("bench", "long-run", RolloutQuery(limit=100, **chosen))
            return run

        step = lambda: rng.randrange(args.steps)  # noqa: E731
        cases = {
            "first page, no filter": page(),
            "step": page(step=step),
            "step + source": page(step=step, source=lambda: rng.choice(SOURCES)),
            "step + failed": page(step=step, outcome="failed"),
            "component + failure kind": page(component="math", outcome="timeout"),
            "step + component failed": page(step=step, component="math", outcome="failed"),
            "step + text": page(step=step, text=lambda: f"answer {rng.randint(0, 9)}"),
            "deep cursor": page(after=lambda: rng.randrange(args.steps * PER_STEP)),
            "per-step summaries (last 20, the default)": lambda: store.steps(
                "bench", "long-run", 20),
            "per-step summaries (last 100)": lambda: store.steps("bench", "long-run", 100),
        }
        rows = []
        for name, fn in cases.items():
            p50, p99 = timed(fn, args.queries if "summaries" not in name else 20)
            rows.append((name, p50, p99))
        store.close()
    print(f"{args.steps * PER_STEP:,} rollouts in PostgreSQL (written in {fill_s:.0f} s); "
          f"pages of 100, {args.queries} queries each:")
    print("| query | p50 ms | p99 ms |\n|---|---:|---:|")
    for name, p50, p99 in rows:
        print(f"| {name} | {p50 * 1000:.1f} | {p99 * 1000:.1f} |")


if __name__ == "__main__":
    main()
