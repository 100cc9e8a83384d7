"""Benchmark: what recording a run costs a scoring request (issue 29: at most 5% more time).

    .venv/bin/python tests/benchmarks/bench_record.py [--rounds 8] [--postgres URL]

Two real ``rewardd serve --pool-size 2`` side by side on this machine, one recording
(``REWARDD_RECORD_COMPLETIONS=all``, a SQLite file; or ``--postgres URL``: an empty database
the caller made, whose server shares this machine's cores too), one not (``REWARDD_RECORD_RUNS=false``). Each round posts a fresh 512-rollout
math batch (64 groups x 8: boxed answers, a third wrong, ~300-character completions; the same
batch to both) to ``/v1/score`` with a ``run_id``, the two servers in alternating order, one
request at a time, so the machine's drift hits both alike. Reported: the median time per batch
of each, their ratio, and that every recorded rollout reached the database.

Also, in this process, the recording work itself on one such answer, all of it in the writer
thread: turning it into rows (``batch_rows``) and one transaction writing them
(``RecordStore.write``), on SQLite (or in the ``--postgres`` database, under another tenant).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.service.models import ScoreRequest  # noqa: E402
from rewardd.service.records.models import ComponentInput  # noqa: E402
from rewardd.service.records.recorder import batch_rows  # noqa: E402
from rewardd.service.records.store import RecordStore  # noqa: E402
from rewardd.service.settings import Settings  # noqa: E402
from tests.support.server import running_server  # noqa: E402

GROUPS, PER_GROUP = 64, 8
FILLER = ("Let us work through the problem step by step, checking each intermediate "
          "quantity before combining them into the final result. ") * 2


def batch(round_no: int, run_id: str) -> dict[str, Any]:
    rng = random.Random(round_no)
    groups = []
    for g in range(GROUPS):
        answer = rng.randint(2, 10_000)
        rollouts = []
        for r in range(PER_GROUP):
            given = answer if r % 3 else answer + rng.randint(1, 9)
            rollouts.append({"rollout_id": f"{g}-{r}", "num_tokens": 64,
                             "completion": f"{FILLER}So the answer is \\boxed{{{given}}}."})
        groups.append({"group_id": f"r{round_no}-g{g}", "source": "bench",
                       "reference": {"answer": str(answer)}, "rollouts": rollouts})
    return {"run_id": run_id, "step": round_no, "groups": groups,
            "rewards": [{"name": "math", "verifier": "math"}],
            "advantage": {"estimator": "grpo"}}


def post(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = httpx.post(f"{url}/v1/score", json=body, timeout=600)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response.json()


def in_process_cost(answer: dict[str, Any], body: dict[str, Any], postgres: str | None,
                    repeat: int = 5) -> str:
    settings = Settings(record_completions="all")
    request = ScoreRequest.model_validate(body)
    components = tuple(ComponentInput(spec.name, spec.verifier, spec.params, spec.timeout_s)
                       for spec in request.rewards)
    with tempfile.TemporaryDirectory() as tmp:
        store = RecordStore.open(postgres or f"sqlite:///{tmp}/bench.sqlite3")
        build, write = [], []
        for _ in range(repeat):
            started = time.perf_counter()
            rows = batch_rows("bench-in-process", body["run_id"], body["step"], request.groups,
                              answer, settings, time.time(), components)
            build.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.write(rows)
            write.append(time.perf_counter() - started)
        store.close()
    return (f"in process, one 512-rollout answer, both in the writer thread: batch_rows "
            f"{statistics.median(build) * 1000:.1f} ms, "
            f"RecordStore.write {statistics.median(write) * 1000:.1f} ms "
            f"({'PostgreSQL' if postgres else 'SQLite'}; the request pays one append)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--postgres", default=None, help="record into this PostgreSQL URL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        recording_env = {"REWARDD_DATA_DIR": data, "REWARDD_RECORD_COMPLETIONS": "all"}
        if args.postgres:
            recording_env["REWARDD_DATABASE_URL"] = args.postgres
        with running_server("--pool-size", "2", env=recording_env) as recording, \
                running_server("--pool-size", "2",
                               env={"REWARDD_RECORD_RUNS": "false"}) as plain:
            times: dict[str, list[float]] = {"recording": [], "not recording": []}
            run_id = f"bench-{int(time.time())}"
            last: tuple[dict[str, Any], dict[str, Any]] | None = None
            for round_no in range(args.warmup + args.rounds):
                body = batch(round_no, run_id)
                order = [("recording", recording), ("not recording", plain)]
                if round_no % 2:
                    order.reverse()
                for name, url in order:
                    elapsed, answer = post(url, body)
                    if round_no >= args.warmup:
                        times[name].append(elapsed)
                    last = (answer, body)
                print(f"round {round_no + 1}/{args.warmup + args.rounds}", file=sys.stderr)
            deadline = time.monotonic() + 120
            expected = GROUPS * PER_GROUP * (args.warmup + args.rounds)
            while True:
                view = httpx.get(f"{recording}/v1/runs/{run_id}", timeout=60).json()
                if view["record"]["rollouts"] == expected or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    on, off = (statistics.median(times[k]) for k in ("recording", "not recording"))
    backend = "PostgreSQL" if args.postgres else "SQLite"
    print(f"/v1/score, {GROUPS * PER_GROUP} math rollouts, median of {args.rounds} rounds "
          f"({backend}):")
    print(f"| not recording | {off * 1000:.0f} ms | 1.00 |")
    print(f"| recording all | {on * 1000:.0f} ms | {on / off:.3f} |")
    print(f"recorded {view['record']['rollouts']} of {expected} rollouts")
    assert last is not None
    print(in_process_cost(*last, args.postgres))


if __name__ == "__main__":
    main()
