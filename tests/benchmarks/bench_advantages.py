"""Benchmark: /v1/advantages for 1,024 groups x 16 rollouts x 1,024 tokens.

Measures, side by side in one run (ratios, since shared machines are noisy):
- the estimator alone on tensors, and the whole in-process call (validation, reward table,
  estimator, encoding) that a library user pays;
- HTTP round trips through a real `rewardd serve` process with JSON-dense, JSON-RLE,
  msgpack-RLE and msgpack-dense, including client-side encoding and decoding;
- response bytes of each, and the ratio of each round trip to the in-process call.

Run: `make bench` (or `.venv/bin/python tests/benchmarks/bench_advantages.py`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd import advantages as adv  # noqa: E402
from rewardd.service import pipeline  # noqa: E402
from rewardd_client.client import RewarddClient, _decode, _encode  # noqa: E402
from rewardd.service.gcpause import gc_paused  # noqa: E402
from rewardd.service.models import AdvantagesRequest  # noqa: E402
from tests.support.server import running_server  # noqa: E402


def make_request(groups: int, rollouts: int, tokens: int, output: str) -> dict[str, Any]:
    rng = random.Random(0)
    return {"advantage": {"estimator": "grpo", "output": output},
            "groups": [{"group_id": f"g{g}", "rollouts": [
                {"rollout_id": f"g{g}-{i}", "num_tokens": tokens,
                 "reward": float(rng.random() < 0.4)} for i in range(rollouts)]}
                for g in range(groups)]}


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def estimator_only(data: dict[str, Any]) -> Callable[[], Any]:
    req = AdvantagesRequest.model_validate(data)
    rewards = torch.tensor([r.reward for g in req.groups for r in g.rollouts], dtype=torch.float64)
    group = torch.repeat_interleave(torch.arange(len(req.groups)),
                                    torch.tensor([len(g.rollouts) for g in req.groups]))
    batch = adv.AdvantageBatch(rewards=rewards, group=group,
                             valid=torch.ones_like(rewards, dtype=torch.bool),
                             num_tokens=torch.full_like(group, 1024), num_groups=len(req.groups))
    return lambda: adv.compute(batch, "grpo", {}, "rewardd")


class SizedClient(RewarddClient):
    """The user's client, also recording the size of the last response body."""

    last_bytes = 0

    def _post(self, path: str, body: Any) -> Any:
        response = self._http.post(path, content=_encode(body, self.wire))
        self.last_bytes = len(response.content)
        return _decode(response)


def in_process(data: dict[str, Any]) -> dict[str, Any]:
    """The server's work without HTTP: validate the body and compute (GC paused, as served)."""
    with gc_paused():
        request = AdvantagesRequest.model_validate(data)
    return pipeline.advantages(request)


def http_call(url: str, data: dict[str, Any], wire: str) -> Callable[[], int]:
    """One round trip as a trainer pays it: encode, send, serve, receive, decode."""
    client = SizedClient(url, wire=wire)

    def call() -> int:
        decoded = client.advantages(data)
        assert len(decoded["groups"]) == len(data["groups"])
        return client.last_bytes

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shape = (args.groups, args.rollouts, args.tokens)
    rle, dense = make_request(*shape, "rle"), make_request(*shape, "dense")

    t_est, _ = timed(estimator_only(rle), args.repeats)
    t_rle, _ = timed(lambda: in_process(rle), args.repeats)
    t_dense, _ = timed(lambda: in_process(dense), max(1, args.repeats // 2))
    rows = [("in-process: estimator only (tensors)", t_est, None, None),
            ("in-process: full call, rle", t_rle, None, None),
            ("in-process: full call, dense", t_dense, None, None)]
    with running_server("--pool-size", "1") as url:
        for label, data, wire, repeats in (
                ("HTTP JSON, rle", rle, "json", args.repeats),
                ("HTTP msgpack, rle", rle, "msgpack", args.repeats),
                ("HTTP JSON, dense", dense, "json", max(1, args.repeats // 2)),
                ("HTTP msgpack, dense", dense, "msgpack", max(1, args.repeats // 2))):
            seconds, size = timed(http_call(url, data, wire), repeats)
            base = t_rle if "rle" in label else t_dense
            rows.append((label, seconds, size, seconds / base))
    dense_json = next(r[2] for r in rows if r[0] == "HTTP JSON, dense")
    print(f"\n/v1/advantages, {args.groups} groups x {args.rollouts} rollouts x {args.tokens} "
          f"tokens (grpo), median of {args.repeats} (dense: {max(1, args.repeats // 2)})\n")
    print("| measurement | seconds | response bytes | bytes vs JSON-dense | vs in-process |")
    print("|---|---:|---:|---:|---:|")
    for label, seconds, size, ratio in rows:
        size_text = f"{size:,}" if size else ""
        share = f"{100 * size / dense_json:.2f}%" if size else ""
        print(f"| {label} | {seconds:.3f} | {size_text} | {share} | "
              f"{f'{ratio:.2f}x' if ratio else ''} |")


if __name__ == "__main__":
    main()
