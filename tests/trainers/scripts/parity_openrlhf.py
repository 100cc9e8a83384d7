"""OpenRLHF 0.11.2's own advantage code on the parity batches, in float64
(tests/trainers/parity.py).

    parity_openrlhf.py BATCHES.json [native]   prints {option: {batch: [[advantage per token]]}}

``native`` runs OpenRLHF's code unchanged in float32 (the zero-spread noise of issue 16, item 5).

``openrlhf.trainer.ppo_utils.experience_maker`` does not import in the ``--no-deps``
environment (it imports ray), and ``openrlhf.models.utils`` imports peft through
``openrlhf.models``. So the functions are read from the installed files with ``ast`` at run
time (never copied into the repository): ``RemoteExperienceMaker.compute_advantages_and_returns``,
``get_advantages_and_returns`` and ``get_cumulative_returns`` as methods of a bare class, and
``compute_reward`` from models/utils.py; ``apply_length_penalties`` is imported (its module
imports only OpenRLHF's logging). One change to the source: the batch normalisation's
``.float()`` (a cast to float32) becomes ``.double()``, so the comparison is with OpenRLHF's
formula in float64, not its rounding. Each batch goes in as two experiences holding the
even and the odd rows with their ``index``, as OpenRLHF's sample splitting does.
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Tuple

import openrlhf
import torch
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

import parity_args

ROOT = Path(openrlhf.__file__).parent
MAX_LEN = 12
DTYPE = torch.float64
"""float64, or the trainer's own float32 with ``native`` (the zero-spread noise of item 5)."""
METHODS = ("compute_advantages_and_returns", "get_advantages_and_returns",
           "get_cumulative_returns")


def _functions(path: Path, names: tuple[str, ...], owner: str | None = None) -> list[ast.AST]:
    tree = ast.parse(path.read_text())
    scope = tree.body
    if owner is not None:
        [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        scope = cls.body
    found = [n for n in scope if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(n.name for n in found) == sorted(names), f"{path}: {names} not all found"
    return found


def load_maker(native: bool) -> type:
    """A class with OpenRLHF's three advantage methods, built from their installed source."""
    namespace: dict[str, Any] = {"torch": torch, "itertools": itertools, "List": List,
                                 "Tuple": Tuple, "apply_length_penalties": apply_length_penalties,
                                 "logger": logging.getLogger("openrlhf-parity")}
    [reward] = _functions(ROOT / "models" / "utils.py", ("compute_reward",))
    helpers = ast.Module(body=[reward], type_ignores=[])
    exec(compile(ast.unparse(helpers), "openrlhf/models/utils.py", "exec"), namespace)
    methods = _functions(ROOT / "trainer" / "ppo_utils" / "experience_maker.py", METHODS,
                         owner="RemoteExperienceMaker")
    cls = ast.ClassDef(name="Maker", bases=[], keywords=[], body=methods, decorator_list=[],
                       type_params=[])
    source = ast.unparse(ast.Module(body=[cls], type_ignores=[]))
    assert source.count(".float()") == 1, "OpenRLHF's normalisation changed: review the patch"
    if not native:
        source = source.replace(".float()", ".double()")
    exec(compile(source, "openrlhf/trainer/ppo_utils/experience_maker.py", "exec"), namespace)
    return namespace["Maker"]


def experiences(rows: list[dict[str, Any]]) -> list[SimpleNamespace]:
    out = []
    for part in (range(0, len(rows), 2), range(1, len(rows), 2)):
        index = list(part)
        n = len(index)
        mask = torch.zeros(n, MAX_LEN, dtype=torch.bool)
        kl = torch.zeros(n, MAX_LEN, dtype=DTYPE)
        values = torch.zeros(n, MAX_LEN, dtype=DTYPE)
        for k, i in enumerate(index):
            length = len(rows[i]["mask"])
            mask[k, :length] = torch.tensor(rows[i]["mask"], dtype=torch.bool)
            kl[k, :length] = torch.tensor(rows[i]["kl"], dtype=DTYPE)
            values[k, :length] = torch.tensor(rows[i]["values"], dtype=DTYPE)
        out.append(SimpleNamespace(
            index=index, action_mask=mask, kl=kl, values=values, info={},
            rewards=torch.tensor([rows[i]["reward"] for i in index], dtype=DTYPE)))
    return out


def run(maker_cls: type, option: dict[str, Any], rows: list[dict[str, Any]],
        group_size: int) -> list[list[float]]:
    args = SimpleNamespace(
        rollout=SimpleNamespace(n_samples_per_prompt=group_size),
        reward=SimpleNamespace(clip_range=tuple(option.get("clip_range", (-10, 10))),
                               overlong_buffer_len=None, stop_properly_penalty_coef=None),
        algo=SimpleNamespace(advantage=SimpleNamespace(
            estimator=option["openrlhf"], gamma=option.get("gamma", 1.0),
            lambd=option.get("lam", 1.0), no_std_norm=option.get("no_std_norm", False))))
    maker = maker_cls()
    maker.strategy = SimpleNamespace(args=args)
    maker.advantage_estimator = option["openrlhf"]
    maker.kl_ctl = SimpleNamespace(value=option.get("kl_coef", 0.0))
    done = maker.compute_advantages_and_returns(experiences(rows))
    out: list[list[float]] = [[] for _ in rows]
    for experience in done:
        assert experience.advantages.dtype == DTYPE, experience.advantages.dtype
        for k, i in enumerate(experience.index):
            out[i] = experience.advantages[k].tolist()
    return out


def main() -> None:
    global DTYPE
    data, native = parity_args.parse()
    if native:
        DTYPE = torch.float32
    maker_cls = load_maker(native)
    out: dict[str, dict[str, Any]] = {}
    for option in data["options"]:
        out[option["name"]] = {}
        for batch, rows in data["batches"].items():
            size = sum(1 for r in rows if r["group"] == rows[0]["group"])
            out[option["name"]][batch] = run(maker_cls, option, rows, size)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
