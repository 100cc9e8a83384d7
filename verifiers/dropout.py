"""Rubric dropout: which rubric criteria a judge grades for one group at one step.

Stdlib only, so a judge worker imports it without torch. Rubric dropout is a hook of the
advantage catalogue (docs/estimators.md, reward transforms): a seeded random fraction of criteria
is dropped per group per step, the same subset for every rollout of the group.
"""

from __future__ import annotations

import hashlib
import json
import math


def rubric_keep_mask(num_criteria: int, p: float, *, seed: int, run_id: str | None,
                     group_id: str, step: int = 0,
                     keep_one_of: frozenset[int] = frozenset()) -> list[bool]:
    """Which rubric criteria to keep for one group at one training step (Rubric Dropout).

    Drops round(p * num_criteria) criteria (half rounds up), but never all: at least one is
    kept. A fixed-size subset, not an independent coin per criterion, so every group loses
    the same fraction. The subset depends only on (seed, run_id, group_id, step): every
    rollout of the group is judged on the same criteria, so group-relative advantages stay
    comparable, and the next step drops a different subset. Criteria are ordered by a
    blake2b digest of (seed, run_id, group_id, step, index) and the lowest are dropped,
    which is stable across processes and Python versions (unlike hash() or random).
    Evaluation requests pass p=0 and keep the full rubric.

    ``keep_one_of``: criteria of which at least one must stay (the rubric's positive ones:
    without one the score has nothing to divide by). When the draw would drop the last of
    them, it is skipped and the next criterion in the draw goes instead, so the number
    dropped stays the same where it can.
    """
    if num_criteria < 0:
        raise ValueError(f"num_criteria must be >= 0, got {num_criteria}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout fraction p must be in [0, 1], got {p}")
    drop = min(math.floor(p * num_criteria + 0.5), num_criteria - 1)
    if drop <= 0:
        return [True] * num_criteria

    def draw(index: int) -> bytes:
        key = json.dumps([seed, run_id, group_id, step, index]).encode()
        return hashlib.blake2b(key, digest_size=16).digest()

    protected_left = len(keep_one_of & set(range(num_criteria)))
    dropped: set[int] = set()
    for c in sorted(range(num_criteria), key=lambda c: (draw(c), c)):
        if len(dropped) == drop:
            break
        if c in keep_one_of:
            if protected_left == 1:
                continue
            protected_left -= 1
        dropped.add(c)
    return [c not in dropped for c in range(num_criteria)]
