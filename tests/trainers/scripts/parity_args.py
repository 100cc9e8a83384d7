"""The command line every ``parity_<trainer>.py`` shares: ``BATCHES.json [native]``.

``native`` runs the trainer as it runs (float32, nothing patched); without it the whole run is
float64, as issue 16's acceptance asks: constants a trainer makes without a dtype
(``torch.tensor(1.0)``, ``count / (count - 1)``) would otherwise be float32.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch


def parse() -> tuple[dict[str, Any], bool]:
    """The batches and options of the JSON file named first, and whether the run is native;
    a float64 run sets torch's default dtype before any trainer code runs."""
    with open(sys.argv[1]) as file:
        data = json.load(file)
    native = sys.argv[2:] == ["native"]
    if not native:
        torch.set_default_dtype(torch.float64)
    return data, native
