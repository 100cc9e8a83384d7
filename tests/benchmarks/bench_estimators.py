"""Benchmark: every estimator on 4,096 rollouts x 4,096 tokens (groups of 16), CPU.

Each estimator is timed end to end as a trainer consumes it: the estimator plus the per-token
broadcast with the mask applied (one float64 per token). Side by side, in one run:
- the memory floor: allocating and filling one float64 tensor of the same size;
- a straightforward reference: a per-group Python loop over Python floats that computes the
  same advantages and writes each rollout's tokens (written here, for outcome estimators).
Token-level tree and step estimators (tempo, gigpo) are also timed at 1x, 2x and 4x the tokens
to show they are linear in total tokens.

Run: `make bench` (or `.venv/bin/python tests/benchmarks/bench_estimators.py`).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.advantages import AdvantageBatch, Advantages, compute  # noqa: E402
from rewardd.service.models import Rollout, Segment, Step, Turn  # noqa: E402

GROUP = 16


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_batch(rollouts: int, tokens: int, seed: int = 0) -> AdvantageBatch:
    """Binary rewards, values, shared-prefix token ids, steps, turns and segments."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    groups = rollouts // GROUP
    rewards = torch.tensor([float(rng.random() < 0.4) for _ in range(rollouts)],
                           dtype=torch.float64)
    n = rollouts * tokens
    ids = torch.randint(0, 32000, (rollouts, tokens), generator=gen)
    prefix = tokens // 8  # rollouts of a group share their first eighth, then branch
    ids[:, :prefix] = ids[::GROUP, :prefix].repeat_interleave(GROUP, 0)
    steps_per = 8
    span = tokens // steps_per
    objects = []
    for i in range(rollouts):
        objects.append(Rollout.model_construct(
            rollout_id=f"r{i}", greedy=(i % GROUP == 0), label=f"l{rng.randrange(2)}",
            segments=[Segment.model_construct(label="think", start=0, end=tokens - 64),
                      Segment.model_construct(label="answer", start=tokens - 64, end=tokens)],
            turns=[Turn.model_construct(start=j * span, end=(j + 1) * span,
                                        reward=float(rng.random() < 0.5), signal=None)
                   for j in range(steps_per)],
            steps=[Step.model_construct(start=j * span, end=(j + 1) * span,
                                        key=f"s{j}-{rng.randrange(4)}", embedding=None,
                                        reward=None)
                   for j in range(steps_per)]))
    return AdvantageBatch(
        rewards=rewards, group=torch.arange(groups).repeat_interleave(GROUP),
        valid=torch.ones(rollouts, dtype=torch.bool),
        num_tokens=torch.full((rollouts,), tokens, dtype=torch.int64), num_groups=groups,
        components=rewards[:, None].clone(), component_valid=torch.ones(rollouts, 1,
                                                                         dtype=torch.bool),
        component_names=("reward",), weights=torch.ones(1, dtype=torch.float64),
        values=torch.rand(n, generator=gen, dtype=torch.float64),
        token_ids=ids.reshape(-1), rollouts=objects)


# ---- straightforward references: per-group Python loops over Python floats -------------

def _grpo_group(r: list[float], eps: float = 1e-6) -> list[float]:
    mean = sum(r) / len(r)
    std = statistics.stdev(r)
    return [(x - mean) / (std + eps) if std > 0 else 0.0 for x in r]


def _dr_grpo_group(r: list[float]) -> list[float]:
    mean = sum(r) / len(r)
    return [x - mean for x in r]


def _rloo_group(r: list[float]) -> list[float]:
    total = sum(r)
    return [x - (total - x) / (len(r) - 1) for x in r]


def _passk_group(r: list[float], k: int = 1) -> list[float]:
    n, c = len(r), sum(1 for x in r if x >= 0.5)
    rho = 1 - math.comb(n - c, k) / math.comb(n, k)
    s = math.sqrt(rho * (1 - rho))
    if s == 0:
        return [0.0] * n
    pos = (1 - rho) / (s + 1e-6)
    neg = (1 - rho - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) / (s + 1e-6)
    return [pos if x >= 0.5 else neg for x in r]


def _opo_group(r: list[float]) -> list[float]:
    lengths = [1.0] * len(r)  # every synthetic rollout has the same length
    baseline = sum(n * x for n, x in zip(lengths, r)) / sum(lengths)
    return [x - baseline for x in r]


def _remax_group(r: list[float]) -> list[float]:
    return [0.0] + [x - r[0] for x in r[1:]]  # rollout 0 is the group's greedy rollout


def _grpo_passk_group(r: list[float], eps: float = 1e-6) -> list[float]:
    ordered = sorted(r, reverse=True)
    best = r.index(ordered[0])
    margin = (ordered[0] - ordered[1]) / (statistics.stdev(r) + eps)
    return [margin if i == best else 0.0 for i in range(len(r))]


REFERENCES: dict[str, Callable[[list[float]], list[float]]] = {
    "grpo": _grpo_group, "dr_grpo": _dr_grpo_group, "rloo": _rloo_group, "passk": _passk_group,
    "opo": _opo_group, "remax": _remax_group, "grpo_passk": _grpo_passk_group,
}


def loop_reference(batch: AdvantageBatch, per_group: Callable[[list[float]], list[float]],
                   tokens: int) -> torch.Tensor:
    """Per group in Python, then each rollout's tokens as a Python list: the straightforward
    way to write it without tensors."""
    rewards = batch.rewards.tolist()
    dense: list[float] = []
    for g in range(batch.num_groups):
        for a in per_group(rewards[g * GROUP:(g + 1) * GROUP]):
            dense.extend([a] * tokens)
    return torch.tensor(dense, dtype=torch.float64)


def slice_fill_reference(batch: AdvantageBatch,
                         per_group: Callable[[list[float]], list[float]],
                         tokens: int) -> torch.Tensor:
    """Per group in Python, each rollout's tokens filled as a tensor slice: a careful loop,
    bound by the same memory traffic as the vectorised code."""
    rewards = batch.rewards.tolist()
    out = torch.empty(batch.size * tokens, dtype=torch.float64)
    for g in range(batch.num_groups):
        for j, a in enumerate(per_group(rewards[g * GROUP:(g + 1) * GROUP])):
            i = g * GROUP + j
            out[i * tokens:(i + 1) * tokens] = a
    return out


def _whiten_list(xs: list[float], eps: float = 1e-8) -> list[float]:
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    scale = 1 / math.sqrt(var + eps)
    return [(x - mean) * scale for x in xs]


def gpg_reference(batch: AdvantageBatch, tokens: int) -> torch.Tensor:
    """alpha = B / #rollouts in groups with spread, times r - mean, per group in Python."""
    rewards = batch.rewards.tolist()
    groups = [rewards[g * GROUP:(g + 1) * GROUP] for g in range(batch.num_groups)]
    valid = sum(len(r) for r in groups if max(r) != min(r))
    alpha = len(rewards) / max(valid, 1)
    dense: list[float] = []
    for r in groups:
        for a in (_dr_grpo_group(r) if max(r) != min(r) else [0.0] * len(r)):
            dense.extend([alpha * a] * tokens)
    return torch.tensor(dense, dtype=torch.float64)


def reinforce_pp_baseline_reference(batch: AdvantageBatch, tokens: int) -> torch.Tensor:
    """r - group mean per token, whitened over all tokens, in Python."""
    rewards = batch.rewards.tolist()
    dense: list[float] = []
    for g in range(batch.num_groups):
        for a in _dr_grpo_group(rewards[g * GROUP:(g + 1) * GROUP]):
            dense.extend([a] * tokens)
    return torch.tensor(_whiten_list(dense), dtype=torch.float64)


def reinforce_pp_reference(batch: AdvantageBatch, tokens: int) -> torch.Tensor:
    """Returns token by token from the end (gamma 1, outcome at the last token), whitened."""
    dense: list[float] = []
    for r in batch.rewards.tolist():
        returns, g = [0.0] * tokens, 0.0
        for t in range(tokens - 1, -1, -1):
            g = (r if t == tokens - 1 else 0.0) + g
            returns[t] = g
        dense.extend(returns)
    return torch.tensor(_whiten_list(dense), dtype=torch.float64)


def gae_reference(batch: AdvantageBatch, tokens: int) -> torch.Tensor:
    """GAE token by token from the end (gamma = lambda = 1), not whitened (rewardd)."""
    values = batch.values.tolist()
    dense: list[float] = []
    for i, r in enumerate(batch.rewards.tolist()):
        v = values[i * tokens:(i + 1) * tokens]
        adv, a = [0.0] * tokens, 0.0
        for t in range(tokens - 1, -1, -1):
            reward = r if t == tokens - 1 else 0.0
            after = v[t + 1] if t + 1 < tokens else 0.0
            a = reward + after - v[t] + a
            adv[t] = a
        dense.extend(adv)
    return torch.tensor(dense, dtype=torch.float64)


BATCH_REFERENCES: dict[str, Callable[[AdvantageBatch, int], torch.Tensor]] = {
    "gpg": gpg_reference, "reinforce_pp_baseline": reinforce_pp_baseline_reference,
    "reinforce_pp": reinforce_pp_reference, "gae": gae_reference,
}
"""References that need the whole batch (a batch-level factor or whitening, or a per-token
recursion): loops in Python, token by token where the estimator is defined per token."""


PARAMS: dict[str, dict[str, Any]] = {}
"""Parameters an estimator needs to run on the synthetic batch (filled per estimator)."""


def time_estimator(name: str, batch: AdvantageBatch, repeats: int) -> float:
    params = PARAMS.get(name, {})

    def run() -> torch.Tensor:
        return compute(batch, name, params, "rewardd").per_token(batch)

    return median_time(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # per-core figures: the machine has 2 noisy cores
    small = make_batch(256, 8)
    for name, ref in REFERENCES.items():  # the references compute what rewardd computes
        ours = compute(small, name, PARAMS.get(name, {}), "rewardd").per_token(small)
        assert torch.allclose(ours, loop_reference(small, ref, 8), atol=1e-9), name
    for name, batch_ref in BATCH_REFERENCES.items():
        ours = compute(small, name, PARAMS.get(name, {}), "rewardd").per_token(small)
        assert torch.allclose(ours, batch_ref(small, 8), atol=1e-9), name
    batch = make_batch(args.rollouts, args.tokens)
    n = args.rollouts * args.tokens
    floor = median_time(lambda: torch.full((n,), 0.5, dtype=torch.float64), args.repeats)
    print(f"\n{args.rollouts} rollouts x {args.tokens} tokens, groups of {GROUP}, one thread, "
          f"median of {args.repeats}; memory floor (fill {n:,} float64): {floor * 1e3:.1f} ms\n")
    print("| estimator | ms | x memory floor | Python-list loop ms | speed-up | "
          "slice-fill loop ms | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    from rewardd.advantages import names_of
    for name in names_of("estimator"):
        try:
            seconds = time_estimator(name, batch, args.repeats)
        except Exception as exc:  # an estimator this synthetic batch cannot feed
            print(f"| {name} | skipped: {type(exc).__name__}: {exc} | | | |")
            continue
        ref = REFERENCES.get(name)
        cells = ["", "", "", ""]
        if name in BATCH_REFERENCES:
            naive = median_time(lambda: BATCH_REFERENCES[name](batch, args.tokens), 1)
            cells = [f"{naive * 1e3:.0f}", f"{naive / seconds:.1f}x", "", ""]
        if ref:
            naive = median_time(lambda: loop_reference(batch, ref, args.tokens), 1)
            fill = median_time(lambda: slice_fill_reference(batch, ref, args.tokens), 1)
            cells = [f"{naive * 1e3:.0f}", f"{naive / seconds:.1f}x", f"{fill * 1e3:.0f}",
                     f"{fill / seconds:.1f}x"]
        print(f"| {name} | {seconds * 1e3:.1f} | {seconds / floor:.2f}x | " + " | ".join(cells)
              + " |")
    print("\nLinear in total tokens: ms at 1x, 2x, 4x the tokens per rollout (a quarter, a "
          "half and all of the tokens above; out of cache at every size)\n")
    print("| estimator | 1x | 2x | 4x | 4x / 1x |")
    print("|---|---:|---:|---:|---:|")
    scaled = [make_batch(args.rollouts, args.tokens * factor // 4) for factor in (1, 2, 4)]
    for name in ("memory floor", "tempo", "gigpo"):
        times = []
        for batch_k in scaled:
            if name == "memory floor":
                size = batch_k.total_tokens
                times.append(median_time(
                    lambda: torch.full((size,), 0.5, dtype=torch.float64), args.repeats))
            else:
                times.append(time_estimator(name, batch_k, args.repeats))
        print(f"| {name} | " + " | ".join(f"{t * 1e3:.1f}" for t in times) +
              f" | {times[2] / times[0]:.2f} |")


if __name__ == "__main__":
    main()
