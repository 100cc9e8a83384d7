"""Issue 28 row 18 replayed on a real server: a 1.4 MB ``/v1/advantages`` body asking for
2^26 dense tokens (16,384 rollouts of 4,096 tokens) built a 1.3 GB JSON answer and stalled
``/healthz`` 2.7 s. Now it is a 422 at ``body.groups`` naming REWARDD_MAX_DENSE_TOKENS,
refused before anything is computed; the same body asking ``/v1/score`` for dense
advantages is refused the same way, before any verifier runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.abuse import HOSTILE, MB, Neighbour, abuse_server

ROLLOUTS, TOKENS, GROUP = 1 << 14, 1 << 12, 16
"""16,384 rollouts of 4,096 tokens: 2^26 per-token advantages asked for."""


def hostile_body(route: str) -> bytes:
    groups = []
    for g in range(ROLLOUTS // GROUP):
        rollouts = [{"rollout_id": f"group-{g:05d}-rollout-{i:03d}", "num_tokens": TOKENS}
                    for i in range(GROUP)]
        if route == "/v1/advantages":
            for i, rollout in enumerate(rollouts):
                rollout["reward"] = float(i % 2)
        else:
            for rollout in rollouts:
                rollout["completion"] = "\\boxed{1}"
        groups.append({"group_id": f"g{g}", "rollouts": rollouts,
                       **({"reference": {"answer": "1"}} if route == "/v1/score" else {})})
    body: dict[str, Any] = {"groups": groups, "advantage": {"output": "dense"}}
    if route == "/v1/score":
        body["rewards"] = [{"name": "correct", "verifier": "math"}]
    return orjson.dumps(body)


def refused(http: httpx.Client, route: str, body: bytes) -> None:
    response = http.post(route, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text[:500]
    [only] = response.json()["detail"]
    assert only["loc"] == ["body", "groups"]
    assert only["msg"].startswith(f"{ROLLOUTS * TOKENS} tokens in one request is over the "
                                  "limit of 4194304 (REWARDD_MAX_DENSE_TOKENS)"), only


@pytest.mark.parametrize("route", ["/v1/advantages", "/v1/score"])
def test_an_answer_of_2_to_the_26_dense_tokens_is_refused_before_it_is_built(
        tmp_path: Path, route: str) -> None:
    body = hostile_body(route)
    assert len(body) > 1.1 * MB  # the issue: 1.4 MB (ours: 1.16 and 1.39 MB)
    with abuse_server(tmp_dir=tmp_path) as server, \
            httpx.Client(base_url=server.url, headers=HOSTILE, timeout=600) as http:
        rss, cpu = server.rss_bytes(), server.api_cpu_s()
        refused(http, route, body)
        assert server.api_cpu_s() - cpu < 2.0  # reading and refusing, nothing built
        with Neighbour(server.url) as neighbour:
            neighbour.hostile_running.set()
            sent = 1
            while neighbour.answered_during_hostile < 2 and sent < 50:
                refused(http, route, body)
                sent += 1
            neighbour.hostile_running.clear()
        growth = server.rss_bytes() - rss
        assert growth < 200 * MB, f"{growth / MB:.0f} MB"
        assert neighbour.answered_during_hostile >= 2
        assert neighbour.statuses and set(neighbour.statuses) == {200}
