"""Benchmark: the verdict cache on a replayed workload (issue 29).

    .venv/bin/python tests/benchmarks/bench_cache.py [--epochs 3] [--repeat-share 0.5]

Three epochs over the same prompts, as RL revisits its dataset: in every epoch after the
first, each rollout repeats, exactly, a completion the policy gave the same prompt in an
earlier epoch with probability ``--repeat-share`` (a converged policy writes the same short
answers and the same programs; no policy's outputs are at hand here to measure the share, so
it is a parameter, stated in the table), else it is new. Two workloads: math (64 groups x 8
rollouts a step, ~300-character completions) and code (16 groups x 8, Python programs on
four stdin tests each, run in the sandbox).

Two real ``rewardd serve --pool-size 2`` side by side, one with the cache
(``REWARDD_VERDICT_CACHE=true``, the default), one without; each step posts the same batch to
both, alternating which goes first. Reported per workload and side: the median time per step
of the epochs after the first (where repeats exist), the verifier time the server spent
(``rewardd_verifier_duration_seconds_sum`` over all epochs: CPU inside verifiers), and the
share of checks the cache answered (``diagnostics.cache``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.server import running_server  # noqa: E402

FILLER = ("Let us work through the problem step by step, checking each intermediate "
          "quantity before combining them into the final result. ")
PROGRAMS = [
    "a, b = map(int, input().split())\nprint(a + b)",
    "a, b = map(int, input().split())\nprint(b + a)",
    "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)",
    "a, b = map(int, input().split())\nprint(a - b)",
    "a, b = map(int, input().split())\nprint(a * b)",
    "print(sum(map(int, input().split())))",
]


class Policy:
    """A scripted policy: per prompt, the completions it gave before, repeated with
    probability ``repeat_share`` in later epochs."""

    def __init__(self, repeat_share: float, seed: int = 7) -> None:
        self.repeat_share = repeat_share
        self.rng = random.Random(seed)
        self.seen: dict[str, list[str]] = {}
        self.counter = 0

    def completion(self, prompt: str, fresh: Any) -> str:
        earlier = self.seen.setdefault(prompt, [])
        if earlier and self.rng.random() < self.repeat_share:
            return self.rng.choice(earlier)
        self.counter += 1
        text = fresh(self.counter)
        earlier.append(text)
        return text


def math_step(policy: Policy, step: int, groups: int = 64, per_group: int = 8) -> dict:
    out = []
    for g in range(groups):
        answer = 17 * g + 3
        prompt = f"math-{g}"

        def fresh(n: int, answer: int = answer) -> str:
            given = answer if n % 3 else answer + 1
            return f"{FILLER * 2}(attempt {n}) So the answer is \\boxed{{{given}}}."
        out.append({"group_id": f"s{step}-g{g}", "prompt": prompt,
                    "reference": {"answer": str(answer)},
                    "rollouts": [{"rollout_id": f"g{g}-r{r}", "num_tokens": 64,
                                  "completion": policy.completion(prompt, fresh)}
                                 for r in range(per_group)]})
    return {"groups": out, "rewards": [{"name": "math", "verifier": "math"}],
            "advantage": {"estimator": "grpo"}}


def code_step(policy: Policy, step: int, groups: int = 16, per_group: int = 8) -> dict:
    tests = {"inputs": ["1 2\n", "5 7\n", "-3 3\n", "100 200\n"],
             "outputs": ["3\n", "12\n", "0\n", "300\n"]}
    out = []
    for g in range(groups):
        prompt = f"code-{g}"

        def fresh(n: int) -> str:
            return f"```python\n# attempt {n}\n{PROGRAMS[n % len(PROGRAMS)]}\n```"
        out.append({"group_id": f"s{step}-g{g}", "prompt": prompt,
                    "reference": {"tests": tests},
                    "rollouts": [{"rollout_id": f"g{g}-r{r}", "num_tokens": 32,
                                  "completion": policy.completion(prompt, fresh)}
                                 for r in range(per_group)]})
    return {"groups": out, "rewards": [{"name": "code", "verifier": "code"}],
            "advantage": {"estimator": "grpo"}}


def verifier_seconds(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("rewardd_verifier_duration_seconds_sum"))


def run(workload: str, epochs: int, steps: int, repeat_share: float, urls: dict[str, str]
        ) -> list[list[Any]]:
    make = math_step if workload == "math" else code_step
    policy = Policy(repeat_share)
    times: dict[str, list[float]] = {side: [] for side in urls}
    answered = {side: [0, 0] for side in urls}
    before = {side: verifier_seconds(url) for side, url in urls.items()}
    for epoch in range(epochs):
        for step in range(steps):
            body = make(policy, epoch * steps + step)
            order = list(urls) if step % 2 else list(urls)[::-1]
            for side in order:
                started = time.perf_counter()
                response = httpx.post(f"{urls[side]}/v1/score", json=body, timeout=900)
                elapsed = time.perf_counter() - started
                assert response.status_code == 200, response.text[:500]
                cache = response.json()["diagnostics"]["cache"]
                answered[side][0] += cache["hits"]
                answered[side][1] += sum(len(g["rollouts"]) for g in body["groups"])
                if epoch:
                    times[side].append(elapsed)
    rows = []
    for side, url in urls.items():
        spent = verifier_seconds(url) - before[side]
        hits, checks = answered[side]
        rows.append([workload, side, f"{statistics.median(times[side]) * 1000:.0f} ms",
                     f"{spent:.2f} s", f"{hits / checks:.0%}"])
    on, off = (statistics.median(times[s]) for s in ("cache on", "cache off"))
    rows.append([workload, "ratio on/off", f"{on / off:.2f}x", "", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="Steps per epoch.")
    parser.add_argument("--repeat-share", type=float, default=0.5)
    args = parser.parse_args()
    rows: list[list[Any]] = []
    with running_server("--pool-size", "2", env={"REWARDD_VERDICT_CACHE": "true",
                                                  "REWARDD_RECORD_RUNS": "false"}) as on, \
            running_server("--pool-size", "2", env={"REWARDD_VERDICT_CACHE": "false",
                                                     "REWARDD_RECORD_RUNS": "false"}) as off:
        urls = {"cache on": on, "cache off": off}
        for workload in ("math", "code"):
            rows += run(workload, args.epochs, args.steps, args.repeat_share, urls)
    print(f"verdict cache: {args.epochs} epochs x {args.steps} steps over the same prompts, "
          f"{args.repeat_share:.0%} of later epochs' rollouts repeating an earlier completion")
    print("| workload | side | time per step (epochs 2+) | verifier time | answered by the cache |")
    print("|---|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
