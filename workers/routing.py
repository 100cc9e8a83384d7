"""Which Celery queue a verifier's calls go to.

Queues separate workers by what they need, not by who asks: ``cpu`` for cheap pure-Python
checks, ``sandbox`` for untrusted code (workers on hosts set up for the sandbox), ``gpu`` for
model-based judges. A worker consumes the queues it is started with (``rewardd worker
--queues cpu,sandbox``), so a host without a GPU never receives a reward-model call.

Verifiers not listed here (plugins, unknown names) go to ``cpu`` unless
``REWARDD_QUEUE_ROUTES="name=queue,..."`` says otherwise.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

DEFAULT_QUEUE = "cpu"
QUEUES = ("cpu", "sandbox", "gpu")
"""The queues rewardd declares; routes may name others (Celery creates them on first use)."""

ROUTES: dict[str, str] = {
    "math": "cpu",
    "exact_match": "cpu",
    "regex": "cpu",
    "length": "cpu",
    "code": "sandbox",
    "rubric": "gpu",
    "arena": "gpu",
    "reward_model": "gpu",
    "refusal_judge": "gpu",
    "continuation": "gpu",
}

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def parse_routes(text: str) -> dict[str, str]:
    """``"name=queue,other=gpu"`` -> ``{"name": "queue", "other": "gpu"}``; ValueError if
    malformed (a typo must not silently send a GPU judge to CPU workers)."""
    routes: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, queue = (s.strip() for s in part.partition("="))
        if not sep or not name or not _QUEUE_NAME.match(queue):
            raise ValueError(f"bad queue route {part!r}: expected name=queue, e.g. my_judge=gpu")
        routes[name] = queue
    return routes


class Router:
    """Verifier name -> queue: built-in routes, overridden by ``overrides``, else ``cpu``."""

    def __init__(self, overrides: Mapping[str, str] | None = None) -> None:
        self.routes = {**ROUTES, **(overrides or {})}

    @classmethod
    def from_text(cls, text: str) -> Router:
        return cls(parse_routes(text))

    def queue_for(self, verifier: str) -> str:
        return self.routes.get(verifier, DEFAULT_QUEUE)

    @property
    def queues(self) -> list[str]:
        """Every queue a call may be sent to: the standard three plus any custom route's."""
        return _unique([*QUEUES, *self.routes.values()])


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
