"""/metrics of an API on Celery workers: task latency and outcomes, retries after a worker
died, the worker census, and queue depth read from the broker."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

import tests.plugins.faulty  # noqa: F401 - the API validates test verifiers' names
from rewardd.service.app import create_app
from tests.integration.conftest import make_settings
from rewardd.workers.celery_app import VERIFY_TASK

UNSERVED = "unserved"
"""A routed queue no worker consumes: what is published there stays there."""
PROBE = "metrics_probe"
"""A queue only this module's worker consumes (other modules' workers may share the
database while they run, and they all consume ``cpu``)."""
SETTINGS = make_settings(queue_routes=f"test_block={UNSERVED}", worker_lost_retries=1)


def scrape(client: TestClient) -> dict[tuple[str, frozenset], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def get(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    return (get(after, name, **labels) or 0.0) - (get(before, name, **labels) or 0.0)


@pytest.fixture(scope="module")
def client(fleet_for: Any) -> Iterator[TestClient]:
    fleet_for(SETTINGS).start(1, queues=f"cpu,{PROBE}", concurrency=2)
    with TestClient(create_app(SETTINGS)) as test_client:
        assert test_client.get("/readyz").status_code == 200
        yield test_client


def test_task_latency_outcomes_and_retries_after_a_batch(client: TestClient) -> None:
    groups = 6
    body = {
        "rewards": [{"name": "echo", "verifier": "test_echo"},
                    # kills its worker child on "3": group 1's task dies (redelivered once,
                    # then abandoned), is replayed per sample, and the "3" sample dies again
                    {"name": "crash", "verifier": "test_crash", "timeout_s": 5.0,
                     "params": {"when": ["3"]}}],
        "advantage": {"estimator": "grpo"},
        "groups": [{"group_id": f"g{i}", "rollouts": [
            {"rollout_id": f"g{i}-a", "completion": str(2 * i), "num_tokens": 4},
            {"rollout_id": f"g{i}-b", "completion": str(2 * i + 1), "num_tokens": 4}]}
            for i in range(groups)]}
    before = scrape(client)
    response = client.post("/v1/score", json=body)
    assert response.status_code == 200, response.text
    rollouts = [r for g in response.json()["groups"] for r in g["rollouts"]]
    assert [r["rewards"]["echo"] for r in rollouts] == [float(i) for i in range(2 * groups)]
    assert rollouts[3]["status"]["crash"]["error"] == "crashed"
    after = scrape(client)

    # every echo task and the crash groups that succeeded: a latency each, counted success
    assert delta(before, after, "rewardd_task_duration_seconds_count",
                 queue="cpu", verifier="test_echo") == groups
    assert delta(before, after, "rewardd_task_duration_seconds_bucket",
                 queue="cpu", verifier="test_echo", le="+Inf") == groups
    assert delta(before, after, "rewardd_task_duration_seconds_sum",
                 queue="cpu", verifier="test_echo") > 0
    # crash: 5 groups succeed, group 1 fails as a whole, then its 2 samples: one ok, one
    # abandoned after its redelivery budget
    assert delta(before, after, "rewardd_tasks_total", queue="cpu", state="success") == \
        groups + (groups - 1) + 1
    assert delta(before, after, "rewardd_tasks_total", queue="cpu", state="failure") == 2
    assert delta(before, after, "rewardd_task_retries_total", queue="cpu",
                 reason="replay") == 1
    # each of the two dying tasks was redelivered twice (the second time past the budget)
    assert delta(before, after, "rewardd_task_retries_total", queue="cpu",
                 reason="worker_lost") == 4


def test_worker_gauge_comes_from_the_census(client: TestClient) -> None:
    deadline = time.monotonic() + 30
    while True:  # the census runs in the background; a scrape only starts one
        samples = scrape(client)
        # present (0) from the first scrape; the census's own source says when it answered
        if get(samples, "rewardd_metrics_source_up", source="census") == 1:
            break
        assert time.monotonic() < deadline, "no worker census within 30 s"
        time.sleep(0.2)
    assert get(samples, "rewardd_workers", queue=PROBE) == 1  # a queue no route names
    assert (get(samples, "rewardd_workers", queue="cpu") or 0) >= 1
    assert get(samples, "rewardd_workers", queue=UNSERVED) == 0
    assert get(samples, "rewardd_workers", queue="gpu") == 0


def test_queue_depth_counts_messages_nobody_consumes(client: TestClient,
                                                     redis_db: redis.Redis) -> None:
    samples = scrape(client)
    assert get(samples, "rewardd_queue_depth", queue=UNSERVED) == 0
    assert get(samples, "rewardd_queue_depth", queue="gpu") == 0
    celery = client.app.state.services.executor.app
    args = ("test_block", [[[{"completion": "1", "prompt": "", "num_tokens": None}], {}]], {}, 1.0)
    with celery.producer_or_acquire() as producer:
        for priority in (None, 5, 9, 9):  # kombu keeps one Redis list per priority step
            celery.tasks[VERIFY_TASK].apply_async(args=args, queue=UNSERVED, priority=priority,
                                                  producer=producer, expires=300)
    assert redis_db.llen(UNSERVED) == 1
    assert redis_db.llen(f"{UNSERVED}\x06\x163") == 1
    assert redis_db.llen(f"{UNSERVED}\x06\x169") == 2
    samples = scrape(client)
    assert get(samples, "rewardd_queue_depth", queue=UNSERVED) == 4
    assert get(samples, "rewardd_queue_depth", queue="gpu") == 0
    redis_db.delete(UNSERVED, f"{UNSERVED}\x06\x163", f"{UNSERVED}\x06\x169")
    assert get(scrape(client), "rewardd_queue_depth", queue=UNSERVED) == 0
