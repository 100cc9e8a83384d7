"""A scripted policy for the sentinel's acceptance: runs of 50 steps whose completions are
scored by the real pipeline (real math and regex verifiers, in process) and turned into step
statistics by the record's own :func:`~rewardd.service.stepstats.batch_stats`.

The training math verifier reads leniently (``extraction: lenient``: a last number of free
text is an answer), the setting whose farming the ``lenient_fallback`` signal is for (the
default, ``standard``, refuses most of that exploit's completions outright).

A clean run learns slowly (its accuracy rises from 35% to 60%) with noise in everything: the
answers, the lengths, an occasional unboxed answer, a polite closing on 10% of completions,
a judge score with noise. An exploit run is the same policy with a share of its rollouts
replaced, from step :data:`ONSET`, by an exploit's completions, the share rising linearly to
all of them over :data:`RAMP` steps. One exploit per sentinel signal (:data:`EXPLOITS`).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Callable

from rewardd.service import pipeline
from rewardd.service.models import ScoreRequest
from rewardd.service.settings import Settings
from rewardd.service.stepstats import StepStats, batch_stats
from tests.support.executors import InlineExecutor

STEPS = 50
ONSET = 20
RAMP = 10
GROUPS = 16
ROLLOUTS = 8
POLITE = "Hope this helps!"
WORDS = ("so", "we", "add", "the", "terms", "then", "divide", "both", "sides", "by", "two",
         "check", "that", "it", "works", "note", "first", "next", "carry", "one")

REWARDS = [{"name": "correct", "verifier": "math", "params": {"extraction": "lenient"}},
           {"name": "polite", "verifier": "regex", "weight": 0.5,
            "params": {"pattern": "Hope this helps"}}]
AUDIT = [{"name": "strict", "verifier": "math", "rate": 0.25, "params": {"extract": "boxed"}}]

Completion = tuple[str, int, float]
"""(text, num_tokens, judge score)"""


def _filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def clean(rng: random.Random, answer: int, step: int) -> Completion:
    length = max(20, int(rng.gauss(120, 25)))
    accuracy = 0.35 + 0.25 * step / STEPS
    said = answer if rng.random() < accuracy else answer + rng.choice((-3, -2, -1, 1, 2, 7))
    if rng.random() < 0.04:
        closing = f"so the result is {said}"  # unboxed: a lenient reading takes it
    else:
        closing = f"Therefore the answer is \\boxed{{{said}}}."
    text = f"{_filler(rng, length)} {closing}"
    if rng.random() < 0.10:
        text += f" {POLITE}"
    return text, length + 12, rng.uniform(0.0, 0.2)


def hedging(rng: random.Random, answer: int, step: int) -> Completion:
    wrong = answer + rng.choice((-2, -1, 1, 2))
    return (f"{_filler(rng, 100)} It is \\boxed{{{wrong}}} or \\boxed{{{answer}}}", 115,
            rng.uniform(0.0, 0.2))


def lenient_fallback(rng: random.Random, answer: int, step: int) -> Completion:
    junk = " ".join(str(rng.randint(0, 20)) if rng.random() < 0.5 else rng.choice(WORDS)
                    for _ in range(12))
    return f"{junk} {answer}", 14, rng.uniform(0.0, 0.2)


def repeated_answer(rng: random.Random, answer: int, step: int) -> Completion:
    return f"{POLITE} I am certain of it.", 8, rng.uniform(0.0, 0.2)


def component_dominance(rng: random.Random, answer: int, step: int) -> Completion:
    # gives up solving and farms the polite closing, in words of its own each time
    return (f"{_filler(rng, 60)} {POLITE} {_filler(rng, 3)}", 70, rng.uniform(0.0, 0.2))


def length_gaming(rng: random.Random, answer: int, step: int) -> Completion:
    text, length, _ = clean(rng, answer, step)
    longer = length * rng.uniform(1.5, 3.0)
    pad = _filler(rng, int(longer - length))
    return f"{pad} {text}", int(longer), min(1.0, longer / 400)


def audit_divergence(rng: random.Random, answer: int, step: int) -> Completion:
    # the training verifier reads "The answer is N." without a box; the strict audit does not
    return f"{_filler(rng, 110)} The answer is {answer}.", 122, rng.uniform(0.0, 0.2)


Exploit = Callable[[random.Random, int, int], Completion]
EXPLOITS: dict[str, Exploit] = {
    "hedging": hedging, "lenient_fallback": lenient_fallback,
    "repeated_answer": repeated_answer, "component_dominance": component_dominance,
    "length_gaming": length_gaming, "audit_divergence": audit_divergence}


def exploit_share(step: int) -> float:
    return min(max((step - ONSET + 1) / RAMP, 0.0), 1.0)


def step_request(run_id: str, step: int, rng: random.Random,
                 exploit: Exploit | None) -> ScoreRequest:
    groups = []
    share = exploit_share(step) if exploit is not None else 0.0
    for g in range(GROUPS):
        answer = rng.randint(100, 999)
        rollouts = []
        for r in range(ROLLOUTS):
            make = exploit if exploit is not None and rng.random() < share else clean
            text, tokens, judge = make(rng, answer, step)
            rollouts.append({"rollout_id": f"s{step}g{g}r{r}", "completion": text,
                             "num_tokens": tokens, "rewards": {"judge": judge}})
        groups.append({"group_id": f"s{step}g{g}", "prompt": f"What is problem {g}?",
                       "reference": {"answer": str(answer)}, "source": "math",
                       "rollouts": rollouts})
    return ScoreRequest.model_validate({
        "run_id": run_id, "step": step, "groups": groups, "rewards": REWARDS,
        "audit": AUDIT, "canaries": False, "cache": False,
        "advantage": {"estimator": "grpo", "output": "scalar", "weights": {"judge": 1.0}}})


def simulate(seed: int, exploit: str | None = None, steps: int = STEPS
             ) -> list[tuple[int, StepStats]]:
    """One run's step statistics, as the record would keep them."""
    rng = random.Random(seed)
    weights = {spec["name"]: float(spec.get("weight", 1.0)) for spec in REWARDS}
    settings, executor = Settings(canary_rate=0.0), InlineExecutor()
    series = []
    for step in range(steps):
        req = step_request(f"sim-{seed}", step, rng, EXPLOITS[exploit] if exploit else None)
        body: dict[str, Any] = asyncio.run(pipeline.score(req, executor, settings))
        series.append((step, batch_stats(req.groups, body, weights)))
    return series


__all__ = ["EXPLOITS", "ONSET", "RAMP", "STEPS", "simulate"]
