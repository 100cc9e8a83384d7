"""Replay slime's group reward call (``--custom-rm-path`` with ``--group-rm``) on given samples.

slime is not on PyPI (the ``slime`` there is another project), so its call is replayed here
with the same names and steps as THUDM/slime's ``slime/rollout/rm_hub/__init__.py`` and
``slime/rollout/sglang_rollout.py``: a ``Sample`` dataclass with slime's attribute names and
``Sample.Status`` values, an ``args`` namespace with the attributes slime reads
(``custom_rm_path``, ``group_rm``, ``rm_url``, ``reward_key``, ``eval_reward_key``), the
function loaded by dotted path (module imported, attribute read), awaited as
``function(args, samples, **kwargs)``, each result stored on ``sample.reward`` and read back
as slime's ``Sample.get_reward_value(args)`` does.

Usage: slime_group_rm.py CASE_JSON OUT_JSON; CASE_JSON holds {"args": {...}, "kwargs": {...},
"python_path": DIR (optional: where the user's module lies, as PYTHONPATH would add it),
"samples": [{field: value, "status": "completed"|...}, ...]}; OUT_JSON receives each
sample's trained-on reward value (null when none was set).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from argparse import Namespace
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    """The fields of slime's ``slime.utils.types.Sample`` that a reward function reads."""

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)

    def get_reward_value(self, args: Namespace) -> Any:
        return self.reward if not args.reward_key else self.reward[args.reward_key]


def load_function(path: str):
    module_name, _, attribute = path.rpartition(".")
    return getattr(importlib.import_module(module_name), attribute)


async def group_rm(args: Namespace, samples: list[Sample], **kwargs: Any) -> None:
    """What slime does once a prompt's samples are generated, under --group-rm."""
    assert args.group_rm and args.custom_rm_path is not None
    rewards = await load_function(args.custom_rm_path)(args, samples, **kwargs)
    for sample, reward in zip(samples, rewards, strict=False):
        sample.reward = reward


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as handle:
        case = json.load(handle)
    if case.get("python_path"):
        sys.path.insert(0, case["python_path"])
    defaults = {"group_rm": True, "rm_url": None, "reward_key": None, "eval_reward_key": None,
                "rm_type": None}
    args = Namespace(**{**defaults, **case["args"]})
    samples = [Sample(**{**s, "status": Sample.Status(s.get("status", "completed"))})
               for s in case["samples"]]
    asyncio.run(group_rm(args, samples, **case.get("kwargs", {})))
    out = [None if s.reward is None else s.get_reward_value(args) for s in samples]
    with open(sys.argv[2], "w", encoding="utf-8") as handle:
        json.dump(out, handle)


if __name__ == "__main__":
    main()
