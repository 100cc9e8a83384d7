"""Rebuilding rollout groups from a trainer's flat lists: runs of consecutive equal keys.

Trainers hand a reward function flat lists (TRL: B x G prompts and completions, each prompt
repeated G times in a row). rewardd scores groups, so an adapter must find where each group
starts. Two ways were possible:

- fixed blocks of G, which is what the trainers do on the *gathered* batch. A reward function
  runs on one process's slice, though, and with several processes a slice may start or end
  inside a group (G = 4 and a per-device batch of 6 give [4, 2] on one process and [2, 4] on
  the next): blocks of G would then pair rollouts of different prompts.
- runs of consecutive equal keys (the prompt, plus the reference where one varies), chosen
  here: correct for any split, and it needs no G. Its one cost: two adjacent groups with equal
  keys become one run. An adapter includes the reference in the key, so a merged run shares a
  prompt *and* a reference, and rewards of per-rollout verifiers do not change; only
  group-level verifiers (arena, tournament) see the larger group.

Keys are compared with ``==``, never hashed: chat prompts are lists of dicts (unhashable), and
hashing would also merge non-adjacent groups, which a trainer never means.
"""

from __future__ import annotations

from typing import Sequence


def runs_of_equal(keys: Sequence[object]) -> list[range]:
    """Index ranges of the maximal runs of consecutive equal ``keys``, in order.

    ``runs_of_equal(["a", "a", "b", "b", "b", "a"])`` is ``[range(0, 2), range(2, 5),
    range(5, 6)]``; an empty sequence gives ``[]``. The ranges cover ``range(len(keys))``
    exactly, so ``[keys[i] for run in runs for i in run]`` is ``list(keys)``.
    """
    runs: list[range] = []
    start = 0
    for index in range(1, len(keys) + 1):
        if index == len(keys) or keys[index] != keys[start]:
            runs.append(range(start, index))
            start = index
    return runs
