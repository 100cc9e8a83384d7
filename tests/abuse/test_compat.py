"""Issue 28, rows 1, 9, 10 and 17: the per-sample trainer protocols (``/get_reward``,
NeMo-Gym ``/verify``) replayed as a hostile tenant would, at the issue's sizes, against a real
server; each asserts a typed refusal or a bounded cost (API memory, API CPU) and the other
tenant answered normally meanwhile."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import httpx
import pytest

from tests.support.abuse import (HOSTILE, HOSTILE_KEY, MB, SMALL_SCORE, Neighbour,
                                 abuse_server)

GROUPED = {"group": {"size": 8, "timeout_s": 5}}
"""Group mode: 8 samples of a prompt make a group; a group short of them is scored after 5 s."""


def openrlhf(count: int, distinct: bool = False) -> dict[str, Any]:
    """An OpenRLHF batch of ``count`` samples (each its own prompt when ``distinct``)."""
    prompts = [f"Q{i if distinct else 0}: 1+1? A: " for i in range(count)]
    return {"query": [p + "\\boxed{2}" for p in prompts], "prompts": prompts,
            "labels": ["2"] * count}


def metric(url: str, name: str, having: str = "") -> float:
    """The sum of a metric's samples on the server's /metrics (those whose labels contain
    ``having``)."""
    text = httpx.get(f"{url}/metrics", headers=HOSTILE, timeout=120).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if (line.startswith(name + "{") or line.startswith(name + " "))
               and having in line)


def fair_queue(url: str) -> dict[str, int]:
    """Calls of the API's embedded pool waiting in its fair queue, and running."""
    body = httpx.get(f"{url}/readyz", timeout=120).json()
    return body["executor"]["fair_queue"]


NEIGHBOUR = {**SMALL_SCORE, "rewards": [{"name": "same", "verifier": "exact_match"}]}
"""The neighbour's requests: checked by another verifier than the hostile tenant's (math), so
the checks of each are counted apart."""


def checks_done(url: str) -> float:
    """Checks the hostile tenant's verifier (math) made."""
    return metric(url, "rewardd_verifier_outcomes_total", 'verifier="math"')


class Hostile:
    """One hostile request run in a thread, while the neighbour is told it runs."""

    def __init__(self, url: str, path: str, body: dict[str, Any], neighbour: Neighbour) -> None:
        self.response: httpx.Response | None = None
        self._args = (url, path, body)
        self._neighbour = neighbour
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        url, path, body = self._args
        try:
            with httpx.Client(base_url=url, headers=HOSTILE, timeout=600) as http:
                self.response = http.post(path, json=body)
        finally:
            self._neighbour.hostile_running.clear()

    def __enter__(self) -> Hostile:
        self._neighbour.hostile_running.set()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=600)


def served_during(neighbour: Neighbour, hostile: Hostile) -> None:
    """The hostile request's end, after the neighbour was answered while it ran (order: on a
    request that ends first, its answer came too fast for anyone to wait)."""
    with hostile:
        while hostile._thread.is_alive() and neighbour.answered_during_hostile < 2:
            hostile._thread.join(timeout=0.05)


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[Any]:
    with abuse_server(env={"REWARDD_COMPAT_CONFIG": json.dumps(GROUPED)},
                      tmp_dir=tmp_path) as server:
        yield server


def refused_before_any_work(server: Any, path: str, body: dict[str, Any],
                            loc: list[str], kind: str, named: str = "") -> tuple[float, float]:
    """Replay a hostile request while the neighbour runs: a 422 of type ``kind`` at ``loc``
    (its message naming ``named``), no check made, the API's CPU on it under 2 s, its memory
    grown less than 200 MB, every neighbour request answered. (RSS growth, API CPU)."""
    rss, cpu, checks = server.rss_bytes(), server.api_cpu_s(), checks_done(server.url)
    with Neighbour(server.url, NEIGHBOUR) as neighbour:
        hostile = Hostile(server.url, path, body, neighbour)
        served_during(neighbour, hostile)
    answer = hostile.response
    assert answer is not None and answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"] == loc and error["type"] == kind and named in error["msg"]
    assert checks_done(server.url) == checks  # refused before anything was scored
    grown, spent = server.rss_bytes() - rss, server.api_cpu_s() - cpu
    assert spent < 2.0 and grown < 200 * MB
    assert neighbour.statuses and set(neighbour.statuses) == {200}
    return grown, spent


def test_row1_30000_distinct_prompts_in_group_mode_are_refused_naming_the_bound(grouped):
    body = openrlhf(30_000, distinct=True)
    assert len(json.dumps(body)) > 1.4 * MB  # the 1.5 MB request
    grown, spent = refused_before_any_work(grouped, "/get_reward", body, ["body", "query"],
                                           "too_many_samples",
                                           "REWARDD_COMPAT_MAX_SAMPLES_PER_REQUEST")
    print(f"row 1 (30,000 refused): API RSS +{grown / MB:.0f} MB, API CPU {spent:.2f} s")


def test_row1_8000_distinct_prompts_are_placed_in_one_step_and_parked_samples_bounded(
        tmp_path: Path):
    """Under the cap: accepted, placed in one bulk step (a session add per step, not per
    sample), the neighbour answered meanwhile; and a second request past the tenant's parked
    samples is a 429 naming the bound."""
    env = {"REWARDD_COMPAT_CONFIG": json.dumps(GROUPED),
           "REWARDD_COMPAT_MAX_PARKED_SAMPLES": "8000"}
    with abuse_server(env=env, tmp_dir=tmp_path) as server:
        rss, cpu = server.rss_bytes(), server.api_cpu_s()
        with Neighbour(server.url, NEIGHBOUR) as neighbour:
            hostile = Hostile(server.url, "/get_reward", openrlhf(8000, distinct=True),
                              neighbour)
            with hostile:
                while metric(server.url, "rewardd_tenant_held") < 8000:  # parked now
                    assert hostile._thread.is_alive()
                    time.sleep(0.05)  # a pause between polls, not a bound
                with httpx.Client(base_url=server.url, headers=HOSTILE, timeout=120) as http:
                    refused = http.post("/get_reward", json=openrlhf(1))
                while hostile._thread.is_alive() and neighbour.answered_during_hostile < 2:
                    hostile._thread.join(timeout=0.05)
        answer = hostile.response
        assert answer is not None and answer.status_code == 200, answer.text
        assert answer.json()["extra_logs"]["rewardd_group_size"] == [1.0] * 8000  # timed out
        assert refused.status_code == 429
        assert "REWARDD_COMPAT_MAX_PARKED_SAMPLES" in refused.json()["detail"]
        assert server.rss_bytes() - rss < 200 * MB
        print(f"row 1 (8,000 distinct prompts placed): API CPU {server.api_cpu_s() - cpu:.2f} s")
        assert neighbour.statuses and set(neighbour.statuses) == {200}


def leave_after_start(url: str, path: str, body: dict[str, Any]) -> None:
    """Send the request on a raw socket and close it once the server's pool has calls of it
    waiting: a client that leaves (order, not a timer)."""
    data = json.dumps(body).encode()
    where = urlparse(url)
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: {where.hostname}\r\n"
                      f"Authorization: Bearer {HOSTILE_KEY}\r\n"
                      "Content-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
        while fair_queue(url)["waiting_calls"] == 0:
            time.sleep(0.05)  # a pause between polls, not a bound


def test_row9_a_client_that_leaves_cancels_its_queued_checks(tmp_path: Path):
    with abuse_server(tmp_dir=tmp_path) as server:
        before = checks_done(server.url)
        rss, cpu = server.rss_bytes(), server.api_cpu_s()
        with Neighbour(server.url, NEIGHBOUR) as neighbour:
            neighbour.hostile_running.set()
            leave_after_start(server.url, "/get_reward", openrlhf(8000))
            while neighbour.answered_during_hostile < 2:
                time.sleep(0.05)
            neighbour.hostile_running.clear()
            # the queued checks drain by cancellation: none waits, none runs
            while (queue := fair_queue(server.url))["waiting_calls"] or queue["running_calls"]:
                time.sleep(0.05)
        done = checks_done(server.url) - before
        assert done < 4000, f"{done} of the 8,000 checks ran after the client left"
        assert server.rss_bytes() - rss < 200 * MB
        print(f"row 9: {done:.0f} checks ran; API CPU {server.api_cpu_s() - cpu:.2f} s")
        assert neighbour.statuses and set(neighbour.statuses) == {200}


def test_row10_an_echoed_field_nested_300_deep_is_a_422_before_scoring(tmp_path: Path):
    deep: Any = "x"
    for _ in range(300):
        deep = {"a": deep}
    body = {"responses_create_params": {"input": "1+1?"},
            "response": {"output": [{"type": "message", "content": [
                {"type": "output_text", "text": "\\boxed{2}"}]}]},
            "expected_answer": "2", "extra": deep}
    with abuse_server(tmp_dir=tmp_path) as server:
        grown, spent = refused_before_any_work(server, "/verify", body, ["body", "extra"],
                                               "too_deep", "64 levels")
    print(f"row 10: API RSS +{grown / MB:.0f} MB, API CPU {spent:.2f} s")


def test_row17_60000_samples_in_batch_mode_are_refused_naming_the_cap(tmp_path: Path):
    with abuse_server(tmp_dir=tmp_path) as server:
        grown, spent = refused_before_any_work(server, "/get_reward", openrlhf(60_000),
                                               ["body", "query"], "too_many_samples",
                                               "REWARDD_COMPAT_MAX_SAMPLES_PER_REQUEST")
    print(f"row 17 (60,000 refused): API RSS +{grown / MB:.0f} MB, API CPU {spent:.2f} s")


def test_row17_8000_samples_at_the_cap_are_scored_off_the_event_loop(tmp_path: Path):
    """At the cap: scored, in rounds of a few thousand samples, the heavy steps in the
    heavy lane; the neighbour is answered while it runs."""
    with abuse_server(tmp_dir=tmp_path) as server:
        rss, cpu = server.rss_bytes(), server.api_cpu_s()
        with Neighbour(server.url, NEIGHBOUR) as neighbour:
            hostile = Hostile(server.url, "/get_reward", openrlhf(8000), neighbour)
            served_during(neighbour, hostile)
        answer = hostile.response
        assert answer is not None and answer.status_code == 200, answer.text
        assert answer.json()["scores"] == [1.0] * 8000
        grown, spent = server.rss_bytes() - rss, server.api_cpu_s() - cpu
        print(f"row 17 (8,000 scored): API RSS +{grown / MB:.0f} MB, API CPU {spent:.2f} s")
        assert grown < 200 * MB
        assert neighbour.statuses and set(neighbour.statuses) == {200}
