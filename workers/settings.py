"""What a verifier worker needs to know: the executors' and the Celery layer's settings.

They live here, below the service, because ``workers/`` runs them without the API (``rewardd
worker``) and must not import the service: :class:`rewardd.service.settings.Settings`
extends this class with the API's own knobs, and every process reads one object of it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from rewardd.verifiers.code.settings import SandboxSettings
from rewardd.verifiers.judge.settings import JudgeSettings
from rewardd.workers.cpus import usable_cpus


POOL_PER_CPU = 4
"""Most embedded verifier processes per usable CPU (REWARDD_POOL_SIZE)."""
MIN_POOL_LIMIT = 8
"""REWARDD_POOL_SIZE may always be this large, however few the CPUs (I/O-bound judges)."""


def max_pool_size() -> int:
    """The largest ``REWARDD_POOL_SIZE`` this process accepts."""
    return max(MIN_POOL_LIMIT, POOL_PER_CPU * usable_cpus())


class WorkerSettings(SandboxSettings, JudgeSettings):
    """The knobs of verifier execution, embedded or over Celery. Descriptions double as the
    CLI help."""

    model_config = SettingsConfigDict(env_prefix="REWARDD_", extra="ignore")

    pool_size: int = Field(
        default_factory=usable_cpus, ge=1, description="Verifier worker processes of the "
        "embedded executor. Default: the CPUs this process may use (its affinity, bounded by "
        "its cgroup's CPU quota; see workers/cpus.py). At most 4 per such CPU (at least 8 "
        "whatever the CPUs): each is a Python process of about 140 MB, and more only contend "
        "for the CPUs (100,000 never finished starting; 256 on 2 CPUs took minutes). For "
        "more capacity run `rewardd worker` processes on other machines.")
    verifier_timeout_s: float = Field(
        10.0, gt=0, description="Default wall-clock limit of one verifier call, in seconds.")
    max_verifier_timeout_s: float = Field(
        120.0, gt=0, description="Upper bound a request may set with a reward's `timeout_s`.")
    plugins: str = Field(
        "", description="Comma-separated modules imported by the API and every verifier "
        "worker; a plugin calls verifiers.register() to add a verifier kind.")
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        "info", description="Log level of the server and the workers: debug, info, warning, "
        "error or critical.")
    log_format: Literal["text", "json"] = Field(
        "text", description="`json`: one JSON object per log line, with request, job, task "
        "and tenant ids where known (for log collectors); `text`: human-readable lines.")
    worker_metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of a `rewardd worker`'s Prometheus exporter "
        "(/metrics: tasks, durations, sandbox verdicts, memory per process); 0 binds a free "
        "port (logged). Unset: no exporter.")
    worker_metrics_host: str = Field(
        "0.0.0.0", description="Address the worker's exporter binds to.")

    broker_url: str | None = Field(
        None, description="Celery broker, e.g. redis://127.0.0.1:6379/0. Unset: verifiers run "
        "in the embedded process pool and no Redis is needed. Set: the API publishes verifier "
        "calls to queues served by `rewardd worker` processes.")
    result_backend: str | None = Field(
        None, description="Where workers store call results (Redis). Default: the broker URL.")
    result_ttl_s: int = Field(
        3600, ge=1, description="Results expire in the result backend this long after they are "
        "stored, even if nobody reads them (the API deletes those it reads at once).")
    visibility_timeout_s: float = Field(
        900.0, gt=0, description="Seconds a delivered, unacknowledged call may run before the "
        "broker hands it to another worker (how long the loss of a whole worker machine goes "
        "unnoticed). Groups are split so that no task can outlive it; it must exceed the time "
        "limit of one sample at REWARDD_MAX_VERIFIER_TIMEOUT_S.")
    task_max_samples: int = Field(
        64, ge=1, description="Most samples one Celery task carries: larger groups (or groups "
        "whose limits add up past the visibility timeout) are split, and small groups are "
        "packed together up to it when a batch has many more groups than the workers have "
        "slots.")
    dispatch_window: int | None = Field(
        None, ge=0, description="Most tasks of one Celery queue in the broker at once; the "
        "others wait in the API's fair queue, where every request gets an equal share of the "
        "workers. Unset: 2 per worker slot of the queue at the last worker census (8 before "
        "the first). 0: no bound (every task is published at once, first come, first "
        "served).")
    worker_lost_retries: int = Field(
        1, ge=0, description="Times a call whose worker process died is sent again before it "
        "is reported `crashed` (a group: replayed one sample per call).")
    queue_timeout_s: float = Field(
        3600.0, gt=0, description="Longest a call may wait in a queue for a worker; later it "
        "expires unrun and its samples are reported `unavailable`.")
    worker_heartbeat_s: float = Field(
        1.0, gt=0, description="Seconds between a `rewardd worker`'s heartbeats in Redis (its "
        "queues and the tasks it holds; see workers/liveness.py).")
    worker_lost_after_s: float = Field(
        6.0, gt=0, description="A worker whose last heartbeat is older than this is dead: the "
        "tasks it held go back on their queues at once instead of after "
        "REWARDD_VISIBILITY_TIMEOUT_S, and it no longer counts as a consumer of its queues. "
        "Also the wait before the API republishes tasks Redis lost. Keep it several "
        "heartbeats long.")
    no_consumer_grace_s: float = Field(
        10.0, ge=0, description="A call for a queue that no live worker consumes fails as "
        "`unavailable` after this long, instead of waiting up to REWARDD_QUEUE_TIMEOUT_S.")
    ready_queues: str = Field(
        "cpu", description="Comma-separated queues that need a live consumer for /readyz to "
        "answer 200 (it reports every routed queue's consumers either way).")
    queue_routes: str = Field(
        "", description="Extra verifier-to-queue routes, `name=queue,...` (e.g. "
        "`my_judge=gpu`); verifiers not named here or built in go to the `cpu` queue.")
    worker_queues: str = Field(
        "cpu", description="Comma-separated queues a `rewardd worker` consumes (cpu, sandbox, "
        "gpu or a custom one).")
    worker_concurrency: int = Field(
        default_factory=usable_cpus, ge=1,
        description="Prefork child processes of a `rewardd worker` (verifier calls it runs at "
        "once). Default: the CPUs the worker may use (its affinity, bounded by its cgroup's "
        "CPU quota).")

    allow_unknown: str = Field(
        "", description="`REWARDD_*` variables that are not settings but are set on purpose "
        "(comma-separated names), or `1` for any: without it an unknown `REWARDD_*` variable "
        "stops `rewardd serve`, `worker` and `score` at start, naming the nearest setting.")

    @field_validator("pool_size")
    @classmethod
    def _pool_fits_the_cpus(cls, value: int) -> int:
        limit = max_pool_size()
        if value > limit:
            raise ValueError(f"at most {limit} here ({POOL_PER_CPU} per CPU this process may "
                             f"use, at least {MIN_POOL_LIMIT}): more verifier processes only "
                             "contend for the CPUs and take memory; for more capacity run "
                             "`rewardd worker` processes (REWARDD_BROKER_URL)")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_timeout_within_its_maximum(self) -> "WorkerSettings":
        """A default above the maximum was clamped to it silently: the operator asked for a
        limit the service would not apply. Refused when the settings are read."""
        if self.verifier_timeout_s > self.max_verifier_timeout_s:
            raise ValueError(
                f"REWARDD_VERIFIER_TIMEOUT_S={self.verifier_timeout_s:g} is above "
                f"REWARDD_MAX_VERIFIER_TIMEOUT_S={self.max_verifier_timeout_s:g}: raise the "
                "maximum or lower the default")
        return self

    @property
    def plugin_modules(self) -> list[str]:
        return [name.strip() for name in self.plugins.split(",") if name.strip()]

    @property
    def result_backend_url(self) -> str | None:
        """The result backend: REWARDD_RESULT_BACKEND, else the broker."""
        return self.result_backend or self.broker_url

    @property
    def worker_queue_names(self) -> list[str]:
        return [name.strip() for name in self.worker_queues.split(",") if name.strip()]
