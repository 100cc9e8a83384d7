"""The abuse suite's harness: a real ``rewardd serve`` with a hostile and a well-behaved
tenant, the memory and CPU its processes spend, and the neighbour's requests meanwhile.

The suite (``tests/abuse``, ``make test-abuse``) replays what a hostile tenant did to a
shared server and asserts the bound by what the server's processes spent, never by wall
clock (a busy CI machine stretches time, not memory or CPU seconds):

* :meth:`AbuseServer.rss_bytes`: resident memory of the API process and every process below
  it (the embedded pool's workers, a sandbox's children), summed from ``/proc``;
* :meth:`AbuseServer.api_cpu_s`: CPU seconds of the API process (all its threads), from the
  kernel's per-process clock (:mod:`tests.support.cpu`);
* :class:`Neighbour`: the other tenant's small requests, sent one after another in a thread
  while the hostile one runs; each must be answered normally (its status), and some must be
  answered while the hostile request is still in flight (order, not time).
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import httpx

from tests.support.cpu import process_cpu_clock
from tests.support.server import server_process

HOSTILE_KEY = "abuse-hostile-key"
OTHER_KEY = "abuse-other-key"
HOSTILE = {"Authorization": f"Bearer {HOSTILE_KEY}"}
OTHER = {"Authorization": f"Bearer {OTHER_KEY}"}
MB = 1024 * 1024

SMALL_SCORE: dict[str, Any] = {
    "groups": [{"group_id": "g", "reference": {"answer": "2"},
                "rollouts": [{"rollout_id": "a", "completion": "\\boxed{2}", "num_tokens": 3},
                             {"rollout_id": "b", "completion": "\\boxed{3}", "num_tokens": 3}]}],
    "rewards": [{"name": "correct", "verifier": "math"}],
    "advantage": {"estimator": "grpo"}}
"""The neighbour's request: one small group, math verified, GRPO advantages."""


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.extend(int(c) for c in task.read_text().split())
    return found


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants, in bytes."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += _rss(current)
        todo.extend(_children(current))
    return total


@dataclass
class AbuseServer:
    """A running server, its URL and the measures of its processes."""

    url: str
    pid: int
    _cpu: Any = field(repr=False)

    def rss_bytes(self) -> int:
        return tree_rss_bytes(self.pid)

    def api_cpu_s(self) -> float:
        return self._cpu()


@contextlib.contextmanager
def abuse_server(*flags: str, env: Mapping[str, str] | None = None,
                 tmp_dir: Path) -> Iterator[AbuseServer]:
    """``rewardd serve`` with two tenants (``hostile``, ``other``; default limits unless
    ``flags`` or ``env`` set them) and an embedded pool of 2."""
    keys = tmp_dir / "abuse-keys.json"
    keys.write_text(json.dumps({"tenants": {"hostile": {"keys": [HOSTILE_KEY]},
                                            "other": {"keys": [OTHER_KEY]}}}))
    with server_process("--api-keys-file", str(keys), "--pool-size", "2", *flags,
                        env=env) as (url, proc):
        yield AbuseServer(url, proc.pid, process_cpu_clock(proc.pid))


class Neighbour:
    """The other tenant's small requests, one after another, until :meth:`stop`."""

    def __init__(self, url: str, body: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.body = dict(body or SMALL_SCORE)
        self.statuses: list[int] = []
        self.answered_while: list[bool] = []
        """For each answer, whether the hostile request was still in flight when it came."""
        self.hostile_running = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Neighbour:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=600)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, headers=OTHER, timeout=600) as http:
            while not self._stop.is_set():
                health = http.get("/healthz")
                score = http.post("/v1/score", json=self.body)
                running = self.hostile_running.is_set()
                self.statuses += [health.status_code, score.status_code]
                self.answered_while.append(running)

    def alive(self) -> bool:
        """Whether its thread still sends (it ends on stop or when a request raised)."""
        return self._thread.is_alive()

    @property
    def answered_during_hostile(self) -> int:
        return sum(self.answered_while)
