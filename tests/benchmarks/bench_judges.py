"""Benchmark: judge requests per second through rewardd's backend client, and its reply cache.

    .venv/bin/python tests/benchmarks/bench_judges.py [--requests 2000] [--latency-ms 20]

A local OpenAI-compatible server (``tests/support/judge_server.py``) runs in a process of its
own and answers every request after ``--latency-ms`` (a judge model's time, simulated by a
sleep, so the figures measure the client and not this machine's CPU). Side by side, in one
run:

1. Throughput for ``--requests`` rubric-style requests (distinct prompts):
   - a plain loop of ``httpx.Client.post`` calls, one request at a time (what a verifier
     calling an endpoint naively does);
   - :class:`~rewardd.verifiers.judge.openai_compat.OpenAIChatBackend` with ``max_concurrency`` 1, 8
     and 32, the requests handed over in batches of 64 (a group's criteria).
2. The cache: the same workload where each prompt recurs (``--repeats`` times, shuffled), the
   backend's reply cache on against off: hit rate, requests sent to the server, requests/s.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.judge_server import JudgeServer  # noqa: E402
from rewardd.verifiers.judge.backend import ChatReply, ChatRequest  # noqa: E402
from rewardd.verifiers.judge.openai_compat import (OpenAIChatBackend, OpenAIConfig,  # noqa: E402
                                           ReplyCache)

BATCH = 64


def serve(latency_s: float, ready: Any, stop: Any) -> None:
    server = JudgeServer(latency_s=latency_s).start()
    ready.put(server.base_url)
    stop.wait()
    server.stop()


def requests_for(n: int, repeats: int, seed: int) -> list[ChatRequest]:
    prompts = [f"Grade response {i} against the criterion 'clear'." for i in range(n // repeats)]
    order = [p for p in prompts for _ in range(repeats)]
    random.Random(seed).shuffle(order)
    return [ChatRequest((("user", p),), max_tokens=64) for p in order]


def plain_loop(url: str, requests: list[ChatRequest]) -> float:
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=30) as client:
        for request in requests:
            client.post("/chat/completions", json=request.payload("rule-judge")).raise_for_status()
    return time.perf_counter() - started


def through_backend(url: str, requests: list[ChatRequest], concurrency: int,
                    cache: bool) -> tuple[float, OpenAIChatBackend]:
    store = ReplyCache()
    backend = OpenAIChatBackend(OpenAIConfig(name="bench", base_url=url, model="rule-judge",
                                             max_concurrency=concurrency, cache=cache),
                                cache=store)
    started = time.perf_counter()
    for start in range(0, len(requests), BATCH):
        replies = backend.chat(requests[start:start + BATCH])
        assert all(isinstance(r, ChatReply) for r in replies), replies
    return time.perf_counter() - started, backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=4, help="times each prompt recurs (cache)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (median)")
    args = parser.parse_args()

    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=serve, args=(args.latency_ms / 1000, ready, stop), daemon=True)
    proc.start()
    url = ready.get(timeout=60)
    try:
        distinct = requests_for(args.requests, 1, seed=0)
        plain_n = max(args.requests // 10, 50)  # one at a time is slow: a tenth, scaled up
        rows: list[tuple[str, float]] = []
        plain = statistics.median(plain_loop(url, distinct[:plain_n]) for _ in range(args.rounds))
        rows.append(("httpx, one request at a time", plain_n / plain))
        for concurrency in (1, 8, 32):
            took = statistics.median(through_backend(url, distinct, concurrency, False)[0]
                                     for _ in range(args.rounds))
            rows.append((f"rewardd client, max_concurrency {concurrency}",
                         args.requests / took))
        base = rows[0][1]
        print(f"$ python tests/benchmarks/bench_judges.py --requests {args.requests} "
              f"--latency-ms {args.latency_ms:g}\n")
        print(f"## Judge client: {args.requests} distinct requests, server latency "
              f"{args.latency_ms:g} ms, batches of {BATCH}, median of {args.rounds} rounds\n")
        print("| client | requests/s | x one at a time |")
        print("|---|---:|---:|")
        for name, rps in rows:
            print(f"| {name} | {rps:.0f} | {rps / base:.2f}x |")

        repeated = requests_for(args.requests, args.repeats, seed=1)
        print(f"\n## Reply cache: {args.requests} requests, each prompt {args.repeats} times "
              "(shuffled), max_concurrency 8\n")
        print("| cache | requests/s | sent to the server | answered without asking |")
        print("|---|---:|---:|---:|")
        for cache in (False, True):
            took, client = through_backend(url, repeated, 8, cache)
            print(f"| {'on' if cache else 'off'} | {args.requests / took:.0f} | {client.posts} "
                  f"| {1 - client.posts / args.requests:.1%} |")
    finally:
        stop.set()
        proc.join(timeout=10)


if __name__ == "__main__":
    main()
