"""Benchmark: what the client adds to a batch of 512 rollouts against the same call in-process.

A trainer's batch: 32 groups x 16 rollouts of ~1,000 tokens (900 to 1,100, seeded), rewards
precomputed, ``POST /v1/advantages`` with grpo, ``output`` rle and dense. Measured:

- in-process: the server's own work on the body (``AdvantagesRequest.model_validate`` and
  ``rewardd.service.pipeline.advantages``, GC paused as served): what a trainer pays calling
  the library without a server;
- through ``rewardd_client.RewarddClient`` (JSON and msgpack) to a real ``rewardd serve``:
  client encode + round trip (HTTP, the server's decode, validation, compute and encode) +
  client decode; and the same followed by ``advantages_tensor`` (numpy, (B, T) with mask);
- the client's encode and decode alone, so the added time can be attributed.

Variants run interleaved in each repeat (shared machines drift); medians are reported, with
the time added to the in-process call and the ratio.

Run: `make bench` (or `.venv/bin/python tests/benchmarks/bench_client.py [--repeats N]`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd_client import RewarddClient  # noqa: E402
from rewardd_client.client import _decode, _encode  # noqa: E402
from rewardd_client.tensors import advantages_tensor  # noqa: E402
from tests.benchmarks.bench_advantages import in_process  # noqa: E402  (validate + pipeline)
from tests.support.server import running_server  # noqa: E402

COMMAND = ".venv/bin/python tests/benchmarks/bench_client.py"


def make_request(groups: int, rollouts: int, tokens: int, output: str) -> dict[str, Any]:
    rng = random.Random(0)
    spread = tokens // 10
    return {"advantage": {"estimator": "grpo", "output": output},
            "groups": [{"group_id": f"g{g}", "rollouts": [
                {"rollout_id": f"g{g}-{i}", "num_tokens": rng.randint(tokens - spread,
                                                                      tokens + spread),
                 "reward": float(rng.random() < 0.4)} for i in range(rollouts)]}
                for g in range(groups)]}


def variants(url: str, data: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Label -> one timed call, for one output format."""
    clients = {wire: RewarddClient(url, wire=wire, max_retries=0) for wire in ("json", "msgpack")}
    out: dict[str, Callable[[], Any]] = {"in-process": lambda: in_process(data)}
    for wire, client in clients.items():
        response = client._http.post("/v1/advantages", content=_encode(data, wire))
        out[f"client {wire}"] = lambda c=client: c.advantages(data)
        out[f"client {wire} + tensor"] = \
            lambda c=client: advantages_tensor(c.advantages(data))
        out[f"  encode {wire}"] = lambda w=wire: _encode(data, w)
        out[f"  decode {wire}"] = lambda r=response: _decode(r)
        out[f"  bytes {wire}"] = lambda n=len(response.content): n
    return out


def run(url: str, data: dict[str, Any], repeats: int) -> dict[str, tuple[float, Any]]:
    calls = variants(url, data)
    times: dict[str, list[float]] = {label: [] for label in calls}
    values: dict[str, Any] = {}
    for label, call in calls.items():  # warm-up
        values[label] = call()
    for _ in range(repeats):
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - start)
    return {label: (statistics.median(t), values[label]) for label, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    shape = (args.groups, args.rollouts, args.tokens)
    print(f"$ {COMMAND} --groups {args.groups} --rollouts {args.rollouts} "
          f"--tokens {args.tokens} --repeats {args.repeats}")
    with running_server("--pool-size", "1") as url:
        results = {output: run(url, make_request(*shape, output), args.repeats)
                   for output in ("rle", "dense")}
    print(f"\n/v1/advantages, {args.groups} groups x {args.rollouts} rollouts x ~{args.tokens} "
          f"tokens (grpo), median of {args.repeats} interleaved repeats\n")
    print("| output | path | median ms | added ms | vs in-process | response bytes |")
    print("|---|---|---:|---:|---:|---:|")
    for output, rows in results.items():
        base = rows["in-process"][0]
        for label, (seconds, value) in rows.items():
            if label.startswith("  bytes"):
                continue
            wire = label.split()[1] if label.startswith("client") else None
            size = f"{rows[f'  bytes {wire}'][1]:,}" if wire else ""
            added = f"{1000 * (seconds - base):+.1f}" if label.startswith("client") else ""
            ratio = f"{seconds / base:.2f}x" if label.startswith("client") else ""
            print(f"| {output} | {label.strip()} | {1000 * seconds:.1f} | {added} | {ratio} "
                  f"| {size} |")


if __name__ == "__main__":
    main()
