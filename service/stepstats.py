"""What the sentinel and the inspector need of each step, gathered once per recorded batch.

:func:`batch_stats` turns a scored batch (the request's groups and the answer) into a
:class:`StepStats` in the record's writer thread; the record keeps one per batch (table
``batches``) and :meth:`StepStats.merge` adds up the batches of a step (a step may arrive in
several requests, a session's groups one by one, from several pods). Everything in it is a
count or a sum, so merging is exact and order-free, except three bounded samples: the
audit's (training, audit) pairs (rank correlation needs the pairs), and the most-shared
rewarded tails (the repetition signal), each capped so that a step's document stays small
(a few KB) whatever the batch size.

Why sums rather than re-reading the rollouts: the sentinel looks at every step of a run after
every write; reading a 1,000-step run's rollouts again each time would cost seconds, its
steps' sums cost milliseconds (README, "The sentinel: what it costs a step").
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rewardd.service.agreement import Agreement, is_reward
from rewardd.verifiers.math.hedging import candidates

TAIL_CHARS = 64
"""A completion's tail: its last 64 characters, whitespace collapsed (an appended string, a
closing formula, or the whole of a short completion)."""
MAX_TAILS = 32
"""Tails kept per batch: the most shared (by distinct prompts) rewarded ones."""
MAX_PROMPTS_PER_TAIL = 256
MAX_AUDIT_PAIRS = 2048
"""(training, audit) pairs kept per step and audit component."""
MOST_SHARED = "\x00most_shared"
"""The key of :attr:`StepStats.most_shared` among derived values (no audit name has a NUL)."""
LENIENT_RULES = frozenset({"last_number"})
"""Verdict readings that are lenient fallbacks: the math verifier's ``detail.rule`` when it
took the last number of free text as the answer."""



def _short_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def tail_of(completion: str) -> str:
    """The tail that :data:`TAIL_CHARS` defines, hashed (whitespace collapsed in the last
    characters only: the tail of a long completion costs what a short one's does)."""
    return _short_hash(" ".join(completion[-4 * TAIL_CHARS:].split())[-TAIL_CHARS:])


@dataclass(slots=True)
class ComponentSums:
    """One reward component over the rollouts every component scored (for its share of the
    reward, :meth:`StepStats.shares`)."""

    weight: float
    n: int = 0
    total: float = 0.0


@dataclass(slots=True)
class StepStats:
    """A step's (or one batch's) counts and sums; see the module doc."""

    rollouts: int = 0
    groups: int = 0
    rewarded: int = 0
    """Rollouts with a combined reward (not excluded)."""
    reward_sum: float = 0.0
    reward_squares: float = 0.0
    lengths: int = 0
    """Rewarded rollouts with a length (num_tokens)."""
    length_sum: float = 0.0
    length_squares: float = 0.0
    length_reward: float = 0.0
    length_reward_sum: float = 0.0
    """Sum of the rewards of the rollouts counted in ``lengths``."""
    length_reward_squares: float = 0.0
    positive: int = 0
    """Rollouts rewarded above 0."""
    hedged: int = 0
    """Of those, completions stating several candidate answers."""
    lenient: int = 0
    """Of those, rewarded by a lenient reading (:data:`LENIENT_RULES`)."""
    complete: int = 0
    """Rollouts every verifier component scored (what ``components`` sums over)."""
    complete_sum: float = 0.0
    complete_squares: float = 0.0
    components: dict[str, ComponentSums] = field(default_factory=dict)
    sources: dict[str, list[float]] = field(default_factory=dict)
    """Source -> [rewarded rollouts, reward sum]."""
    tails: dict[str, list[str]] = field(default_factory=dict)
    """Rewarded tail -> the prompts (hashed) it was rewarded on."""
    audit: dict[str, list[list[float]]] = field(default_factory=dict)
    """Audit component -> [training, audit] pairs."""
    canaries: dict[str, list[int]] = field(default_factory=dict)
    """Component -> [passed, failed]."""
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """What is read of a step many times over (a window per step of the run) and costs a
    pass: :meth:`agreement` (a rank correlation sorts its pairs), :attr:`most_shared`.
    Emptied by :meth:`merge`."""

    # ---- merging and storing ------------------------------------------------------------------

    def merge(self, other: StepStats, tails: bool = True, pairs: bool = True) -> StepStats:
        """Add ``other`` (another batch of the same step) into this one; returns self.
        ``tails=False``: leave the tails out (a window of several steps: tails are per
        step, and their merge is the costly part); ``pairs=False``: the audit pairs too
        (a window reads its steps' agreements, :meth:`agreement`)."""
        self._derived.clear()
        for name in ("rollouts", "groups", "rewarded", "reward_sum", "reward_squares",
                     "lengths", "length_sum", "length_squares", "length_reward",
                     "length_reward_sum", "length_reward_squares", "positive", "hedged",
                     "lenient", "complete", "complete_sum", "complete_squares"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, part in other.components.items():
            mine = self.components.setdefault(name, ComponentSums(part.weight))
            mine.n += part.n
            mine.total += part.total
        for source, (n, total) in other.sources.items():
            mine_source = self.sources.setdefault(source, [0, 0.0])
            mine_source[0] += n
            mine_source[1] += total
        for tail, prompts in (other.tails.items() if tails else ()):
            kept = self.tails.setdefault(tail, [])
            kept.extend(p for p in prompts if p not in kept)
            del kept[MAX_PROMPTS_PER_TAIL:]
        for name, found in (other.audit.items() if pairs else ()):
            kept_pairs = self.audit.setdefault(name, [])
            kept_pairs.extend(found[:max(MAX_AUDIT_PAIRS - len(kept_pairs), 0)])
        for name, (passed, failed) in other.canaries.items():
            counts = self.canaries.setdefault(name, [0, 0])
            counts[0] += passed
            counts[1] += failed
        return self

    def to_document(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in self.__slots__
                               if name != "components" and not name.startswith("_")}
        out["components"] = {name: [c.weight, c.n, c.total]
                             for name, c in self.components.items()}
        return out

    @classmethod
    def from_document(cls, data: Mapping[str, Any]) -> StepStats:
        """A :class:`StepStats` of its own (no container shared with ``data``)."""
        scalars = {name: data[name] for name in cls.__slots__ if name in data
                   and not name.startswith("_") and not isinstance(data[name], (dict, list))}
        stats = cls(**scalars)
        stats.components = {name: ComponentSums(*values)
                            for name, values in (data.get("components") or {}).items()}
        stats.sources = {k: list(v) for k, v in (data.get("sources") or {}).items()}
        stats.tails = {k: list(v) for k, v in (data.get("tails") or {}).items()}
        stats.audit = {k: [list(p) for p in v] for k, v in (data.get("audit") or {}).items()}
        stats.canaries = {k: list(v) for k, v in (data.get("canaries") or {}).items()}
        return stats

    # ---- what a step says -------------------------------------------------------------------

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    @property
    def length_mean(self) -> float | None:
        return self.length_sum / self.lengths if self.lengths else None

    @property
    def length_correlation(self) -> float | None:
        """Pearson's correlation of length and reward within the step."""
        n = self.lengths
        if n < 3:
            return None
        var_l = self.length_squares - self.length_sum ** 2 / n
        var_r = self.length_reward_squares - self.length_reward_sum ** 2 / n
        if var_l <= 1e-12 * max(self.length_squares, 1.0) or var_r <= 1e-12:
            return None
        cov = self.length_reward - self.length_sum * self.length_reward_sum / n
        return max(-1.0, min(1.0, cov / math.sqrt(var_l * var_r)))

    def shares(self) -> dict[str, float]:
        """Each verifier component's share of the reward the components gave over the step:
        ``|weight x mean| / sum of them`` over the rollouts every component scored (empty
        with fewer than two components, or when they gave nothing)."""
        n = self.complete
        if not n or len(self.components) < 2:
            return {}
        parts = {name: abs(c.weight * c.total / n) for name, c in self.components.items()
                 if c.n == n}
        total = sum(parts.values())
        return {name: part / total for name, part in parts.items()} if total > 0 else {}

    @property
    def hedged_share(self) -> float | None:
        return self.hedged / self.positive if self.positive else None

    @property
    def lenient_share(self) -> float | None:
        return self.lenient / self.positive if self.positive else None

    @property
    def most_shared(self) -> int:
        """The most prompts one rewarded tail was rewarded on."""
        found = self._derived.get(MOST_SHARED)
        if found is None:
            found = self._derived[MOST_SHARED] = max(
                (len(prompts) for prompts in self.tails.values()), default=0)
        return found

    @property
    def repeat_share(self) -> float | None:
        """The most prompts one rewarded tail was rewarded on, as a share of the step's
        groups (1.0: the same ending earned reward on every prompt)."""
        if not self.groups:
            return None
        return self.most_shared / self.groups

    def agreement(self, name: str) -> Agreement:
        """Training vs audit component ``name`` over the step's pairs."""
        found = self._derived.get(name)
        if found is None:
            found = self._derived[name] = Agreement.of(
                [(t, a) for t, a in self.audit.get(name, ())])
        return found

    def source_means(self) -> dict[str, float | None]:
        return {source: (total / n if n else None)
                for source, (n, total) in sorted(self.sources.items())}


# ---- from a scored batch ----------------------------------------------------------------------

def batch_stats(groups: Sequence[Any], body: Mapping[str, Any],
                weights: Mapping[str, float]) -> StepStats:
    """The :class:`StepStats` of one scored batch: ``groups`` the request's, ``body`` the
    answer, ``weights`` the request's verifier components' weights."""
    stats = StepStats()
    tails: dict[str, set[str]] = {}
    for group, answered in zip(groups, body.get("groups") or ()):
        stats.groups += 1
        prompt = _short_hash(f"{group.group_id}\x1f{group.prompt or ''}")
        source = group.source or group.data_source or ""
        for rollout, item in zip(group.rollouts, answered["rollouts"]):
            _add_rollout(stats, rollout, item, weights, source, prompt, tails)
    ranked = sorted(tails.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:MAX_TAILS]
    stats.tails = {tail: sorted(prompts)[:MAX_PROMPTS_PER_TAIL] for tail, prompts in ranked}
    for name, report in ((body.get("summary") or {}).get("canaries") or {}).items():
        stats.canaries[name] = [int(report.get("passed") or 0), int(report.get("failed") or 0)]
    return stats


def _add_rollout(stats: StepStats, rollout: Any, item: Mapping[str, Any],
                 weights: Mapping[str, float], source: str, prompt: str,
                 tails: dict[str, set[str]]) -> None:
    stats.rollouts += 1
    reward = item.get("reward")
    if not is_reward(reward):
        return
    stats.rewarded += 1
    stats.reward_sum += reward
    stats.reward_squares += reward * reward
    counts = stats.sources.setdefault(source, [0, 0.0])
    counts[0] += 1
    counts[1] += reward
    length = item.get("num_tokens")
    if is_reward(length):
        stats.lengths += 1
        stats.length_sum += length
        stats.length_squares += length * length
        stats.length_reward += length * reward
        stats.length_reward_sum += reward
        stats.length_reward_squares += reward * reward
    rewards = item.get("rewards") or {}
    scored = {name: rewards.get(name) for name in weights}
    if weights and all(is_reward(value) for value in scored.values()):
        stats.complete += 1
        stats.complete_sum += reward
        stats.complete_squares += reward * reward
        for name, value in scored.items():
            part = stats.components.setdefault(name, ComponentSums(float(weights[name])))
            part.n += 1
            part.total += value
    for name, verdict in (item.get("audit") or {}).items():
        if verdict.get("ok") and is_reward(verdict.get("reward")):
            pairs = stats.audit.setdefault(name, [])
            if len(pairs) < MAX_AUDIT_PAIRS:
                pairs.append([float(reward), float(verdict["reward"])])
    if reward <= 0:
        return
    stats.positive += 1
    completion = rollout.completion or ""
    if candidates(completion) > 1:
        stats.hedged += 1
    if any((entry.get("detail") or {}).get("rule") in LENIENT_RULES
           and is_reward(rewards.get(name)) and rewards[name] > 0
           for name, entry in (item.get("status") or {}).items()):
        stats.lenient += 1
    tails.setdefault(tail_of(completion), set()).add(prompt)


__all__ = ["LENIENT_RULES", "StepStats", "batch_stats", "tail_of"]
