"""A batch's step statistics (service/stepstats.py): each number against one computed by hand
from the same batch, merging batches equals one batch, and the hedging detector
(verifiers/math/hedging.py) on the forms it must and must not count."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from rewardd.service.agreement import pearson
from rewardd.service.stepstats import StepStats, batch_stats, tail_of
from rewardd.verifiers.math.hedging import candidates


def group(gid: str, completions: list[str], prompt: str = "p", source: str = "s") -> Any:
    return SimpleNamespace(group_id=gid, prompt=prompt, source=source, data_source=None,
                           rollouts=[SimpleNamespace(completion=c) for c in completions])


def item(reward: float | None, parts: dict[str, float], tokens: int, rule: str = "boxed",
         audit: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"reward": reward, "rewards": parts, "num_tokens": tokens,
                           "status": {name: {"ok": True, "detail": {"rule": rule}}
                                      for name in parts}}
    if audit is not None:
        out["audit"] = {"gold": {"ok": True, "reward": audit}}
    return out


def test_each_statistic_matches_the_batch_by_hand() -> None:
    groups = [group("a", ["x \\boxed{1}", "so 1 or 2", "7 8 9 1"]),
              group("b", ["x \\boxed{1}", "nothing"], prompt="q")]
    items = [[item(1.5, {"m": 1.0, "f": 1.0}, 10, audit=1.0),
              item(1.0, {"m": 1.0, "f": 0.0}, 20),
              item(1.0, {"m": 1.0, "f": 0.0}, 30, rule="last_number", audit=0.0)],
             [item(1.5, {"m": 1.0, "f": 1.0}, 10, audit=1.0),
              item(0.0, {"m": 0.0, "f": 0.0}, 40)]]
    body = {"groups": [{"rollouts": rollouts} for rollouts in items]}
    stats = batch_stats(groups, body, {"m": 1.0, "f": 0.5})
    rewards, lengths = [1.5, 1.0, 1.0, 1.5, 0.0], [10, 20, 30, 10, 40]
    assert (stats.rollouts, stats.groups, stats.rewarded, stats.positive) == (5, 2, 5, 4)
    assert stats.reward_mean == pytest.approx(sum(rewards) / 5)
    assert stats.length_mean == pytest.approx(22.0)
    assert stats.length_correlation == pytest.approx(pearson(lengths, rewards))
    assert stats.hedged_share == 1 / 4 and stats.lenient_share == 1 / 4
    # "x \boxed{1}" earned reward on both prompts: one tail on 2 of the 2 groups
    assert stats.repeat_share == 1.0 and tail_of("x \\boxed{1}") in stats.tails
    m, f = 4 * 1.0, 0.5 * 2  # |weight x sum| over the 5 complete rollouts
    assert stats.shares() == pytest.approx({"m": m / (m + f), "f": f / (m + f)})
    assert stats.audit["gold"] == [[1.5, 1.0], [1.0, 0.0], [1.5, 1.0]]
    assert stats.source_means() == {"s": pytest.approx(1.0)}


def test_batches_of_a_step_merge_into_what_one_batch_gives() -> None:
    groups = [group(f"g{i}", [f"answer {i}", f"other {i}"], prompt=f"p{i}") for i in range(4)]
    body = {"groups": [{"rollouts": [item(1.0, {"m": 1.0}, 5 + i, audit=1.0),
                                     item(0.0, {"m": 0.0}, 9, audit=0.0)]}
                       for i in range(4)]}
    whole = batch_stats(groups, body, {"m": 1.0})
    halves = [batch_stats(groups[:2], {"groups": body["groups"][:2]}, {"m": 1.0}),
              batch_stats(groups[2:], {"groups": body["groups"][2:]}, {"m": 1.0})]
    merged = StepStats.from_document(halves[0].to_document()).merge(halves[1])
    assert merged.to_document() == whole.to_document()
    assert math.isclose(merged.agreement("gold").agreement, whole.agreement("gold").agreement)


@pytest.mark.parametrize("text, count", [
    ("The answer is 1, 2 or 3.", 3),
    ("\\boxed{4} or \\boxed{5}", 2),
    ("So $x=2$ or $x=3$", 2),
    ("values 1.5 or 2.5.", 2),
    ("x = 2 or x = 3", 1),           # an equation's roots stated as equations: no candidates
    ("either 7 or 7.", 1),           # the same answer twice
    ("I have 3 apples or so", 1),
    ("for more words 4", 1),         # "or" inside words
    ("It could be 3 or 4; testing 3 works. " + "x" * 300 + " \\boxed{3}", 1),  # working
])
def test_hedged_answers_are_counted_in_the_final_statement_only(text: str, count: int) -> None:
    assert candidates(text) == count
