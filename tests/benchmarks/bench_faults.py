"""Benchmark: the time each fault adds to a 2,000-rollout batch (distributed, 2 workers).

    .venv/bin/python tests/benchmarks/bench_faults.py [--repeat 1] [--rollouts 2000]

For each fault, a private ``redis-server`` (persistence as the row says), two
``rewardd worker --concurrency 2`` processes and a CeleryExecutor in this process
(tests/faults use the same pieces). The batch: ``--rollouts`` rollouts in groups of 8
through ``test_sleep`` (``--sleep-ms`` each, so the batch lasts long enough for a fault to
land mid-way), run once clean and then once with the fault injected ``--at`` of the way
through the clean run's time; medians over ``--repeat`` rounds. Rows:

* ``worker pod SIGKILL + restart 1 s later``: one worker's process group killed, a new
  worker started 1 s later;
* ``Redis restart, no persistence`` / ``Redis restart, AOF everysec``: redis-server SIGKILLed
  and started again on the same port 0.5 s later;
* ``queue with no consumer``: a batch routed to a queue no worker consumes; the time until
  its typed ``unavailable`` (REWARDD_NO_CONSUMER_GRACE_S, default 10 s).

Every cell of every batch must be right (or, for the last row, ``unavailable``); otherwise
the row says how many were not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("REWARDD_LOG_LEVEL", "warning")

import tests.plugins.faulty  # noqa: E402,F401 - registers test_sleep (request validation)
from rewardd.service import pipeline  # noqa: E402
from rewardd.service.models import RewardsRequest  # noqa: E402
from rewardd.workers.distributed import CeleryExecutor  # noqa: E402
from tests.integration.conftest import WorkerFleet, make_settings, worker_env  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

GROUP = 8


def batch(rollouts: int, sleep_s: float, verifier: str = "test_sleep") -> RewardsRequest:
    groups = rollouts // GROUP
    return RewardsRequest.model_validate({
        "rewards": [{"name": "r", "verifier": verifier, "timeout_s": 2.0,
                     "params": {"seconds": sleep_s, "when": ["sleep"]}}],
        "groups": [{"group_id": f"g{i}", "rollouts": [
            {"rollout_id": f"g{i}-{j}", "completion": "sleep" if j % 2 == 0 else str(i)}
            for j in range(GROUP)]} for i in range(groups)]})


def wrong_cells(result: dict[str, Any]) -> int:
    wrong = 0
    for i, group in enumerate(result["groups"]):
        for j, rollout in enumerate(group["rollouts"]):
            if rollout["rewards"].get("r") != (1.0 if j % 2 == 0 else float(i)):
                wrong += 1
    return wrong


class Setup:
    """A private Redis, two workers and an executor; closed at the end."""

    def __init__(self, aof: bool, **overrides: Any) -> None:
        self.redis = RedisServer(aof=aof).start()
        self.settings = make_settings(broker_url=self.redis.url(), plugins="tests.plugins.faulty",
                                      max_verifier_timeout_s=2.0, verifier_timeout_s=2.0,
                                      **overrides)
        env = worker_env(self.settings)
        env["REWARDD_VERIFIER_TIMEOUT_S"] = str(self.settings.verifier_timeout_s)
        env["REWARDD_QUEUE_ROUTES"] = self.settings.queue_routes
        self.fleet = WorkerFleet(env)
        self.workers = self.fleet.start(2, concurrency=2)
        self.executor = CeleryExecutor(self.settings)

    async def run(self, request: RewardsRequest,
                  fault: Callable[[], Any] | None = None, at_s: float = 0.0
                  ) -> tuple[float, dict[str, Any]]:
        started = time.monotonic()
        task = asyncio.create_task(pipeline.rewards(request, self.executor, self.settings))
        if fault is not None:
            await asyncio.sleep(at_s)
            await asyncio.get_running_loop().run_in_executor(None, fault)
        result = await task
        return time.monotonic() - started, result

    def close(self) -> None:
        self.executor.close()
        self.fleet.stop()
        self.redis.close()


async def fault_row(name: str, aof: bool, fault: Callable[[Setup], Callable[[], Any]],
                    args: argparse.Namespace) -> dict[str, Any]:
    clean, faulty, wrong = [], [], 0
    for _ in range(args.repeat):
        setup = Setup(aof)
        try:
            assert await setup.executor.ready(wait_s=30)
            await setup.run(batch(80, 0.0))  # warm: census, windows, connections
            took, result = await setup.run(batch(args.rollouts, args.sleep_ms / 1000))
            clean.append(took)
            wrong += wrong_cells(result)
            took, result = await setup.run(batch(args.rollouts, args.sleep_ms / 1000),
                                           fault(setup), took * args.at)
            faulty.append(took)
            wrong += wrong_cells(result)
        finally:
            setup.close()
    base, hit = statistics.median(clean), statistics.median(faulty)
    return {"fault": name, "clean_s": base, "faulty_s": hit, "added_s": hit - base,
            "wrong": wrong}


def kill_pod(setup: Setup) -> Callable[[], None]:
    def fault() -> None:
        setup.workers[0].kill()
        time.sleep(1.0)
        setup.fleet.start(1, concurrency=2)  # its start-up runs while the batch goes on
    return fault


def restart_redis(setup: Setup) -> Callable[[], None]:
    return lambda: setup.redis.restart(0.5)


async def no_consumer_row(args: argparse.Namespace) -> dict[str, Any]:
    times, wrong = [], 0
    for _ in range(args.repeat):
        setup = Setup(False, queue_routes="test_sleep=nobody")
        try:
            assert await setup.executor.ready(wait_s=30)
            took, result = await setup.run(batch(args.rollouts, args.sleep_ms / 1000))
            times.append(took)
            wrong += sum(1 for g in result["groups"] for r in g["rollouts"]
                         if r["status"]["r"].get("error") != "unavailable")
        finally:
            setup.close()
    return {"fault": "queue with no consumer (time to the typed `unavailable`)",
            "clean_s": None, "faulty_s": statistics.median(times), "added_s": None,
            "wrong": wrong}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--sleep-ms", type=float, default=10.0)
    parser.add_argument("--at", type=float, default=0.4,
                        help="the fault lands this fraction into the clean run's time")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    rows = [await fault_row("worker pod SIGKILL + restart 1 s later", False, kill_pod, args),
            await fault_row("Redis restart, no persistence", False, restart_redis, args),
            await fault_row("Redis restart, AOF everysec", True, restart_redis, args),
            await no_consumer_row(args)]
    print(f"\n{args.rollouts} rollouts (groups of {GROUP}, test_sleep {args.sleep_ms:g} ms), "
          f"2 workers x 2 children, fault at {args.at:.0%} of the clean time, "
          f"median of {args.repeat}\n")
    print("| fault | clean batch (s) | with the fault (s) | added (s) | wrong cells |")
    print("|---|---|---|---|---|")
    for row in rows:
        fmt = (lambda v: "-" if v is None else f"{v:.1f}")
        print(f"| {row['fault']} | {fmt(row['clean_s'])} | {fmt(row['faulty_s'])} | "
              f"{fmt(row['added_s'])} | {row['wrong']} |")


if __name__ == "__main__":
    asyncio.run(main())
