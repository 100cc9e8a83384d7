"""The harness itself: it reads the server's memory and CPU, and the neighbour's answers, so
a bound the other abuse tests assert cannot hold by reading nothing."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.abuse import HOSTILE, MB, SMALL_SCORE, Neighbour, abuse_server


def test_the_harness_reads_the_servers_memory_and_cpu_and_the_neighbours_answers(
        tmp_path: Path) -> None:
    with abuse_server(tmp_dir=tmp_path) as server:
        assert server.rss_bytes() > 100 * MB  # the API process and its pool's workers
        before = server.api_cpu_s()
        with Neighbour(server.url) as neighbour:
            neighbour.hostile_running.set()
            with httpx.Client(base_url=server.url, headers=HOSTILE, timeout=120) as http:
                for _ in range(3):
                    assert http.post("/v1/score", json=SMALL_SCORE).status_code == 200
                # order: the neighbour is answered while the "hostile" tenant is at work
                while neighbour.answered_during_hostile < 2:
                    assert http.post("/v1/score", json=SMALL_SCORE).status_code == 200
            neighbour.hostile_running.clear()
        assert server.api_cpu_s() > before
        assert neighbour.statuses and set(neighbour.statuses) == {200}
        assert httpx.get(f"{server.url}/v1/verifiers").status_code == 401  # keys are on
