"""Benchmark: what the sentinel costs a step, on a run of 1,000 steps (issue 30).

    .venv/bin/python tests/benchmarks/bench_sentinel.py [--steps 1000] [--repeat 20]

Three costs, side by side in one run:

* **per batch, in the record's writer thread**: turning a scored 512-rollout batch into its
  records (:func:`~rewardd.service.records.recorder.batch_rows`, which now includes its step
  statistics) and the step statistics alone (:func:`~rewardd.service.stepstats.batch_stats`),
  so their share of the record's own work;
* **per step, after the write**: :meth:`Recorder.watch` on a run of ``--steps`` recorded
  steps in SQLite (reads the last 21 steps' statistics, evaluates the six signals at the
  newest), beside the write of that step's 512 rollouts;
* **per query**: ``GET /v1/runs/{id}/alerts``'s work, every signal over all ``--steps``
  steps (:func:`~rewardd.service.sentinel.evaluate` after reading them).

The batches come from the scripted policy of the sentinel's acceptance
(``tests/support/policy_sim.py``, 64 groups x 8 rollouts, a clean step with a strict audit at
rate 0.25), so the statistics are the size real ones are. Medians over ``--repeat``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.service import pipeline, sentinel  # noqa: E402
from rewardd.service.records.recorder import Recorder, batch_rows  # noqa: E402
from rewardd.service.records.store import RecordStore  # noqa: E402
from rewardd.service.settings import Settings  # noqa: E402
from rewardd.service.stepstats import batch_stats  # noqa: E402
from tests.support import policy_sim  # noqa: E402
from tests.support.executors import InlineExecutor  # noqa: E402


def median_ms(work: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    policy_sim.GROUPS = 64  # 512 rollouts a step
    rng = random.Random(0)
    settings = Settings(record_completions="all", canary_rate=0.0)
    weights = {spec["name"]: float(spec.get("weight", 1.0)) for spec in policy_sim.REWARDS}
    req = policy_sim.step_request("bench", 25, rng, None)
    body = asyncio.run(pipeline.score(req, InlineExecutor(), settings))

    rows_ms = median_ms(lambda: batch_rows("t", "bench", 25, req.groups, body, settings, 0.0,
                                           weights=weights), args.repeat)
    stats_ms = median_ms(lambda: batch_stats(req.groups, body, weights), args.repeat)
    stats = batch_stats(req.groups, body, weights)

    with tempfile.TemporaryDirectory() as folder:
        store = RecordStore.open(f"sqlite:///{folder}/record.db")
        template = batch_rows("t", "bench", 0, req.groups, body, settings, 0.0,
                              weights=weights)[0]
        with store.engine.begin() as connection:  # the run's steps: their statistics only
            connection.exec_driver_sql(
                "INSERT INTO batches (tenant, run_id, step, recorded_at, stats) "
                "VALUES (?, ?, ?, ?, ?)",
                [("t", "bench", step, float(step), template.batch)
                 for step in range(args.steps - 1)])
        recorder = Recorder(Settings(data_dir=folder))
        newest = batch_rows("t", "bench", args.steps - 1, req.groups, body, settings, 0.0,
                            weights=weights)
        write_ms = median_ms(lambda: store.write(newest), max(3, args.repeat // 4))
        watch_ms = median_ms(lambda: recorder.watch(store, newest), args.repeat)
        query_ms = median_ms(lambda: sentinel.evaluate(
            [(s, x) for s, x in store.step_stats("t", "bench") if s is not None]),
            max(3, args.repeat // 4))
        read_ms = median_ms(lambda: store.step_stats("t", "bench"), max(3, args.repeat // 4))
        store.close()

    size = len(template.batch or "")
    print(f"sentinel on a {args.steps}-step run, 512-rollout steps (median of {args.repeat})")
    print(f"{'work':<52}{'ms':>9}")
    print(f"{'records of a step (batch_rows, with its statistics)':<52}{rows_ms:>9.2f}")
    print(f"{'  of which the step statistics (batch_stats)':<52}{stats_ms:>9.2f}"
          f"   {stats_ms / rows_ms:.0%} of it; {size} bytes stored")
    print(f"{'writing the step (SQLite)':<52}{write_ms:>9.2f}")
    print(f"{'sentinel after the write (watch: 21 steps read)':<52}{watch_ms:>9.2f}"
          f"   {watch_ms / write_ms:.0%} of the write")
    print(f"{'GET alerts: read all steps':<52}{read_ms:>9.2f}")
    print(f"{'GET alerts: read and evaluate all steps':<52}{query_ms:>9.2f}")
    print(f"rollouts per step: {stats.rollouts}; audit pairs: "
          f"{sum(len(p) for p in stats.audit.values())}")


if __name__ == "__main__":
    main()
