"""Prometheus metrics: HTTP traffic, verifier outcomes, per-batch reward/advantage summaries,
and distributed execution (Celery tasks, queues, workers) and jobs.

Metric names are part of the operational contract (dashboards scrape them); add, never
rename. With several uvicorn workers, ``rewardd serve`` points prometheus-client's
multiprocess mode at a shared directory so /metrics aggregates every worker.

Two kinds of metric:

* recorded as things happen (counters, histograms, the batch gauges): module-level objects
  below, aggregated over processes in multiprocess mode;
* read at scrape time (:class:`ScrapeCollector`): queue depth from the broker, worker count
  from the executor's census, jobs by state from the function the jobs store registered
  (:func:`register_job_counter`). They describe shared state (Redis), so the process that
  answers the scrape reports them, in multiprocess mode too.

Labels take operator-known values only: route templates, verifier names (registered), outcome
kinds, configured judge backends and models, configured tenants (``tenant``: the tenant the
request's API key belongs to, ``default`` without keys, ``none`` for a request that named no
valid key, such as a 401 or a probe). A string a request chose never becomes a label
value: each distinct value is a new series that every scrape carries and Prometheus keeps for
its retention, so one tenant sending 10^5 model names would grow the scrape and the TSDB
without bound. A judge model the request chose is labelled ``request`` (the workers mark it,
:data:`~rewardd.verifiers.judge.backend.REQUEST_MODEL`), an HTTP method outside the standard
ones ``other``. As a last guard against a verifier (a plugin, an older worker) that reports
request strings anyway, each judge label keeps at most :data:`MAX_LABEL_VALUES` distinct
values per process and folds the rest into ``other`` (:class:`BoundedLabel`; a bound,
rather than dropping the observation, keeps calls, tokens and cost counted in full).

Series read from a source that can fail (the broker, the worker census, the job store) stay
present when it does: ``rewardd_workers`` reads 0 for every routed queue when the census
fails, and ``rewardd_metrics_source_up{source}`` says which source answered, so an alert on
``rewardd_workers == 0`` fires instead of going silent. Queue depth, queue age and
unacknowledged tasks describe the shared broker: every API pod reports the same values, read
them with ``max by (queue)``, never ``sum``. Calls pending in the fair queue are per API
process: ``sum`` them.

/metrics itself is guarded with the API keys (see
:func:`rewardd.service.api.deps.metrics_access`): the series describe every tenant's traffic.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest, multiprocess)
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric

# recorded by the Celery executor; defined below the service, exposed here with the rest
from rewardd.service.asgi import HttpMiddleware
from rewardd.workers.broker_probe import BrokerProbe, probe_for
from rewardd.workers.metrics import (LATENCY_BUCKETS, TASK_DURATION, TASK_RETRIES,  # noqa: F401
                                     TASKS, set_build_info)

log = logging.getLogger(__name__)


HTTP_REQUESTS = Counter("rewardd_http_requests_total",
                        "HTTP requests by route, status and tenant.",
                        ["route", "method", "status", "tenant"])
HTTP_LATENCY = Histogram("rewardd_http_request_duration_seconds",
                         "HTTP request latency by route, status and tenant.",
                         ["route", "method", "status", "tenant"], buckets=LATENCY_BUCKETS)
HTTP_IN_FLIGHT = Gauge("rewardd_http_requests_in_flight", "HTTP requests being served.",
                       multiprocess_mode="livesum")
VERIFIER_DURATION = Histogram("rewardd_verifier_duration_seconds",
                              "Time inside one verifier call.", ["verifier"],
                              buckets=LATENCY_BUCKETS)
VERIFIER_OUTCOMES = Counter("rewardd_verifier_outcomes_total",
                            "Verifier calls by outcome (ok or the failure kind).",
                            ["verifier", "outcome"])
ROLLOUTS_SCORED = Counter("rewardd_rollouts_scored_total", "Rollouts scored.")
GROUPS_SCORED = Counter("rewardd_groups_scored_total", "Groups scored.")
RECORDS_WRITTEN = Counter("rewardd_records_written_total",
                          "Rollouts written to the run record.")
RECORDS_DROPPED = Counter("rewardd_records_dropped_total",
                          "Rollouts the run record could not keep, by reason (queue_full: "
                          "the database could not keep up or was down; closed: the process "
                          "stopped before writing them; error: a recording bug).",
                          ["reason"])
VERDICT_CACHE = Counter("rewardd_verdict_cache_total",
                        "Checks the verdict cache was asked about, by verifier and result "
                        "(hit: answered from the cache, no verifier ran; miss: checked, "
                        "then kept).", ["verifier", "result"])
CANARIES = Counter("rewardd_canary_total",
                   "Canary probes (docs/canaries.md) by verifier, the group's source, kind "
                   "(accept: a correct verifier gives the full reward; reject: it does not) "
                   "and result (passed, failed).", ["verifier", "source", "kind", "result"])
SENTINEL_ALERTS = Counter("rewardd_sentinel_alerts_total",
                          "Alerts the sentinel raised (docs/sentinel.md), by signal: a run's "
                          "policy may be gaming its reward.", ["signal"])
SESSION_SWEEPS = Counter("rewardd_session_sweeps_total",
                         "Sweeps of the open sessions this API process made (group timeouts, "
                         "idle sessions, a dead pod's work): a sweep's cost is per session, "
                         "never per stored group.")
BATCH_REWARD_MEAN = Gauge("rewardd_batch_reward_mean", "Mean reward of the last batch.",
                          multiprocess_mode="mostrecent")
BATCH_REWARD_STD = Gauge("rewardd_batch_reward_std", "Std of rewards of the last batch.",
                         multiprocess_mode="mostrecent")
BATCH_ADVANTAGE_MEAN = Gauge("rewardd_batch_advantage_mean",
                             "Mean rollout advantage of the last batch.",
                             multiprocess_mode="mostrecent")
BATCH_ADVANTAGE_STD = Gauge("rewardd_batch_advantage_std",
                            "Std of rollout advantages of the last batch.",
                            multiprocess_mode="mostrecent")
BATCH_ZERO_ADVANTAGE = Histogram("rewardd_batch_zero_advantage_fraction",
                                 "Per batch: fraction of rollouts with zero advantage.",
                                 buckets=(0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1))

JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
"""States ``rewardd_jobs`` always reports (0 when none); others the counter returns are added."""

JobCounter = Callable[[], Mapping[str, int]]
_job_counter: JobCounter | None = None
_job_counter_lock = threading.Lock()
BudgetUsage = Callable[[], Mapping[tuple[str, str], int]]
_budget_usage: BudgetUsage | None = None
_stored_usage: BudgetUsage | None = None


OTHER = "other"
"""The label value of every value past a label's bound, and of non-standard HTTP methods."""

MAX_LABEL_VALUES = 64
"""Distinct values a judge label (backend, model) keeps per process before folding into
:data:`OTHER`: far above the backends and models an operator configures, far below what a
client could send. At most 64 x 64 x verifiers x results series per judge metric."""

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods labelled as themselves; any other token a client sends is :data:`OTHER`."""


class BoundedLabel:
    """One label's values, at most ``limit`` distinct per process; later new ones are
    :data:`OTHER`. Thread-safe (observations come from the event loop and worker threads)."""

    def __init__(self, name: str, limit: int = MAX_LABEL_VALUES) -> None:
        self.name = name
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, value: str) -> str:
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
            if not self._warned:
                self._warned = True
                log.warning("metrics: label %r reached %d distinct values; new ones are "
                            "counted as %r (a verifier reports request-chosen strings?)",
                            self.name, self.limit, OTHER)
        return OTHER


JUDGE_BACKEND = BoundedLabel("backend")
JUDGE_MODEL = BoundedLabel("model")
TENANT = BoundedLabel("tenant")
"""Tenants are configured (API keys), so bounded already; the bound guards a key file with
thousands of tenants."""

NO_TENANT = "none"
"""The tenant label of a request that resolved no tenant (401, probes, /metrics)."""

set_build_info("api")


def method_label(method: str) -> str:
    return method if method in HTTP_METHODS else OTHER


def observe_verifier(verifier: str, outcome: str, seconds: float) -> None:
    VERIFIER_DURATION.labels(verifier).observe(seconds)
    VERIFIER_OUTCOMES.labels(verifier, outcome).inc()


JUDGE_CALLS = Counter("rewardd_judge_calls_total",
                      "Judge requests by verifier, backend, model and result (answered, cached, "
                      "failed), counted when the verifier's result reaches the API.",
                      ["verifier", "backend", "model", "result"])
JUDGE_RETRIES = Counter("rewardd_judge_retries_total",
                        "Judge request retries (429, 5xx, timeouts) by backend.",
                        ["verifier", "backend", "model"])
JUDGE_TOKENS = Counter("rewardd_judge_tokens_total", "Judge tokens by kind (prompt, completion).",
                       ["verifier", "backend", "model", "kind"])
JUDGE_COST = Counter("rewardd_judge_cost_usd_total",
                     "Judge cost in USD, from the backend's configured prices.",
                     ["verifier", "backend", "model"])


def observe_judge_usage(verifier: str, usage: Mapping[str, Any]) -> None:
    """Count one outcome's judge usage (``detail["judge"]``). A group-level verifier whose
    calls served the whole group reports the group's usage in each of its ``shared_by``
    outcomes, numbered by ``share_index``; only the first is counted, whole (fractions of
    it would not add back up to whole calls and tokens). Never raises: metrics never break
    a response.

    Labels: the configured backend's name and ``metric_model`` (the configured model, or
    ``request`` for one the request chose), each bounded by :class:`BoundedLabel`; a usage
    without ``metric_model`` (from a worker older than it) is labelled by its ``model``."""
    try:
        if int(usage.get("shared_by") or 1) > 1 and int(usage.get("share_index") or 0) != 0:
            return
        model = usage.get("metric_model", usage.get("model", ""))
        labels = (verifier, JUDGE_BACKEND(str(usage.get("backend", ""))),
                  JUDGE_MODEL(str(model)))
        calls, cached, failed = (int(usage.get(k) or 0) for k in ("calls", "cached", "failed"))
        for result, count in (("answered", calls - cached - failed), ("cached", cached),
                              ("failed", failed)):
            if count > 0:
                JUDGE_CALLS.labels(*labels, result).inc(count)
        if usage.get("retries"):
            JUDGE_RETRIES.labels(*labels).inc(int(usage["retries"]))
        for kind in ("prompt", "completion"):
            tokens = int(usage.get(f"{kind}_tokens") or 0)
            if tokens:
                JUDGE_TOKENS.labels(*labels, kind).inc(tokens)
        if usage.get("cost_usd"):
            JUDGE_COST.labels(*labels).inc(float(usage["cost_usd"]))
    except Exception:
        log.debug("could not record judge usage", exc_info=True)


def observe_batch(summary: dict[str, Any]) -> None:
    """Record one scored batch from its response summary."""
    ROLLOUTS_SCORED.inc(summary["rollouts"])
    GROUPS_SCORED.inc(summary["groups"])
    for gauge, key in ((BATCH_REWARD_MEAN, "reward_mean"), (BATCH_REWARD_STD, "reward_std"),
                       (BATCH_ADVANTAGE_MEAN, "advantage_mean"),
                       (BATCH_ADVANTAGE_STD, "advantage_std")):
        if summary.get(key) is not None:
            gauge.set(summary[key])
    if summary.get("zero_advantage_fraction") is not None:
        BATCH_ZERO_ADVANTAGE.observe(summary["zero_advantage_fraction"])


def register_job_counter(fn: JobCounter | None) -> None:
    """Export ``rewardd_jobs{state}`` from ``fn()`` (job counts by state), called at every
    scrape; None unregisters. ``fn`` is called in the scrape's worker thread, not on the
    event loop: it must be synchronous, thread-safe and quick (one Redis round trip at most).
    If it raises, the scrape goes on without ``rewardd_jobs``."""
    global _job_counter
    with _job_counter_lock:
        _job_counter = fn


def register_budgets(fn: BudgetUsage | None) -> None:
    """Export ``rewardd_tenant_held{tenant,bound}`` from ``fn()`` ((tenant, bound) -> units
    this process holds: :meth:`rewardd.service.budgets.TenantBudgets.usage`), read at every
    scrape; None unregisters."""
    global _budget_usage
    _budget_usage = fn


def register_stored(fn: BudgetUsage | None) -> None:
    """Export ``rewardd_tenant_stored{tenant,bound}`` from ``fn()`` ((tenant, bound) -> units
    the session store keeps: :meth:`rewardd.service.sessions.store.SessionStore.held`; shared
    over pods with Redis), read at every scrape; None unregisters."""
    global _stored_usage
    _stored_usage = fn


class ScrapeCollector:
    """Metrics read when /metrics is scraped.

    * ``rewardd_queue_depth{queue}``: messages waiting in each broker queue, from
      ``executor.queue_depths()`` (the Celery executor: one pipeline of LLENs);
    * ``rewardd_workers{queue}``: workers consuming each queue, from
      ``executor.workers_by_queue()`` (the executor's background census, never a broadcast
      per scrape);
    * ``rewardd_jobs{state}``: from the function given to :func:`register_job_counter`;
    * ``rewardd_tenant_held{tenant,bound}``: what this process holds per tenant against each
      per-tenant bound (:func:`register_budgets`; per process: sum over pods);
    * ``rewardd_tenant_stored{tenant,bound}``: what the session store keeps per tenant
      against its bounds (:func:`register_stored`; shared with Redis: read with max);
    * ``rewardd_queue_oldest_age_seconds{queue}``, ``rewardd_tasks_unacked{queue}`` and
      ``rewardd_tasks_unacked_oldest_age_seconds{queue}``: from the broker
      (:mod:`rewardd.workers.broker_probe`);
    * ``rewardd_calls_pending{queue}`` and ``rewardd_calls_in_broker{queue}``: this API
      process's fair queue (tasks waiting for the queue's window, and in it), from
      ``executor.describe()``;
    * ``rewardd_metrics_source_up{source}``: 1 when a source answered this scrape, else 0.

    An executor without those methods (the embedded pool) exports neither queue nor worker
    metrics. A source that fails is logged, never an error of the scrape; its series read 0
    where their label values are known without it (every routed queue), so they stay present.
    """

    def __init__(self, executor: Any = None) -> None:
        self.executor = executor
        self._probe: BrokerProbe | None = None
        self._probe_made = False

    def collect(self) -> Iterator[Metric]:
        up: dict[str, bool] = {}
        queues = list(getattr(getattr(self.executor, "router", None), "queues", None) or [])
        depths = self._read("queue_depths")
        if hasattr(self.executor, "queue_depths"):
            up["queue_depth"] = depths is not None
            yield _per_queue("rewardd_queue_depth",
                             "Messages waiting in each Celery queue of the broker (shared: "
                             "read with max by (queue)).", depths, queues)
        workers = self._read("workers_by_queue")
        if hasattr(self.executor, "workers_by_queue"):
            up["census"] = workers is not None
            yield _per_queue("rewardd_workers",
                             "Celery workers consuming each queue (the executor's census, "
                             "refreshed in the background every few seconds; 0 when the "
                             "census fails, see rewardd_metrics_source_up).", workers, queues)
        yield from self._fair_queue(queues)
        yield from self._broker(queues, up)
        jobs = self._jobs()
        if _job_counter is not None:
            up["jobs"] = jobs is not None
            jobs = jobs if jobs is not None else {}  # the store failed: every state reads 0
        if jobs is not None:
            family = GaugeMetricFamily("rewardd_jobs", "Jobs by state (shared store: read "
                                       "with max by (state)).", labels=["state"])
            for state in [*JOB_STATES, *sorted(set(jobs) - set(JOB_STATES))]:
                family.add_metric([state], jobs.get(state, 0))
            yield family
        usage = _budget_usage
        if usage is not None:
            family = GaugeMetricFamily("rewardd_tenant_held", "Units each tenant holds in this "
                                       "API process against a per-tenant bound (per process: "
                                       "sum over pods).", labels=["tenant", "bound"])
            for (tenant, bound), held in sorted(usage().items()):
                family.add_metric([tenant, bound], held)
            yield family
        yield from self._stored(up)
        family = GaugeMetricFamily("rewardd_metrics_source_up",
                                   "1 when the source answered this scrape, 0 when it failed "
                                   "(its series then read 0).", labels=["source"])
        for source, ok in sorted(up.items()):
            family.add_metric([source], 1.0 if ok else 0.0)
        yield family

    @staticmethod
    def _stored(up: dict[str, bool]) -> Iterator[Metric]:
        stored = _stored_usage
        if stored is None:
            return
        try:
            values = stored()
        except Exception:
            log.warning("metrics: the session store's counts could not be read", exc_info=True)
            up["session_store"] = False
            return
        up["session_store"] = True
        family = GaugeMetricFamily("rewardd_tenant_stored", "Units of each per-tenant bound "
                                   "of the session store (groups, bytes, retained ended "
                                   "sessions) each tenant holds (shared store: read with max "
                                   "by (tenant, bound)).", labels=["tenant", "bound"])
        for (tenant, bound), held in sorted(values.items()):
            family.add_metric([tenant, bound], held)
        yield family

    def _fair_queue(self, queues: list[str]) -> Iterator[Metric]:
        describe = getattr(self.executor, "describe", None)
        if describe is None or not queues:
            return
        try:
            stats = describe().get("fair_queue") or {}
        except Exception:
            log.warning("metrics: the executor's fair queue could not be read", exc_info=True)
            stats = {}
        for name, key, text in (
                ("rewardd_calls_pending", "waiting_calls",
                 "Tasks of this API process waiting in its fair queue for the queue's window "
                 "(per process: sum over pods)."),
                ("rewardd_calls_in_broker", "running_calls",
                 "Tasks of this API process published and not yet settled (per process: sum "
                 "over pods).")):
            yield _per_queue(name, text, {q: int(s.get(key, 0)) for q, s in stats.items()},
                             queues)

    def _broker(self, queues: list[str], up: dict[str, bool]) -> Iterator[Metric]:
        if not self._probe_made:
            self._probe_made = True
            try:
                self._probe = probe_for(self.executor)
            except Exception:
                log.warning("metrics: no broker probe", exc_info=True)
        if self._probe is None:
            return
        try:
            ages = self._probe.oldest_age()
            unacked, unacked_ages = self._probe.unacked()
            up["broker"] = True
        except Exception:
            log.warning("metrics: the broker could not be read; its series read 0",
                        exc_info=True)
            ages = unacked = unacked_ages = None
            up["broker"] = False
        yield _per_queue("rewardd_queue_oldest_age_seconds",
                         "Seconds the oldest message of each queue has waited for a worker "
                         "(shared: read with max by (queue)).", ages, queues)
        yield _per_queue("rewardd_tasks_unacked",
                         "Tasks delivered to a worker and not yet acknowledged (running, or "
                         "held by a worker that died until the visibility timeout "
                         "redelivers them; shared: read with max by (queue)).", unacked,
                         queues)
        yield _per_queue("rewardd_tasks_unacked_oldest_age_seconds",
                         "Seconds since the oldest unacknowledged task of each queue was "
                         "delivered (shared: read with max by (queue)).", unacked_ages, queues)

    def _read(self, method: str) -> Mapping[str, int] | None:
        fn = getattr(self.executor, method, None)
        if fn is None:
            return None
        try:
            return fn()
        except Exception:
            log.warning("metrics: %s failed; not exported in this scrape", method, exc_info=True)
            return None

    @staticmethod
    def _jobs() -> Mapping[str, int] | None:
        fn = _job_counter
        if fn is None:
            return None
        try:
            counts = fn()
            return {str(state): int(n) for state, n in dict(counts).items()}
        except Exception:
            log.warning("metrics: the job counter failed; rewardd_jobs not exported in this "
                        "scrape", exc_info=True)
            return None


def _per_queue(name: str, text: str, values: Mapping[str, float] | None,
               queues: Iterable[str]) -> GaugeMetricFamily:
    """A gauge family with every routed queue (0 unless ``values`` says otherwise), plus any
    queue ``values`` names (a worker's custom queue)."""
    merged = dict.fromkeys(queues, 0.0)
    merged.update(values or {})
    family = GaugeMetricFamily(name, text, labels=["queue"])
    for queue, value in sorted(merged.items()):
        family.add_metric([queue], value)
    return family


def tenant_label(scope: Mapping[str, Any]) -> str:
    """The ``tenant`` label of a request once served: the tenant its API key resolved to
    (:func:`rewardd.service.api.deps.current_tenant` keeps it in the request state), else
    :data:`NO_TENANT`."""
    tenant = (scope.get("state") or {}).get("tenant")
    name = getattr(tenant, "name", None)
    return TENANT(name) if name else NO_TENANT


class _Collectors:
    """Several collectors as one, for :func:`generate_latest`."""

    def __init__(self, collectors: Iterable[Any]) -> None:
        self.collectors = list(collectors)

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


def render(multiproc_dir: str | None, executor: Any = None) -> tuple[bytes, str]:
    """The exposition text: the recorded metrics (aggregated over worker processes in
    multiprocess mode) and the scrape-time ones (:class:`ScrapeCollector`, for
    ``executor``). Blocking (reads Redis): call it off the event loop."""
    if multiproc_dir:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiproc_dir)
        recorded: Any = registry
    else:
        recorded = DEFAULT_REGISTRY
    return generate_latest(_Collectors([recorded, ScrapeCollector(executor)])), \
        CONTENT_TYPE_LATEST


class MetricsMiddleware(HttpMiddleware):
    """Count and time every HTTP request by route template, status and tenant.

    The route template (``/v1/verify/{verifier}``), not the raw path, is the label, and a
    method outside :data:`HTTP_METHODS` is ``other``, so label cardinality stays bounded.
    """

    async def http(self, scope: dict, receive: Any, send: Any) -> None:
        status = 500
        started = time.perf_counter()

        async def send_with_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        HTTP_IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            HTTP_IN_FLIGHT.dec()
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            method = method_label(scope["method"])
            tenant = tenant_label(scope)
            HTTP_REQUESTS.labels(label, method, str(status), tenant).inc()
            HTTP_LATENCY.labels(label, method, str(status), tenant).observe(elapsed)


__all__ = ["MetricsMiddleware", "ScrapeCollector", "observe_batch", "observe_verifier",
           "register_job_counter", "render"]


def count_records_dropped(reason: str, count: int) -> None:
    RECORDS_DROPPED.labels(reason).inc(count)


def count_verdict_cache(verifier: str, hits: int, misses: int) -> None:
    if hits:
        VERDICT_CACHE.labels(verifier, "hit").inc(hits)
    if misses:
        VERDICT_CACHE.labels(verifier, "miss").inc(misses)


def count_canary(verifier: str, source: str, kind: str, result: str) -> None:
    CANARIES.labels(verifier, source, kind, result).inc()


def count_sentinel_alert(signal: str) -> None:
    SENTINEL_ALERTS.labels(signal).inc()


def count_records_written(count: int) -> None:
    RECORDS_WRITTEN.inc(count)
