"""The trainer adapters log the server sentinel's signals: the client's list of signals is the
server's, and an answer's summary.sentinel becomes the flags TRL logs and verl's reward extra
info carries (every signal, 1.0 while it holds); an answer without one gives none. (verl's
plugin imports verl: its use of the flags runs in the trainer suite's environment only.)"""

from __future__ import annotations

from rewardd.service import pipeline
from rewardd.service.sentinel import SIGNALS, Alert
from rewardd_client._rewards import SENTINEL_SIGNALS, sentinel_flags


class Remembering:
    """A recorder that remembers one alert on run ``exp`` (as the record's sentinel would)."""

    def __call__(self, *args, **kwargs) -> int:
        return 0

    def active_alerts(self, run_id: str) -> list[Alert] | None:
        return [Alert("hedging", 23, 21, 0.3, 0.1, "hedged", None)] if run_id == "exp" else None


def answer_with_sentinel(run_id: str) -> dict:
    body = {"summary": {}, "groups": [{"group_id": "0", "rollouts": [
        {"rollout_id": "0", "reward": 1.0, "rewards": {"math": 1.0},
         "status": {"math": {"ok": True}}}]}]}
    pipeline._add_sentinel(body, Remembering(), run_id)
    return body


def test_the_clients_signals_are_the_servers() -> None:
    assert SENTINEL_SIGNALS == tuple(signal.name for signal in SIGNALS)


def test_an_answers_alerts_become_flags_for_every_signal() -> None:
    answer = answer_with_sentinel("exp")
    flags = sentinel_flags(answer["summary"], "rewardd/sentinel/")
    assert flags == {f"rewardd/sentinel/{s}": (1.0 if s == "hedging" else 0.0)
                     for s in SENTINEL_SIGNALS}
    assert sentinel_flags(answer_with_sentinel("other")["summary"], "x/") == {}
