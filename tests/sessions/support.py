"""Helpers of the streaming-session tests: bodies, and a server-sent-events reader."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

ECHO = {"name": "r", "verifier": "test_echo"}
"""Rewards float(completion) (tests/plugins/faulty.py, loaded by the suite's servers)."""


def rollout(rid: str, reward: float, num_tokens: int = 3) -> dict[str, Any]:
    """A rollout whose test_delay reward is ``reward``."""
    return {"rollout_id": rid, "completion": repr(float(reward)), "num_tokens": num_tokens}


def groups_of(rewards: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Whole groups ``{group_id: [reward per rollout]}`` in the /v1/score shape."""
    return [{"group_id": gid, "prompt": f"prompt of {gid}", "reference": {"answer": gid},
             "rollouts": [rollout(f"{gid}#{i}", r, 3 + i) for i, r in enumerate(values)]}
            for gid, values in rewards.items()]


def spec(group_size: int, **more: Any) -> dict[str, Any]:
    return {"rewards": [ECHO], "group_size": group_size,
            "advantage": {"estimator": "grpo", "output": "dense"}, **more}


@dataclass
class Stream:
    """Reads ``GET /v1/sessions/{id}/events`` in a thread: (id, event, data, arrival time)
    of every event, until ``closed``."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    events: list[tuple[int, str, dict[str, Any], float]] = field(default_factory=list)
    error: BaseException | None = None

    def start(self) -> Stream:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self.events.extend(read_events(self.url, self.headers))
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self, timeout: float = 60) -> list[tuple[int, str, dict[str, Any], float]]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the event stream did not end"
        if self.error is not None:
            raise self.error
        return self.events

    def groups(self) -> dict[str, dict[str, Any]]:
        return {data["group_id"]: data for _, kind, data, _ in self.events if kind == "group"}


def read_events(url: str, headers: dict[str, str] | None = None,
                timeout: float = 60) -> list[tuple[int, str, dict[str, Any], float]]:
    """Every event of an SSE stream until it ends: (id, event, data, arrival time)."""
    out = []
    with httpx.stream("GET", url, headers=headers or {}, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        event: dict[str, str] = {}
        for line in response.iter_lines():
            if line == "":
                if "data" in event:
                    out.append((int(event["id"]), event["event"], json.loads(event["data"]),
                                time.monotonic()))
                event = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                event[name] = value
    return out


def by_id(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {g["group_id"]: g for g in groups}


def without_diagnostics(answer: dict[str, Any]) -> dict[str, Any]:
    """A /v1/score answer without ``diagnostics`` (how that request was answered: what the
    verdict cache saved it), which a session's close does not carry."""
    return {k: v for k, v in answer.items() if k != "diagnostics"}


def score_groups(group: dict[str, Any]) -> dict[str, Any]:
    """A group object without the session's additions (for comparing with /v1/score)."""
    return {k: v for k, v in group.items()
            if k not in ("index", "final", "reason", "failed", "arrived")}
