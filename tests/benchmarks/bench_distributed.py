"""Benchmark: distributed execution (Celery over Redis) against the embedded process pool.

    .venv/bin/python tests/benchmarks/bench_distributed.py [--repeat 5] [--quick]

Three real API servers, started side by side and measured interleaved, round by round, so
drift of a shared machine hits them alike:

* ``embedded``: ``rewardd serve --pool-size C``;
* ``distributed, 1 worker``: ``rewardd serve --broker-url redis://127.0.0.1:6379/<db>`` and
  one ``rewardd worker --queues cpu --concurrency C``;
* ``distributed, 2 workers``: the same on the next database with two workers of ``C/2``.

Total verifier concurrency ``C`` (``--concurrency``, default 2) is the same in every
configuration. The servers, pools and workers share this machine's cores.

1. Batch: POST /v1/score with 512 math rollouts in 32 groups of 16 (generated answers:
   fractions, decimals, integers, radicals, polynomials, some wrong, in prose ending in a
   boxed answer), a fresh batch each round (the verifier's per-process caches never see a
   batch twice), the same batches for every configuration; medians of ``--repeat`` rounds
   after ``--warmup``. Broker overhead per rollout = (distributed - embedded) / 512; measured
   again with ``exact_match`` (verification work near zero) where nearly all of the
   difference is the broker path: publishing, queueing, result storage and polling.
2. Load: ``--clients`` concurrent clients (httpx.AsyncClient) send ``--requests`` requests of
   ``--load-groups`` x 16 math rollouts in total, one configuration at a time; p50/p99
   latency, throughput, and errors (HTTP errors and failed verifier cells).

Every process started here runs in its own process group and is killed at the end, also on
Ctrl-C or an error; the Redis databases used (``--db`` and the next one) are flushed before
and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.server import child_env, free_port  # noqa: E402

GROUP_SIZE = 16
READY_S = 120.0


# ------------------------------------------------------------------------------ batches

_PROSE = (
    "We start by writing down what is given and what is asked.",
    "Let us simplify the expression step by step.",
    "Multiplying both sides by the denominator clears the fractions.",
    "Checking the boundary cases shows that nothing is lost.",
    "Wait, let me double-check the sign in the previous step. It is correct.",
    "Grouping the terms pairwise makes the pattern clear.",
    "A quick estimate is consistent with this value.",
)


def _question(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(reference, equivalent answers, wrong answers) of one generated question."""
    kind = rng.randrange(5)
    if kind == 0:  # a fraction
        while True:
            a, b = rng.randint(1, 999), rng.randint(2, 999)
            if Fraction(a, b).denominator == b:
                break
        right = [f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\dfrac{{{2 * a}}}{{{2 * b}}}"]
        wrong = [f"\\frac{{{a + 1}}}{{{b}}}", f"\\frac{{{b}}}{{{a}}}", f"{a}/{b + 1}"]
        return f"\\frac{{{a}}}{{{b}}}", right, wrong
    if kind == 1:  # a terminating decimal
        a, b = rng.randint(1, 9999), rng.choice([4, 8, 16, 20, 25, 40])
        value = Fraction(a, b)
        decimal = f"{a / b:.6f}".rstrip("0").rstrip(".")
        right = [decimal, f"\\frac{{{value.numerator}}}{{{value.denominator}}}",
                 f"{value.numerator}/{value.denominator}"]
        wrong = [f"{a / b + 0.5:.6f}".rstrip("0").rstrip("."), str(a), f"{b}/{a}"]
        return f"\\frac{{{a}}}{{{b}}}", right, wrong
    if kind == 2:  # an integer
        n = rng.randint(-99999, 99999)
        right = [str(n), f"{n}.0", f"{n:,}".replace(",", "{,}") if abs(n) >= 1000 else str(n)]
        wrong = [str(n + 1), str(n - 1), str(-n if n else 7)]
        return str(n), right, wrong
    if kind == 3:  # a radical
        k, m = rng.randint(2, 40), rng.choice([2, 3, 5, 6, 7, 10, 11, 13])
        right = [f"{k}\\sqrt{{{m}}}", f"\\sqrt{{{k * k * m}}}", f"{k} \\sqrt{m}"]
        wrong = [f"{k + 1}\\sqrt{{{m}}}", f"\\sqrt{{{k * m}}}", f"{k}\\sqrt{{{m + 1}}}"]
        return f"{k}\\sqrt{{{m}}}", right, wrong
    p, q = rng.randint(1, 30), rng.randint(1, 30)  # a polynomial
    right = [f"x^2 + {p + q}x + {p * q}", f"(x+{p})(x+{q})", f"{p * q} + {p + q}x + x^2"]
    wrong = [f"x^2 + {p + q + 1}x + {p * q}", f"(x+{p})(x-{q})", f"x^2 + {p * q}"]
    return f"x^2 + {p + q}x + {p * q}", right, wrong


def _completion(rng: random.Random, answer: str) -> str:
    steps = " ".join(rng.sample(_PROSE, rng.randint(2, 4)))
    return f"{steps} Therefore, the final answer is $\\boxed{{{answer}}}$."


def score_body(seed: int, groups: int, verifier: str = "math") -> dict[str, Any]:
    """A /v1/score body: ``groups`` groups of 16 generated rollouts (about half right)."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        reference, right, wrong = _question(rng)
        rollouts = []
        for r in range(GROUP_SIZE):
            answer = rng.choice(right if rng.random() < 0.5 else wrong)
            if verifier == "exact_match":
                completion = answer  # a string comparison: no verification work to speak of
            else:
                completion = _completion(rng, answer)
            rollouts.append({"rollout_id": f"s{seed}-g{g}-r{r}", "completion": completion,
                             "num_tokens": rng.randint(64, 1024)})
        out.append({"group_id": f"s{seed}-g{g}", "reference": {"answer": reference},
                    "rollouts": rollouts})
    return {"rewards": [{"name": "correct", "verifier": verifier}],
            "advantage": {"estimator": "grpo", "output": "rle"}, "groups": out}


def check(response: httpx.Response, rollouts: int) -> tuple[list[float], int]:
    """(the rewards in order, failed cells); AssertionError on a malformed answer."""
    if response.status_code != 200:
        raise AssertionError(f"HTTP {response.status_code}: {response.text[:300]}")
    body = response.json()
    cells = [r for g in body["groups"] for r in g["rollouts"]]
    if len(cells) != rollouts:
        raise AssertionError(f"{len(cells)} rollouts back, {rollouts} sent")
    failed = sum(1 for r in cells if (r.get("status") or {}).get("correct", {}).get("error"))
    return [r["rewards"].get("correct") for r in cells], failed


# ------------------------------------------------------------------------------ processes

class Proc:
    """A child in its own process group, output to a temporary log."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{name}-", suffix=".log")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                               f"{self.output()}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the group, then SIGKILL whatever is left of it."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


def rewardd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rewardd.service.cli", *args]


@dataclass
class Config:
    name: str
    workers: list[int]
    """Concurrency of each worker; empty: embedded."""
    db: int | None = None
    url: str = ""
    procs: list[Proc] = field(default_factory=list)

    @property
    def broker(self) -> str | None:
        return None if self.db is None else f"redis://127.0.0.1:6379/{self.db}"


def start(config: Config, concurrency: int, extra_env: dict[str, str] | None = None) -> None:
    """Start ``config``'s API server (and workers), ``extra_env`` added to their environment."""
    env = {**child_env(), **(extra_env or {})}
    env["REWARDD_LOG_LEVEL"] = "info"
    port = free_port()
    if config.broker:
        for i, c in enumerate(config.workers):
            config.procs.append(Proc(f"{config.name}-w{i}", rewardd(
                "worker", "--queues", "cpu", "--concurrency", str(c),
                "--broker-url", config.broker), env))
        flags = ["--broker-url", config.broker]
    else:
        flags = ["--pool-size", str(concurrency)]
    config.procs.append(Proc(f"{config.name}-api", rewardd(
        "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        *flags), env))
    config.url = f"http://127.0.0.1:{port}"


def wait_ready(configs: list[Config]) -> None:
    deadline = time.monotonic() + READY_S
    pending = list(configs)
    while pending:
        for config in list(pending):
            for proc in config.procs:
                proc.check_alive()
            try:
                if httpx.get(f"{config.url}/readyz", timeout=10).status_code == 200:
                    pending.remove(config)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"{pending[0].name} not ready within {READY_S:g} s:\n" +
                               "\n".join(p.output() for p in pending[0].procs))
        time.sleep(0.25)


def flush(dbs: list[int]) -> None:
    for db in dbs:
        redis.Redis(db=db, socket_connect_timeout=3).flushdb()


def task_latency(url: str) -> tuple[float, float]:
    """(sum, count) of rewardd_task_duration_seconds on a distributed server."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("rewardd_task_duration_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("rewardd_task_duration_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


# ------------------------------------------------------------------------------ measurements

def batch_round(client: httpx.Client, config: Config, payload: bytes,
                rollouts: int) -> tuple[float, list[float], int]:
    started = time.perf_counter()
    response = client.post(f"{config.url}/v1/score", content=payload,
                           headers={"content-type": "application/json"})
    wall = time.perf_counter() - started
    rewards, failed = check(response, rollouts)
    return wall, rewards, failed


async def load_run(url: str, bodies: list[bytes], clients: int, rollouts: int,
                   latencies: list[float], errors: dict[str, int], messages: list[str]
                   ) -> float:
    """``clients`` concurrent clients send ``bodies`` (each once) to ``url``; appends the
    latencies, counts errors, returns the wall time."""
    next_index = iter(range(len(bodies)))

    async def client_loop(client: httpx.AsyncClient) -> None:
        for index in next_index:  # shared iterator: a fixed number of requests in all
            started = time.perf_counter()
            try:
                response = await client.post("/v1/score", content=bodies[index],
                                             headers={"content-type": "application/json"})
                latencies.append(time.perf_counter() - started)
                _, failed = check(response, rollouts)
                errors["cells"] += failed
            except Exception as exc:
                errors["http"] += 1
                messages.append(f"{type(exc).__name__}: {exc}"[:200])

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return time.perf_counter() - started


def load_summary(latencies: list[float], wall: float, errors: dict[str, int],
                 messages: list[str], rollouts: int) -> dict[str, Any]:
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, max(0, round(p * len(ordered)) - 1))]

    return {"requests": len(latencies), "wall_s": wall, "p50_s": pct(0.50), "p99_s": pct(0.99),
            "requests_per_s": len(latencies) / wall, "rollouts_per_s":
            len(latencies) * rollouts / wall, "errors": errors, "messages": messages[:5]}


def table(header: list[str], rows: list[list[Any]], align: list[str] | None = None) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(align or ["---"] * len(header)) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=32, help="groups of 16 in the batch")
    parser.add_argument("--repeat", type=int, default=5, help="measured rounds (median)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="total verifier processes of every configuration (even)")
    parser.add_argument("--db", type=int, default=13,
                        help="Redis database of the 1-worker run; the 2-worker run uses db+1")
    parser.add_argument("--clients", type=int, default=8, help="concurrent load clients")
    parser.add_argument("--requests", type=int, default=160, help="load requests in all")
    parser.add_argument("--load-groups", type=int, default=2, help="groups of 16 per load request")
    parser.add_argument("--load-passes", type=int, default=4,
                        help="the load requests in this many passes, configurations "
                             "interleaved")
    parser.add_argument("--quick", action="store_true", help="a reduced run (about a minute)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.warmup, args.requests, args.load_passes = 2, 1, 48, 2
    if args.concurrency < 2 or args.concurrency % 2:
        parser.error("--concurrency must be even (the 2-worker run splits it)")
    half = args.concurrency // 2
    configs = [Config("embedded", []),
               Config("distributed, 1 worker", [args.concurrency], args.db),
               Config("distributed, 2 workers", [half, half], args.db + 1)]
    dbs = [c.db for c in configs if c.db is not None]
    rollouts = args.groups * GROUP_SIZE
    load_rollouts = args.load_groups * GROUP_SIZE

    def interrupted(signum: int, _: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                               "cores": os.cpu_count()}
    flush(dbs)
    try:
        print(f"[starting {len(configs)} servers and their workers]", file=sys.stderr,
              flush=True)
        for config in configs:
            start(config, args.concurrency)
        wait_ready(configs)

        # ---- 1. batch, interleaved rounds
        walls: dict[str, dict[str, list[float]]] = {c.name: {"math": [], "exact_match": []}
                                                    for c in configs}
        latency: dict[str, list[float]] = {c.name: [0.0, 0.0] for c in configs}
        mismatches = failed_cells = 0
        with httpx.Client(timeout=600) as client:
            for rnd in range(args.warmup + args.repeat):
                measured = rnd >= args.warmup
                seed = rnd if measured else 100_000 + rnd
                for verifier in ("math", "exact_match"):
                    payload = json.dumps(score_body(seed, args.groups, verifier)).encode()
                    order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
                    seen: list[list[float]] = []
                    for config in order:
                        before = task_latency(config.url) if config.db is not None else None
                        wall, rewards, failed = batch_round(client, config, payload, rollouts)
                        if before is not None and measured and verifier == "math":
                            after = task_latency(config.url)
                            latency[config.name][0] += after[0] - before[0]
                            latency[config.name][1] += after[1] - before[1]
                        failed_cells += failed
                        seen.append(rewards)
                        if measured:
                            walls[config.name][verifier].append(wall)
                    mismatches += sum(1 for r in seen[1:] if r != seen[0])
                print(f"[round {rnd + 1}/{args.warmup + args.repeat}"
                      f"{'' if measured else ' (warm-up)'}]", file=sys.stderr, flush=True)

        # ---- 2. load: one configuration at a time, in interleaved passes
        bodies = [json.dumps(score_body(1_000_000 + i, args.load_groups)).encode()
                  for i in range(args.requests)]
        acc = {c.name: {"latencies": [], "wall": 0.0, "errors": {"http": 0, "cells": 0},
                        "messages": []} for c in configs}
        passes = max(1, min(args.load_passes, args.requests))
        for index in range(passes):
            chunk = bodies[index::passes]
            for config in configs[index % len(configs):] + configs[:index % len(configs)]:
                print(f"[load pass {index + 1}/{passes}: {config.name}]", file=sys.stderr,
                      flush=True)
                a = acc[config.name]
                a["wall"] += asyncio.run(load_run(config.url, chunk, args.clients,
                                                  load_rollouts, a["latencies"], a["errors"],
                                                  a["messages"]))
        loads = {name: load_summary(a["latencies"], a["wall"], a["errors"], a["messages"],
                                    load_rollouts) for name, a in acc.items()}
    finally:
        for config in configs:
            for proc in config.procs:
                proc.stop()
        flush(dbs)

    # ---- report
    base = {v: statistics.median(walls["embedded"][v]) for v in ("math", "exact_match")}
    print(f"## Distributed execution: {rollouts} rollouts in {args.groups} groups of "
          f"{GROUP_SIZE}, total verifier concurrency {args.concurrency}, "
          f"{os.cpu_count()} cores, medians of {args.repeat} interleaved rounds\n")
    rows = []
    for config in configs:
        row = [config.name, "pool x%d" % args.concurrency if not config.workers
               else " + ".join(f"worker x{c}" for c in config.workers)]
        for verifier in ("math", "exact_match"):
            wall = statistics.median(walls[config.name][verifier])
            over = (wall - base[verifier]) / rollouts * 1000
            ratios = [a / b for a, b in zip(walls[config.name][verifier],
                                            walls["embedded"][verifier])]
            spread = (f" ({min(ratios):.2f}-{max(ratios):.2f})"
                      if config.workers and len(ratios) > 1 else "")
            row += [f"{wall:.3f}", f"{statistics.median(ratios):.2f}x{spread}",
                    "" if not config.workers else f"{over:+.3f}"]
        total, count = latency[config.name]
        row.append("" if not count else f"{total / count * 1000:.1f}")
        rows.append(row)
    table(["configuration", "verifier processes", "math s", "x embedded",
           "overhead ms/rollout", "exact_match s", "x embedded", "overhead ms/rollout",
           "mean task latency ms (math)"], rows,
          ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"])
    print("x embedded: median of the per-round ratios (range); overhead: median wall minus "
          f"the embedded median, per rollout.\n")
    print(f"Rewards identical across configurations: {'yes' if not mismatches else 'NO'} "
          f"({mismatches} mismatching batches); failed cells: {failed_cells}.\n")

    print(f"### Load: {args.clients} concurrent clients, {args.requests} requests of "
          f"{load_rollouts} math rollouts per configuration, in {passes} interleaved passes\n")
    table(["configuration", "p50 ms", "p99 ms", "requests/s", "rollouts/s", "errors"],
          [[name, f"{r['p50_s'] * 1000:.0f}", f"{r['p99_s'] * 1000:.0f}",
            f"{r['requests_per_s']:.1f}", f"{r['rollouts_per_s']:.0f}",
            r["errors"]["http"] + r["errors"]["cells"]] for name, r in loads.items()],
          ["---", "---:", "---:", "---:", "---:", "---:"])
    for name, r in loads.items():
        for message in r["messages"]:
            print(f"- {name}: {message}")

    worst = max(statistics.median([a / b for a, b in zip(walls[c.name]["math"],
                                                         walls["embedded"]["math"])])
                for c in configs if c.workers)
    broker_ms = max((statistics.median(walls[c.name]["exact_match"]) - base["exact_match"])
                    / rollouts * 1000 for c in configs if c.workers)
    errors = sum(r["errors"]["http"] + r["errors"]["cells"] for r in loads.values())
    print("Targets: distributed at most 1.3x embedded on the math batch: "
          f"{worst:.2f}x ({'met' if worst <= 1.3 else 'MISSED'}); amortised broker cost under "
          f"1 ms per rollout (exact_match): {broker_ms:.3f} ms "
          f"({'met' if broker_ms < 1 else 'MISSED'}); no errors under load: {errors} "
          f"({'met' if errors == 0 else 'MISSED'}).")
    if args.json:
        results.update(walls=walls, task_latency=latency, loads=loads,
                       mismatches=mismatches, failed_cells=failed_cells)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
        print(f"\nRaw figures written to {args.json}.")


if __name__ == "__main__":
    main()
