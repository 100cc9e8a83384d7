"""Benchmark: what canaries cost a training step (issue 30; target under 3%).

    .venv/bin/python tests/benchmarks/bench_canaries.py [--steps 25] [--rate 0.02]

One real ``rewardd serve --pool-size 2``; each step posts the same batch twice, once with
``"canaries": false`` and once with canaries at ``--rate`` (the server's default, 0.02),
alternating which goes first, with ``"cache": false`` so every check runs each time. Two
workloads: math (64 groups x 8 rollouts = 512, ~300-character completions) and code (16
groups x 8 Python programs on four stdin tests each, in the sandbox; each reference carries
its ``solution``, so the canary runs a program too). Reported per workload: the median time
per step without and with canaries, their ratio, and the extra checks canaries added (probes
over rollouts, exact).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_cache import FILLER, PROGRAMS  # noqa: E402
from tests.support.server import running_server  # noqa: E402

TESTS = {"inputs": ["1 2\n", "5 7\n", "-3 3\n", "100 200\n"],
         "outputs": ["3\n", "12\n", "0\n", "300\n"]}


def math_step(groups: int = 64, per_group: int = 8) -> dict[str, Any]:
    return {"groups": [{
        "group_id": f"g{g}", "prompt": f"math-{g}", "reference": {"answer": str(17 * g + 3)},
        "rollouts": [{"rollout_id": f"g{g}-r{r}", "num_tokens": 64,
                      "completion": f"{FILLER * 2}So the answer is "
                                    f"\\boxed{{{17 * g + 3 + (r % 3 == 0)}}}."}
                     for r in range(per_group)]} for g in range(groups)],
        "rewards": [{"name": "math", "verifier": "math"}], "advantage": {"estimator": "grpo"}}


def code_step(groups: int = 16, per_group: int = 8) -> dict[str, Any]:
    return {"groups": [{
        "group_id": f"g{g}", "prompt": f"code-{g}",
        "reference": {"tests": TESTS, "solution": PROGRAMS[0]},
        "rollouts": [{"rollout_id": f"g{g}-r{r}", "num_tokens": 32,
                      "completion": f"```python\n{PROGRAMS[(g + r) % len(PROGRAMS)]}\n```"}
                     for r in range(per_group)]} for g in range(groups)],
        "rewards": [{"name": "code", "verifier": "code"}], "advantage": {"estimator": "grpo"}}


def run(workload: str, steps: int, rate: float, url: str) -> list[Any]:
    body = math_step() if workload == "math" else code_step()
    rollouts = sum(len(g["rollouts"]) for g in body["groups"])
    sides = {"off": {**body, "cache": False, "canaries": False},
             "on": {**body, "cache": False, "canaries": {"rate": rate}}}
    times: dict[str, list[float]] = {side: [] for side in sides}
    probes = 0
    for step in range(steps + 1):  # the first round warms the pool up, uncounted
        for side in (list(sides) if step % 2 else list(sides)[::-1]):
            started = time.perf_counter()
            response = httpx.post(f"{url}/v1/score", json=sides[side], timeout=900)
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.text[:500]
            report = response.json()["summary"].get("canaries")
            if side == "on":
                assert report and not any(e["problems"] for e in report.values()), report
                probes = sum(e["passed"] + e["failed"] for e in report.values())
            if step:
                times[side].append(elapsed)
    off, on = (statistics.median(times[s]) for s in ("off", "on"))
    return [workload, rollouts, f"{off * 1000:.0f} ms", f"{on * 1000:.0f} ms",
            f"{(on - off) / off:+.1%}", f"{probes} ({probes / rollouts:.1%})"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--rate", type=float, default=0.02)
    args = parser.parse_args()
    with running_server("--pool-size", "2", env={"REWARDD_RECORD_RUNS": "false"}) as url:
        rows = [run(workload, args.steps, args.rate, url) for workload in ("math", "code")]
    print(f"canaries at rate {args.rate}: median of {args.steps} steps each side")
    print("| workload | rollouts | time per step: canaries off | on | cost | extra checks |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
