"""Metrics of a ``rewardd worker``: an HTTP exporter on REWARDD_WORKER_METRICS_PORT.

Design: each worker serves its own /metrics (a small HTTP port, prometheus_client's
``start_http_server`` in a thread of the worker's main process), and its prefork children
record into prometheus_client's multiprocess files, which that server aggregates. Rejected:
aggregating through Redis (every task would pay a round trip or a batching thread of its
own, a worker that lost Redis would also lose its metrics, and Prometheus could not tell one
worker from another, which is what "worker absent" and per-process memory need). The cost:
one port per worker pod (Prometheus discovers pods; Helm and compose set it) and a directory
of small mmap files per worker (removed when it exits; a child's files stay until then).

What is recorded, in the child that runs the task (Celery signals):

* ``rewardd_worker_tasks_total{queue,verifier,state}``: tasks run (success, failure,
  abandoned: a redelivery past its budget);
* ``rewardd_worker_task_duration_seconds{queue,verifier}``: the task's run time;
* ``rewardd_worker_queue_wait_seconds{queue}``: publication to start (publication = the
  task's ``expires`` minus REWARDD_QUEUE_TIMEOUT_S, as the broker probe reads it);
* ``rewardd_worker_outcomes_total{queue,verifier,outcome}``: per sample, ``ok`` or the
  failure kind;
* ``rewardd_sandbox_verdicts_total{verdict}`` and ``rewardd_sandbox_runs_total{level}``:
  per test of a code sample, its verdict class, and the isolation level it ran under;
* ``rewardd_worker_process_resident_bytes{pid}``: resident memory per process (the main
  process and each child, after each task);

and in the main process: ``rewardd_model_load_seconds{verifier}`` (each verifier's warm-up:
grammars, models), ``rewardd_sandbox_isolation{level}`` (1 for the level the sandbox reaches
on this worker, when it serves the code verifier) and ``rewardd_build_info{role="worker"}``.

Labels take known values only: queues are configured, verifiers registered, outcomes are
failure kinds, verdicts a fixed set (others ``other``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from rewardd.verifiers.code.runtimes import isolation

log = logging.getLogger(__name__)

VERDICTS = frozenset({"passed", "failed", "partial", "wrong_answer", "runtime_error", "timeout",
                      "memory_exceeded", "output_limit", "compile_error", "not_run", "checking"})
"""Verdict classes of a code sample's tests labelled as themselves; anything else is
``other``."""

_metrics: Any = None
_started: dict[str, float] = {}


def start(port: int | None, host: str, queue_timeout_s: float) -> int | None:
    """In the worker's main process, before the pool forks: switch prometheus_client to
    multiprocess mode in a fresh directory, serve /metrics on ``port`` (0: any free port)
    and connect the task signals. Returns the bound port (None: ``port`` unset, nothing
    started). Must run before any metric of the worker records a value."""
    global _metrics
    if port is None:
        return None
    path = tempfile.mkdtemp(prefix="rewardd-worker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server, values

    values.ValueClass = values.MultiProcessValue()  # also when prometheus_client came first
    _metrics = _WorkerMetrics(queue_timeout_s)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    server, _ = start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]
    _connect_signals()
    import atexit

    atexit.register(shutil.rmtree, path, ignore_errors=True)
    _metrics.resident()
    log.info("worker metrics on http://%s:%d/metrics", host, bound)
    return bound


def timed_warm_up(name: str, verifier: Any) -> None:
    """``verifier.warm_up()``, its duration recorded as ``rewardd_model_load_seconds``
    (when the exporter runs)."""
    began = time.perf_counter()
    verifier.warm_up()
    if _metrics is not None:
        _metrics.model_load.labels(name).set(time.perf_counter() - began)
        if name == "code":
            _metrics.sandbox_level()


class _WorkerMetrics:
    """The worker's metric objects, made once multiprocess mode is on."""

    def __init__(self, queue_timeout_s: float) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        from rewardd.workers.metrics import TASK_BUCKETS, set_build_info

        self.queue_timeout_s = queue_timeout_s
        self.tasks = Counter("rewardd_worker_tasks_total", "Tasks this worker ran, by state.",
                             ["queue", "verifier", "state"])
        self.duration = Histogram("rewardd_worker_task_duration_seconds",
                                  "Run time of a task in a worker child.",
                                  ["queue", "verifier"], buckets=TASK_BUCKETS)
        self.wait = Histogram("rewardd_worker_queue_wait_seconds",
                              "From publication to a worker starting the task.", ["queue"],
                              buckets=TASK_BUCKETS)
        self.outcomes = Counter("rewardd_worker_outcomes_total",
                                "Samples checked, by outcome (ok or the failure kind).",
                                ["queue", "verifier", "outcome"])
        self.verdicts = Counter("rewardd_sandbox_verdicts_total",
                                "Tests of code samples, by verdict class.", ["verdict"])
        self.runs = Counter("rewardd_sandbox_runs_total",
                            "Code samples run in the sandbox, by isolation level.", ["level"])
        self.memory = Gauge("rewardd_worker_process_resident_bytes",
                            "Resident memory of each worker process (main and children).",
                            multiprocess_mode="liveall")
        self.model_load = Gauge("rewardd_model_load_seconds",
                                "Warm-up time of each verifier this worker serves (grammars, "
                                "models), at start.", ["verifier"], multiprocess_mode="max")
        self.isolation = Gauge("rewardd_sandbox_isolation",
                               "1 for the isolation level the code sandbox reaches on this "
                               "worker (full, namespaces, none).", ["level"],
                               multiprocess_mode="max")
        set_build_info("worker")

    def resident(self) -> None:
        self.memory.set(_resident_bytes())

    def sandbox_level(self) -> None:
        level = isolation().level
        for name in ("full", "namespaces", "none"):
            self.isolation.labels(name).set(1.0 if name == level else 0.0)

    def task_started(self, task_id: str, request: Any) -> None:
        _started[task_id] = time.perf_counter()
        expires = getattr(request, "expires", None)
        if not expires:
            return
        try:
            at = expires if isinstance(expires, datetime) else datetime.fromisoformat(expires)
            if at.tzinfo is None:
                at = at.replace(tzinfo=timezone.utc)
        except (TypeError, ValueError):
            return
        waited = time.time() - (at.timestamp() - self.queue_timeout_s)
        self.wait.labels(_queue(request)).observe(max(waited, 0.0))

    def task_finished(self, task_id: str, request: Any, args: Any, state: str,
                      result: Any) -> None:
        began = _started.pop(task_id, None)
        queue, verifier = _queue(request), _verifier(args)
        self.tasks.labels(queue, verifier, state).inc()
        if began is not None:
            self.duration.labels(queue, verifier).observe(time.perf_counter() - began)
        if isinstance(result, list):
            self._outcomes(queue, verifier, result)
        self.resident()

    def _outcomes(self, queue: str, verifier: str, items: Iterable[Any]) -> None:
        for item in items:
            outcome = item.get("outcome") if isinstance(item, Mapping) else None
            if not isinstance(outcome, Mapping):
                continue
            self.outcomes.labels(queue, verifier, str(outcome.get("error") or "ok")).inc()
            detail = outcome.get("detail") or {}
            if not isinstance(detail, Mapping) or "isolation" not in detail:
                continue
            self.runs.labels(str(detail["isolation"])).inc()
            for test in detail.get("tests") or ():
                verdict = test.get("verdict") if isinstance(test, Mapping) else None
                self.verdicts.labels(verdict if verdict in VERDICTS else "other").inc()


def _queue(request: Any) -> str:
    info = getattr(request, "delivery_info", None) or {}
    return str(info.get("routing_key") or "unknown")


def _verifier(args: Any) -> str:
    return str(args[0]) if args and isinstance(args[0], str) else "none"


def _resident_bytes() -> float:
    """Resident set size of this process, from /proc (Linux); else the peak (getrusage)."""
    try:
        with open("/proc/self/statm") as statm:
            return float(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        import resource

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _connect_signals() -> None:
    from celery import signals

    def prerun(task_id: str = "", task: Any = None, **_: Any) -> None:
        if _metrics is not None and task is not None:
            _metrics.task_started(task_id, task.request)

    def postrun(task_id: str = "", task: Any = None, args: Any = None, retval: Any = None,
                state: str | None = None, **_: Any) -> None:
        if _metrics is None or task is None:
            return
        name = "abandoned" if type(retval).__name__ == "CallAbandoned" else \
            (state or "unknown").lower()
        _metrics.task_finished(task_id, task.request, args, name, retval)

    def child_exit(pid: int | None = None, **_: Any) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())

    def child_init(**_: Any) -> None:
        if _metrics is not None:
            _metrics.resident()

    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)
    signals.worker_process_init.connect(child_init, weak=False)
    signals.worker_process_shutdown.connect(child_exit, weak=False)
