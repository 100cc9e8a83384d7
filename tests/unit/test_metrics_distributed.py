"""Metrics of distributed execution and jobs, without Redis: scrape-time collectors against
fakes, multiprocess mode, and the Celery executor's task metrics against a stub backend."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from rewardd.service import metrics
from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor
from tests.support.server import REPO_ROOT, child_env
from rewardd.verifiers.base import Outcome, Sample
from rewardd.workers.collector import Waiter
from rewardd.workers.distributed import CeleryExecutor
from rewardd.workers.executor import CallResult, ItemResult, VerifyCall
from rewardd.workers.packing import Pack


def parse(text: str | bytes) -> dict[tuple[str, frozenset], float]:
    if isinstance(text, bytes):
        text = text.decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def names(samples: dict) -> set[str]:
    return {name for name, _ in samples}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class FakeCeleryLike:
    """What the scrape-time collector reads of the Celery executor."""

    def __init__(self, depths: Any = None, workers: Any = None) -> None:
        self.depths, self.workers = depths, workers

    def queue_depths(self) -> Any:
        if isinstance(self.depths, Exception):
            raise self.depths
        return self.depths

    def workers_by_queue(self) -> Any:
        return self.workers


@pytest.fixture(autouse=True)
def no_job_counter() -> Iterator[None]:
    """Each test starts without a job counter; whatever was registered comes back after."""
    previous = metrics._job_counter
    metrics.register_job_counter(None)
    yield
    metrics.register_job_counter(previous)


# ---- jobs ------------------------------------------------------------------------------------

def test_jobs_gauge_reads_the_registered_counter_at_each_scrape() -> None:
    counts = {"queued": 3, "running": 1}
    calls = []

    def count() -> dict[str, int]:
        calls.append(1)
        return dict(counts)

    assert "rewardd_jobs" not in names(parse(metrics.render(None)[0]))  # none registered
    metrics.register_job_counter(count)
    first = parse(metrics.render(None)[0])
    assert first[("rewardd_jobs", frozenset({("state", "queued")}))] == 3
    assert first[("rewardd_jobs", frozenset({("state", "running")}))] == 1
    for state in ("succeeded", "failed", "cancelled"):  # always there, 0 when none
        assert first[("rewardd_jobs", frozenset({("state", state)}))] == 0
    counts.update(queued=0, succeeded=7, expired=2)  # an extra state is exported too
    second = parse(metrics.render(None)[0])
    assert second[("rewardd_jobs", frozenset({("state", "queued")}))] == 0
    assert second[("rewardd_jobs", frozenset({("state", "succeeded")}))] == 7
    assert second[("rewardd_jobs", frozenset({("state", "expired")}))] == 2
    assert len(calls) == 2
    metrics.register_job_counter(None)
    assert "rewardd_jobs" not in names(parse(metrics.render(None)[0]))


def test_a_failing_job_counter_reads_zero_and_says_so() -> None:
    """Issue 21: the series stays (an alert on it keeps working), the source says it failed."""
    def broken() -> dict[str, int]:
        raise ConnectionError("redis down")

    metrics.register_job_counter(broken)
    samples = parse(metrics.render(None, FakeCeleryLike({"cpu": 2}, {"cpu": 1}))[0])
    assert {dict(labels)["state"]: value for (name, labels), value in samples.items()
            if name == "rewardd_jobs"} == dict.fromkeys(metrics.JOB_STATES, 0.0)
    assert samples[("rewardd_metrics_source_up", frozenset({("source", "jobs")}))] == 0
    assert samples[("rewardd_queue_depth", frozenset({("queue", "cpu")}))] == 2


# ---- queues and workers ----------------------------------------------------------------------

def test_queue_depth_and_workers_come_from_the_executor() -> None:
    executor = FakeCeleryLike({"cpu": 5, "gpu": 0, "judge": 12}, {"cpu": 2, "gpu": 0})
    samples = parse(metrics.render(None, executor)[0])
    assert samples[("rewardd_queue_depth", frozenset({("queue", "cpu")}))] == 5
    assert samples[("rewardd_queue_depth", frozenset({("queue", "judge")}))] == 12
    assert samples[("rewardd_workers", frozenset({("queue", "cpu")}))] == 2
    assert samples[("rewardd_workers", frozenset({("queue", "gpu")}))] == 0
    text = metrics.render(None, executor)[0].decode()  # the recorded metrics are still there
    assert "# TYPE rewardd_http_requests_total counter" in text
    assert "# TYPE rewardd_task_duration_seconds histogram" in text


def test_no_queue_metrics_without_a_census_or_a_broker() -> None:
    # before the first census; a broker that is not Redis; the embedded pool (no methods)
    for executor in (FakeCeleryLike(None, None), object(), None):
        samples = parse(metrics.render(None, executor)[0])
        assert not names(samples) & {"rewardd_queue_depth", "rewardd_workers"}, executor


def test_an_unreachable_broker_drops_only_the_depth_gauge() -> None:
    samples = parse(metrics.render(None, FakeCeleryLike(ConnectionError("down"), {"cpu": 1}))[0])
    assert "rewardd_queue_depth" not in names(samples)
    assert samples[("rewardd_workers", frozenset({("queue", "cpu")}))] == 1


def test_multiprocess_mode_has_the_recorded_and_the_scrape_time_metrics(tmp_path: Any) -> None:
    """In multiprocess mode the new counters aggregate over processes (here: one other
    process) and the scrape-time collector is part of the multiprocess registry."""
    env = {**child_env(), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    code = ("from rewardd.service import metrics\n"
            "metrics.TASKS.labels('cpu', 'success').inc(3)\n"
            "metrics.TASK_RETRIES.labels('cpu', 'worker_lost').inc()\n"
            "metrics.TASK_DURATION.labels('cpu', 'math').observe(0.02)\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, check=True,
                   timeout=120)
    metrics.register_job_counter(lambda: {"running": 4})
    samples = parse(metrics.render(str(tmp_path), FakeCeleryLike({"cpu": 9}, {"cpu": 2}))[0])
    assert samples[("rewardd_tasks_total", frozenset({("queue", "cpu"), ("state", "success")}))] \
        == 3
    assert samples[("rewardd_task_retries_total",
                    frozenset({("queue", "cpu"), ("reason", "worker_lost")}))] == 1
    assert samples[("rewardd_task_duration_seconds_count",
                    frozenset({("queue", "cpu"), ("verifier", "math")}))] == 1
    assert samples[("rewardd_queue_depth", frozenset({("queue", "cpu")}))] == 9
    assert samples[("rewardd_workers", frozenset({("queue", "cpu")}))] == 2
    assert samples[("rewardd_jobs", frozenset({("state", "running")}))] == 4


def test_metrics_endpoint_without_a_broker() -> None:
    """The embedded configuration: /metrics answers, with jobs but no queue metrics."""
    with TestClient(create_app(Settings(), executor=RefusingExecutor())) as client:
        metrics.register_job_counter(lambda: {"queued": 1})  # after the app's own
        response = client.get("/metrics")
    assert response.status_code == 200
    samples = parse(response.text)
    assert not names(samples) & {"rewardd_queue_depth", "rewardd_workers"}
    assert samples[("rewardd_jobs", frozenset({("state", "queued")}))] == 1


# ---- the Celery executor, against stubs ------------------------------------------------------

SETTINGS = Settings(broker_url="redis://127.0.0.1:1/0", queue_routes="judge=judges")


class StubPipeline:
    def __init__(self, client: StubRedis) -> None:
        self.client, self.commands = client, []

    def __enter__(self) -> StubPipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def llen(self, key: str) -> StubPipeline:
        self.commands.append(("llen", key))
        return self

    def hget(self, key: str, field: str) -> StubPipeline:
        self.commands.append(("hget", key, field))
        return self

    def delete(self, *keys: Any) -> StubPipeline:
        self.commands.append(("delete", *keys))
        return self

    def execute(self) -> list[Any]:
        out = []
        for command in self.commands:
            if command[0] == "llen":
                out.append(self.client.lists.get(command[1], 0))
            elif command[0] == "hget":
                out.append(self.client.hashes.get(command[1], {}).get(command[2]))
            else:
                for key in command[1:]:
                    self.client.values.pop(key, None)
                    self.client.hashes.pop(key, None)
                out.append(len(command) - 1)
        self.client.executed.append(self.commands)
        return out


class StubRedis:
    def __init__(self) -> None:
        self.lists: dict[str, int] = {}
        self.values: dict[str, bytes] = {}
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.executed: list[list] = []

    def pipeline(self, transaction: bool = True) -> StubPipeline:
        return StubPipeline(self)

    def mget(self, keys: list[str]) -> list[Any]:
        return [self.values.get(key) for key in keys]

    def delete(self, *keys: Any) -> None:
        for key in keys:
            self.values.pop(key, None)


class StubBackend:
    def __init__(self, client: StubRedis) -> None:
        self.client = client

    def get_key_for_task(self, task_id: str) -> str:
        return f"celery-task-meta-{task_id}"

    def decode(self, raw: bytes) -> Any:
        return json.loads(raw)


@pytest.fixture()
def stubbed() -> Iterator[tuple[CeleryExecutor, StubRedis]]:
    executor = CeleryExecutor(SETTINGS)
    client = StubRedis()
    executor.collector.backend = StubBackend(client)
    executor.fleet_census._depth_client = client
    yield executor, client
    executor.close()


def test_queue_depth_sums_kombu_priority_lists(stubbed: Any) -> None:
    executor, client = stubbed
    client.lists.update({"cpu": 4, "cpu\x06\x163": 2, "cpu\x06\x169": 1, "judges": 5,
                         "sandbox\x06\x166": 3, "other": 100})
    depths = executor.queue_depths()
    assert depths == {"cpu": 7, "sandbox": 3, "gpu": 0, "judges": 5}
    [commands] = client.executed  # one pipeline for every queue
    assert len(commands) == 16 and {c[0] for c in commands} == {"llen"}


def test_queue_depth_needs_a_redis_broker() -> None:
    executor = CeleryExecutor(Settings(broker_url="amqp://guest@127.0.0.1:1//",
                                       result_backend="redis://127.0.0.1:1/0"))
    try:
        assert executor.queue_depths() is None
    finally:
        executor.close()


def test_workers_by_queue_reuses_a_fresh_census(stubbed: Any, monkeypatch: Any) -> None:
    executor, _ = stubbed
    taken = []

    def take_census() -> None:
        time.sleep(0.05)
        taken.append(1)
        executor.fleet_census._taken_at = time.monotonic()

    monkeypatch.setattr(executor.fleet_census, "take", take_census)
    executor.fleet_census._taken_at = time.monotonic()
    assert executor.workers_by_queue() is None  # none taken yet
    executor.fleet_census._report = {"workers": 2, "workers_by_queue": {"cpu": 2, "gpu": 1}}
    for _ in range(5):
        assert executor.workers_by_queue() == {"cpu": 2, "sandbox": 0, "gpu": 1, "judges": 0}
    assert taken == []  # fresh: no broadcast per scrape
    executor.fleet_census._taken_at = time.monotonic() - 60  # stale: one census in the background
    executor.workers_by_queue()
    executor.workers_by_queue()
    executor.fleet_census._job.result(timeout=5)
    assert taken == [1]


def meta(status: str, result: Any) -> bytes:
    return json.dumps({"status": status, "result": result, "task_id": "x"}).encode()


def item(reward: float) -> dict[str, Any]:
    return {"outcome": {"ok": True, "reward": reward}, "elapsed_s": 0.001}


async def test_task_metrics_of_a_batch_with_a_replay_and_a_redelivery(stubbed: Any,
                                                                     monkeypatch: Any) -> None:
    """A group task that fails as a whole is replayed sample by sample; a one-sample task
    was redelivered twice after its worker died. The stub 'worker' answers every publish."""
    executor, client = stubbed
    monkeypatch.setattr("rewardd.workers.collector.POLL_MIN_S", 0.001)
    group = VerifyCall("math", (Sample("a"), Sample("b")), {"answer": "1"}, {}, 1.0)
    single = VerifyCall("judge", (Sample("c"),), {}, {}, 1.0)
    published: list[tuple[str, Pack]] = []

    def publish(jobs: list[tuple[str, Pack]], flows: Any = None) -> dict[str, Exception]:
        for task_id, pack in jobs:
            published.append((task_id, pack))
            call = pack.parts[0].call
            key = f"celery-task-meta-{task_id}"
            if call is group:  # the group task dies as a whole
                client.values[key] = meta("FAILURE", {"exc_type": "TimeLimitExceeded",
                                                      "exc_message": ["killed"]})
            else:
                client.values[key] = meta("SUCCESS", [item(1.0)])
            if call is single:
                client.hashes[f"rewardd-deliveries-{task_id}"] = {"redeliveries": b"2"}
        return {}

    monkeypatch.setattr(executor.publisher, "publish", publish)

    def counters() -> dict[str, float]:
        return {
            "replay": value("rewardd_task_retries_total", queue="cpu", reason="replay"),
            "lost": value("rewardd_task_retries_total", queue="judges", reason="worker_lost"),
            "cpu_ok": value("rewardd_tasks_total", queue="cpu", state="success"),
            "cpu_failed": value("rewardd_tasks_total", queue="cpu", state="failure"),
            "judges_ok": value("rewardd_tasks_total", queue="judges", state="success"),
            "math_n": value("rewardd_task_duration_seconds_count", queue="cpu", verifier="math"),
            "judge_n": value("rewardd_task_duration_seconds_count", queue="judges",
                             verifier="judge"),
        }

    before = counters()
    results = await asyncio.wait_for(executor.run([group, single]), 10)
    assert [r.replayed for r in results] == [True, False]
    assert [i.outcome.reward for r in results for i in r.items] == [1.0, 1.0, 1.0]
    assert len(published) == 4  # group, single, then the group's two samples
    after = counters()
    delta = {key: after[key] - before[key] for key in before}
    assert delta == {"replay": 1, "lost": 2, "cpu_ok": 2, "cpu_failed": 1, "judges_ok": 1,
                     "math_n": 3, "judge_n": 1}
    assert not client.values and not client.hashes  # read results and counters deleted


async def test_unreachable_broker_and_deadline_are_counted(stubbed: Any,
                                                           monkeypatch: Any) -> None:
    executor, client = stubbed
    call = VerifyCall("math", (Sample("a"),), {}, {}, 1.0)
    monkeypatch.setattr(executor.publisher, "publish",
                        lambda jobs, flows=None: {task_id: OSError("no route")
                                                 for task_id, _ in jobs})
    before = value("rewardd_tasks_total", queue="cpu", state="unavailable")
    [result] = await executor.run([call])
    assert result.items[0].outcome.error.value == "unavailable"
    assert value("rewardd_tasks_total", queue="cpu", state="unavailable") - before == 1

    # a waiter past its deadline settles as expired
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    before = value("rewardd_tasks_total", queue="cpu", state="expired")
    executor.collector.watch("late", future, time.monotonic() - 1, lambda m: m, "cpu", "math",
                             time.monotonic())
    await asyncio.wait_for(future, 5)
    assert value("rewardd_tasks_total", queue="cpu", state="expired") - before == 1
    assert isinstance(executor.collector.waiters, dict) and not executor.collector.waiters


def test_pings_are_not_counted(stubbed: Any) -> None:
    executor, client = stubbed
    before = value("rewardd_tasks_total", queue="cpu", state="success")
    waiter = Waiter("celery-task-meta-p", None, 0.0, lambda m: m)  # type: ignore[arg-type]
    client.values["celery-task-meta-p"] = meta("SUCCESS", {"pong": "pong"})
    [(task_id, settled)] = executor.collector._fetch([("p", waiter)])
    assert task_id == "p" and settled["status"] == "SUCCESS"
    assert value("rewardd_tasks_total", queue="cpu", state="success") == before


# ---- publishing in pipelines -----------------------------------------------------------------

class StubProducer:
    """Records what is published inside and outside publish batches; the batch fails at
    its flush when ``fail_flush``."""

    def __init__(self, fail_flush: bool) -> None:
        self.fail_flush = fail_flush
        self.in_batch = False
        self.flushed: list[list[str]] = []
        self.immediate: list[str] = []
        self.buffer: list[str] = []

    def batch(self, max_size: int) -> Any:
        producer = self

        class Batch:
            def __enter__(self) -> None:
                producer.in_batch, producer.buffer = True, []

            def __exit__(self, *exc: Any) -> None:
                producer.in_batch = False
                if producer.fail_flush:
                    raise ConnectionError("pipeline failed")
                producer.flushed.append(producer.buffer)

        return Batch()


class StubApp:
    def __init__(self, producer: StubProducer, real: Any) -> None:
        self.producer, self.real = producer, real

    def producer_or_acquire(self) -> Any:
        import contextlib
        return contextlib.nullcontext(self.producer)

    def close(self) -> None:
        self.real.close()


class StubTask:
    def __init__(self, producer: StubProducer, bad: set[str]) -> None:
        self.producer, self.bad = producer, bad

    def apply_async(self, task_id: str, producer: Any, **options: Any) -> None:
        if task_id in self.bad:
            raise TypeError("not JSON serializable")
        (self.producer.buffer if self.producer.in_batch else self.producer.immediate).append(
            task_id)


@pytest.mark.parametrize("fail_flush", [False, True])
def test_publishing_in_pipelines(monkeypatch: Any, fail_flush: bool) -> None:
    executor = CeleryExecutor(SETTINGS)
    producer = StubProducer(fail_flush)
    executor.publisher.app = StubApp(producer, executor.app)
    executor.publisher._verify = StubTask(producer, bad={"t5"})
    monkeypatch.setattr("rewardd.workers.publisher.PIPELINE_SIZE", 4)
    call = VerifyCall("math", (Sample("1"),), {}, {}, 1.0)
    jobs = [(f"t{i}", call) for i in range(10)]
    try:
        errors = executor.publisher.publish(jobs)
    finally:
        executor.close()
    assert list(errors) == ["t5"] and isinstance(errors["t5"], TypeError)
    if fail_flush:  # every pipeline failed: each of its calls sent again on its own
        assert producer.flushed == []
        assert producer.immediate == [f"t{i}" for i in range(10) if i != 5]
    else:  # three pipelines of at most 4, nothing sent outside them
        assert producer.flushed == [["t0", "t1", "t2", "t3"], ["t4", "t6", "t7"], ["t8", "t9"]]
        assert producer.immediate == []


class HalfwayCancelledExecutor(RefusingExecutor):
    """Settles the first call (a judge group that was asked), then the batch is cancelled."""

    kind = "halfway"

    async def run(self, calls: Any, progress: Any = None, on_call_done: Any = None) -> Any:
        usage = {"backend": "b", "model": "m", "calls": 5, "prompt_tokens": 11}
        if on_call_done is not None:
            on_call_done(0, CallResult([ItemResult(Outcome.success(1.0, judge=usage), 0.1)]))
        raise asyncio.CancelledError


def test_judge_calls_of_a_batch_cancelled_midway_are_counted() -> None:
    from rewardd.service.pipeline import run_calls

    labels = {"verifier": "halfway-test", "backend": "b", "model": "m"}
    before = value("rewardd_judge_calls_total", result="answered", **labels)
    calls = [VerifyCall("halfway-test", (Sample("a"),), {}, {}, 1.0) for _ in range(3)]
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run_calls(calls, HalfwayCancelledExecutor()))
    assert value("rewardd_judge_calls_total", result="answered", **labels) - before == 5
