"""Benchmark: streaming sessions against one batch call after the last rollout (issue #18).

    .venv/bin/python tests/benchmarks/bench_stream.py [--pool-size 8] [--seed 0] [--json out.json]
    .venv/bin/python tests/benchmarks/bench_stream.py --compare --seed 0,1 --pool-size 8,16

A simulated generator emits 512 rollouts in 32 groups of 16 over 10 s: each rollout's finish
time is drawn from a lognormal (sigma 1, the long tail of generation lengths), scaled so the
last one finishes at 10 s. Each check costs ~20 ms (``test_delay``, tests/plugins/stream.py,
loaded into a real ``rewardd serve --pool-size N``), rewards 0/1, grpo advantages (dense).

* streaming: ``POST /v1/sessions``, then the rollouts are posted as they finish (``POST
  /v1/sessions/{id}/rollouts``; up to 4 posts in flight, each with every rollout finished and
  not yet sent: a lone rollout when they trickle in, a few in the early burst) while ``GET
  /v1/sessions/{id}/events`` is read; after the last one, ``POST /v1/sessions/{id}/close``.
* batch: the same finish times, then one ``POST /v1/score`` with all 512 after the last.

Reported: the reward phase, from the last rollout's finish to the last group's advantages
(streaming: its ``group`` event; also the close's answer, which carries batch-level
estimators), against the batch call's duration; and the delay from each group's last rollout
to its ``group`` event (p50, p99), both from the moment the generator finished the rollout. Targets: the streaming reward phase under 10% of the
batch's; p99 group delay under 100 ms plus one verification (20 ms).

``--compare`` measures where the group delay goes: for each seed and pool size, one fresh
server per variant of the scheduling (:data:`VARIANTS`: the executor's queueing before the p99
work; its shallow pebble alone; with urgent calls and their groups), one after the other on
the same machine. A variant is set in the server by loading this module as a plugin with
``BENCH_STREAM_VARIANT`` set (:func:`_variant`); the plain run loads nothing of it and
measures the server as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.server import running_server  # noqa: E402

GROUPS, SIZE, SPAN_S, CHECK_S = 32, 16, 10.0, 0.02
SENDERS = 4
"""Posts in flight at once; each takes every rollout that finished since the last one."""
REWARDS = [{"name": "r", "verifier": "test_delay", "params": {"seconds": CHECK_S}}]
ADVANTAGE = {"estimator": "grpo", "output": "dense"}

VARIANT_ENV = "BENCH_STREAM_VARIANT"
VARIANTS = {
    "before": "pebble is handed 64 samples per worker whatever they cost; no urgent calls",
    "shallow": "pebble is handed IN_PEBBLE_S_PER_WORKER of checks per worker (the rest "
               "wait in the fair queue); no urgent calls",
    "after": "shallow; the checks that complete a group go first in their session's flow, "
             "with the group's earlier checks still waiting",
}
"""What ``--compare`` runs, in order: each adds one change to the one before."""


def _variant(name: str) -> None:
    """In the server (this module loaded as a plugin): take back what ``name`` leaves out.

    ``after`` needs each session check's group in its flow; the sessions' ``_verify`` is
    wrapped to supply it (the group of the record it checks) where the server does not
    pass it itself."""
    from rewardd.service.sessions import checking
    from rewardd.workers import embedded, fairness

    group_of: contextvars.ContextVar[str | None] = contextvars.ContextVar("bench_group",
                                                                         default=None)
    plain_flow, plain_verify = fairness.flow, checking.Checker._verify

    @contextlib.contextmanager
    def flow(tenant: str | None = None, flow_id: str | None = None, urgent: bool = False,
             group: str | None = None) -> Any:
        urgent = urgent and name == "after"
        group = (group or group_of.get()) if name == "after" else None
        with plain_flow(tenant, flow_id, urgent, group) as current:
            yield current

    async def verify(self: Any, job: Any, specs: Any, group: Any) -> Any:
        token = group_of.set(group.group_id)
        try:
            return await plain_verify(self, job, specs, group)
        finally:
            group_of.reset(token)

    fairness.flow = flow  # type: ignore[assignment]
    checking.Checker._verify = verify  # type: ignore[method-assign]
    if name == "before":
        plain_init = embedded.EmbeddedExecutor.__init__

        def init(self: Any, pool_size: int, plugins: Any = ()) -> None:
            plain_init(self, pool_size, plugins)
            self._fair = fairness.FairQueue(pool_size * embedded.IN_PEBBLE_PER_WORKER,
                                            by_cost=True)

        embedded.EmbeddedExecutor.__init__ = init  # type: ignore[method-assign]
        embedded.EmbeddedExecutor._units = (  # type: ignore[method-assign]
            lambda self, call: len(call.samples))


if os.environ.get(VARIANT_ENV) in VARIANTS and "rewardd.service.app" in sys.modules:
    _variant(os.environ[VARIANT_ENV])  # the API server (not its workers) loading the plugin


def generate(seed: int) -> list[tuple[float, str, dict[str, Any]]]:
    """(finish time in s, group id, rollout) for every rollout, by finish time."""
    rng = np.random.default_rng(seed)
    times = rng.lognormal(mean=0.0, sigma=1.0, size=GROUPS * SIZE)
    times = times / times.max() * SPAN_S
    out = []
    for k, t in enumerate(times):
        g, i = divmod(k, SIZE)
        out.append((float(t), f"q{g}", {"rollout_id": f"q{g}#{i}",
                                        "completion": str(int(rng.integers(0, 2))),
                                        "num_tokens": int(rng.integers(64, 512))}))
    return sorted(out, key=lambda x: x[0])


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def read_stream(http: httpx.AsyncClient, sid: str, seen: dict[str, float],
                      closed: asyncio.Event) -> None:
    async with http.stream("GET", f"/v1/sessions/{sid}/events") as response:
        kind = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "group":
                seen[json.loads(line[6:])["group_id"]] = time.perf_counter()
            elif line.startswith("data: ") and kind == "closed":
                closed.set()
                return


async def streaming(url: str, plan: list[tuple[float, str, dict[str, Any]]]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 limits=httpx.Limits(max_connections=64)) as http:
        sid = (await http.post("/v1/sessions", json={
            "rewards": REWARDS, "advantage": ADVANTAGE, "group_size": SIZE})).json()["session_id"]
        events: dict[str, float] = {}
        closed = asyncio.Event()
        reader = asyncio.create_task(read_stream(http, sid, events, closed))
        await asyncio.sleep(0.2)
        last_sent: dict[str, float] = {}
        posts: list[float] = []
        finished: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
        start = time.perf_counter()

        async def generator() -> None:
            for at, gid, rollout in plan:
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
                last_sent[gid] = time.perf_counter()  # plan is by finish time
                finished.put_nowait((gid, rollout))
            for _ in range(SENDERS):
                finished.put_nowait(None)

        async def sender() -> None:
            while True:
                first = await finished.get()
                if first is None:
                    return
                ready = [first]  # everything finished meanwhile goes in the same post
                while not finished.empty() and finished._queue[0] is not None:  # type: ignore[attr-defined]
                    ready.append(finished.get_nowait())
                groups: dict[str, dict[str, Any]] = {}
                for gid, rollout in ready:
                    # prompt and reference with every post: concurrent posts of one group
                    # may reach the server in any order, and the first creates the group
                    groups.setdefault(gid, {"group_id": gid, "prompt": f"prompt {gid}",
                                            "reference": {}, "rollouts": []}
                                      )["rollouts"].append(rollout)
                sent = time.perf_counter()
                response = await http.post(f"/v1/sessions/{sid}/rollouts",
                                           json={"groups": list(groups.values())})
                assert response.status_code == 200, response.text
                posts.append(time.perf_counter() - sent)

        await asyncio.gather(generator(), *(sender() for _ in range(SENDERS)))
        last = max(last_sent.values())
        reply = await http.post(f"/v1/sessions/{sid}/close")
        closed_at = time.perf_counter()
        assert reply.json()["state"] == "closed", reply.text
        await asyncio.wait_for(closed.wait(), 30)
        reader.cancel()
    delays = [events[g] - last_sent[g] for g in last_sent]
    by_group = {g: {"last_finished_s": last_sent[g] - start, "delay_ms": 1000 * d}
                for g, d in zip(last_sent, delays)}
    return {"reward_phase_s": max(events.values()) - last, "close_s": closed_at - last,
            "group_delay_p50_ms": 1000 * percentile(delays, 50),
            "group_delay_p99_ms": 1000 * percentile(delays, 99),
            "group_delay_max_ms": 1000 * max(delays),
            "post_p50_ms": 1000 * percentile(posts, 50), "post_p99_ms": 1000 * percentile(posts, 99),
            "groups": by_group}


async def batch(url: str, plan: list[tuple[float, str, dict[str, Any]]]) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for _, gid, rollout in plan:
        groups.setdefault(gid, {"group_id": gid, "prompt": f"prompt {gid}", "reference": {},
                                "rollouts": []})["rollouts"].append(rollout)
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        await asyncio.sleep(SPAN_S)  # the generator finishing its last rollout
        start = time.perf_counter()
        response = await http.post("/v1/score", json={
            "groups": list(groups.values()), "rewards": REWARDS, "advantage": ADVANTAGE})
        assert response.status_code == 200, response.text
        return {"reward_phase_s": time.perf_counter() - start}


def measure(seed: int, pool_size: int, variant: str | None = None,
            url: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(streaming, batch) of one fresh server (or ``url``), with ``variant`` set in it."""
    plan = generate(seed)
    plugins = "tests.plugins.stream" + (",tests.benchmarks.bench_stream" if variant else "")
    env = {VARIANT_ENV: variant} if variant else None
    with (contextlib.nullcontext(url) if url else running_server(
            "--pool-size", str(pool_size), "--plugins", plugins, env=env)) as base:
        asyncio.run(batch(base, plan[:SIZE]))  # warm-up of the pool (not measured)
        stream = asyncio.run(streaming(base, plan))
        whole = asyncio.run(batch(base, plan))
    return stream, whole


def compare(seeds: list[int], pools: list[int], json_path: Path | None) -> None:
    """Every variant for every seed and pool size, one table."""
    print(f"512 rollouts, {GROUPS} groups of {SIZE}, {CHECK_S * 1000:.0f} ms per check; "
          "variants:\n")
    for name, text in VARIANTS.items():
        print(f"* {name}: {text}")
    print("\n| seed | pool | variant | p50 (ms) | p99 (ms) | max (ms) | reward phase, "
          "streaming (ms) | batch (ms) |\n|---|---|---|---|---|---|---|---|")
    out = []
    for seed in seeds:
        for pool in pools:
            for name in VARIANTS:
                stream, whole = measure(seed, pool, name)
                print(f"| {seed} | {pool} | {name} | {stream['group_delay_p50_ms']:.0f} | "
                      f"{stream['group_delay_p99_ms']:.0f} | "
                      f"{stream['group_delay_max_ms']:.0f} | "
                      f"{stream['reward_phase_s'] * 1000:.0f} | "
                      f"{whole['reward_phase_s'] * 1000:.0f} |", flush=True)
                out.append({"seed": seed, "pool_size": pool, "variant": name,
                            "streaming": stream, "batch": whole})
    if json_path:
        json_path.write_text(json.dumps(out, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", default="8", help="with --compare: a comma list")
    parser.add_argument("--seed", default="0", help="with --compare: a comma list")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--url", help="a running server (with --plugins tests.plugins.stream) "
                        "instead of starting one")
    parser.add_argument("--compare", action="store_true",
                        help="every variant of the scheduling (VARIANTS) for each of the "
                        "comma-separated --seed and --pool-size values")
    args = parser.parse_args()
    if args.compare:
        compare([int(x) for x in args.seed.split(",")],
                [int(x) for x in args.pool_size.split(",")], args.json)
        return
    args.seed, args.pool_size = int(args.seed), int(args.pool_size)
    stream, whole = measure(args.seed, args.pool_size, url=args.url)
    ratio = stream["reward_phase_s"] / whole["reward_phase_s"]
    target_ms = 100 + 1000 * CHECK_S
    rows = [
        ("reward phase after the last rollout, streaming (last group event)",
         f"{stream['reward_phase_s'] * 1000:.0f} ms"),
        ("reward phase after the last rollout, streaming (close answered)",
         f"{stream['close_s'] * 1000:.0f} ms"),
        ("reward phase after the last rollout, one /v1/score batch",
         f"{whole['reward_phase_s'] * 1000:.0f} ms"),
        ("streaming / batch (target < 10%)", f"{100 * ratio:.1f}%"),
        ("group delay p50 (last rollout -> group event)",
         f"{stream['group_delay_p50_ms']:.0f} ms"),
        (f"group delay p99 (target < {target_ms:.0f} ms)",
         f"{stream['group_delay_p99_ms']:.0f} ms"),
        ("group delay max", f"{stream['group_delay_max_ms']:.0f} ms"),
        ("POST .../rollouts answered, p50 / p99",
         f"{stream['post_p50_ms']:.0f} / {stream['post_p99_ms']:.0f} ms"),
    ]
    print(f"512 rollouts, {GROUPS} groups of {SIZE}, lognormal finish times over {SPAN_S:g} s, "
          f"{CHECK_S * 1000:.0f} ms per check, embedded pool of {args.pool_size}\n")
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    ok = ratio < 0.10 and stream["group_delay_p99_ms"] < target_ms
    print(f"\ntargets {'met' if ok else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps({"streaming": stream, "batch": whole,
                                         "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
