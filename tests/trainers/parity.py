"""Issue 16's acceptance: rewardd against each trainer's real advantage code, option by option.

The random batches are made here (seeded) and written as JSON; a script of
tests/trainers/scripts (``parity_<trainer>.py``) runs the trainer's own functions on them in
the trainer's environment, in float64, and prints per option and batch the advantages on a
padded (rows, T) grid. rewardd's side is :func:`rewardd.advantages.compute_advantages` (the
route's own numbers, tests/unit/test_compute_in_process.py) with the option's spec. The
deviation of an option on a batch is the largest |rewardd - trainer| over the tokens the
trainer's loss reads (mask 1).

Batches (issue 16): 64x8, 32x16, 128x2, ragged (group sizes 1..8 with singletons; equal
sizes with ragged lengths for the trainers that need contiguous blocks), and masks with holes
(0s inside a response). Rewards are binary in half the groups (zero-spread groups included)
and continuous (multiples of 1/1024) in the others. Each row also has two reward components
(binary, eighths), each null with probability 0.15 (TRL's None).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, Sequence

from rewardd.advantages import compute_advantages

TOLERANCE = 2e-7
MAX_LEN = 12


def _rows(rng: random.Random, sizes: Sequence[int], holes: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for g, size in enumerate(sizes):
        binary = g % 2 == 0
        for _ in range(size):
            length = rng.randint(1, MAX_LEN)
            mask = [1] * length
            if holes and length > 2:
                for t in range(1, length - 1):
                    if rng.random() < 0.3:
                        mask[t] = 0
            reward = float(rng.random() < 0.5) if binary else rng.randint(-2048, 2048) / 1024
            rows.append({"group": g, "reward": reward, "mask": mask,
                         "kl": [rng.randint(-256, 256) / 4096 for _ in range(length)],
                         "values": [rng.randint(-1024, 1024) / 1024 for _ in range(length)],
                         "components": [None if rng.random() < 0.15 else v for v in
                                        (float(rng.random() < 0.5), rng.randint(0, 8) / 8)]})
    return rows


def batches(seed: int = 16, equal_sizes: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The named random batches; ``equal_sizes`` makes the ragged one 16 groups of 4 with
    ragged lengths (OpenRLHF and TRL group contiguous blocks of one size)."""
    rng = random.Random(seed)
    ragged = [4] * 16 if equal_sizes else [rng.randint(1, 8) for _ in range(24)] + [1, 1]
    return {"64x8": _rows(rng, [8] * 64, False), "32x16": _rows(rng, [16] * 32, False),
            "128x2": _rows(rng, [2] * 128, False), "ragged": _rows(rng, ragged, False),
            "holes": _rows(rng, [8] * 32, True)}


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def request(rows: list[dict[str, Any]], spec: dict[str, Any], *, kl: bool = False,
            values: bool = False, components: Sequence[str] = ()) -> dict[str, Any]:
    groups: dict[int, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        rollout: dict[str, Any] = {"rollout_id": f"r{i}", "num_tokens": len(row["mask"])}
        if components:  # two reward components, null where the row has None
            rollout["rewards"] = {name: row["components"][k]
                                  for k, name in enumerate(components)}
        else:
            rollout["reward"] = row["reward"]
        if 0 in row["mask"]:
            rollout["mask"] = row["mask"]
        if kl:
            rollout["kl"] = row["kl"]
        if values:
            rollout["values"] = row["values"]
        groups.setdefault(row["group"], []).append(rollout)
    return {"groups": [{"group_id": f"g{g}", "rollouts": rs} for g, rs in groups.items()],
            "advantage": {**spec, "output": "dense"}}


def rewardd_rows(rows: list[dict[str, Any]], spec: dict[str, Any], **inputs: Any
                 ) -> list[list[float]]:
    """rewardd's dense advantages per row (in the rows' order)."""
    out = compute_advantages(request(rows, spec, **inputs))
    by_id = {r["rollout_id"]: r["advantages"] for g in out["groups"] for r in g["rollouts"]}
    return [by_id[f"r{i}"] for i in range(len(rows))]


def deviation(rows: list[dict[str, Any]], ours: list[list[float]],
              theirs: list[list[float]]) -> float:
    """max |ours - theirs| over mask-1 tokens."""
    worst = 0.0
    for row, a, b in zip(rows, ours, theirs, strict=True):
        for t, m in enumerate(row["mask"]):
            if m:
                worst = max(worst, abs(a[t] - b[t]))
    return worst


def table(deviations: dict[str, dict[str, float]]) -> str:
    """A readable table of the deviations (printed by the tests; -s shows it)."""
    names = list(next(iter(deviations.values())))
    lines = [f"{'option':40s} " + " ".join(f"{n:>9s}" for n in names)]
    for option, row in deviations.items():
        lines.append(f"{option:40s} " + " ".join(f"{row[n]:9.2e}" for n in names))
    return "\n".join(lines)


def compare(python: str, script: str, options: list[dict[str, Any]], folder: Path,
            equal_sizes: bool = False) -> dict[str, dict[str, float]]:
    """Run ``script`` under the trainer's ``python`` on the batches and every option; the
    deviation per option and batch. Each option: ``name``, ``spec`` (rewardd's advantage
    spec), ``inputs`` (kl/values/components for :func:`request`), plus what the script reads."""
    from tests.trainers.conftest import SCRIPTS, run_script

    data = batches(equal_sizes=equal_sizes)
    path = write(folder / "parity.json", {"batches": data, "options": [
        {k: v for k, v in o.items() if k not in ("spec", "inputs")} for o in options]})
    proc = run_script(python, [str(SCRIPTS / script), str(path)], timeout_s=900)
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    out: dict[str, dict[str, float]] = {}
    for option in options:
        out[option["name"]] = {
            name: deviation(rows, rewardd_rows(rows, option["spec"], **option.get("inputs", {})),
                            theirs[option["name"]][name])
            for name, rows in data.items()}
    report = os.environ.get("REWARDD_PARITY_REPORT")  # a folder: the table as JSON there
    if report:
        Path(report, f"{Path(script).stem}.json").write_text(json.dumps(out, indent=1))
    print(table(out))
    return out


NOISE_VALUES = [0.1, 0.2, 0.3, 0.7, 0.9, 1 / 3, 2 / 3, 0.15, 1.1, 2.3, -0.6, 0.05, 3.7, 7.1,
                0.01, 0.99]


def zero_spread_batches(seed: int = 5) -> dict[str, list[dict[str, Any]]]:
    """Groups whose rollouts all have the same reward (no spread), of 2, 4, 8 and 16
    rollouts: the values above (not exact in binary) and 48 random ones in [-3, 3]."""
    rng = random.Random(seed)
    values = NOISE_VALUES + [rng.uniform(-3, 3) for _ in range(48)]
    out = {}
    for size in (2, 4, 8, 16):
        out[f"n{size}"] = [{"group": g, "reward": v, "mask": [1, 1, 1], "kl": [0.0] * 3,
                            "values": [0.0] * 3, "components": [v, v]}
                           for g, v in enumerate(values) for _ in range(size)]
    return out


def zero_spread_noise(python: str, script: str, options: list[dict[str, Any]], folder: Path
                      ) -> dict[str, dict[str, float]]:
    """Per option, the largest |advantage| on zero-spread groups: the trainer as it runs
    (float32), the trainer's code in float64, and rewardd (exactly 0 by design)."""
    from tests.trainers.conftest import SCRIPTS, run_script

    data = zero_spread_batches()
    path = write(folder / "noise.json", {"batches": data, "options": [
        {k: v for k, v in o.items() if k not in ("spec", "inputs")} for o in options]})
    runs = {}
    for mode, extra in (("float32", ["native"]), ("float64", [])):
        proc = run_script(python, [str(SCRIPTS / script), str(path), *extra], timeout_s=900)
        runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    out: dict[str, dict[str, float]] = {}
    for option in options:
        row: dict[str, float] = {}
        for mode, theirs in runs.items():
            row[mode] = max(deviation(rows, [[0.0] * len(r["mask"]) for r in rows],
                                      theirs[option["name"]][name])
                            for name, rows in data.items())
        row["rewardd"] = max(deviation(rows, [[0.0] * len(r["mask"]) for r in rows],
                                       rewardd_rows(rows, option["spec"],
                                                    **option.get("inputs", {})))
                             for rows in data.values())
        out[option["name"]] = row
    report = os.environ.get("REWARDD_PARITY_REPORT")
    if report:
        Path(report, f"{Path(script).stem}-noise.json").write_text(json.dumps(out, indent=1))
    print(table(out))
    return out
