"""Configuration: one settings object read from ``REWARDD_*`` environment variables.

The CLI mirrors these as flags (``rewardd serve --port 9000`` overrides ``REWARDD_PORT``);
nothing else in the code base reads the environment.
"""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of a rewardd process. Field descriptions double as the CLI help."""

    model_config = SettingsConfigDict(env_prefix="REWARDD_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address the API server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API server listens on.")
    workers: int = Field(1, ge=1, description="Uvicorn worker processes for `rewardd serve`.")
    pool_size: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1),
        ge=1, description="Verifier worker processes of the embedded executor.")
    verifier_timeout_s: float = Field(
        10.0, gt=0, description="Default wall-clock limit of one verifier call, in seconds.")
    max_verifier_timeout_s: float = Field(
        120.0, gt=0, description="Upper bound a request may set with a reward's `timeout_s`.")
    max_body_bytes: int = Field(
        256 * 1024 * 1024, gt=0, description="Largest accepted request body; larger gets 413.")
    run_state_ttl_s: float = Field(
        7 * 24 * 3600, gt=0, description="Run state (difficulty anchors, UCB statistics) "
        "expires this long after the run's last request.")
    torch_threads: int = Field(
        1, ge=1, description="Intra-op threads of torch in the API process. One by default: "
        "advantage tensors of a request are small and extra threads only contend with the "
        "event loop and the verifier workers.")
    plugins: str = Field(
        "", description="Comma-separated modules imported by the API and every verifier "
        "worker; a plugin calls verifiers.register() to add a verifier kind.")
    prometheus_multiproc_dir: str | None = Field(
        None, validation_alias=AliasChoices("REWARDD_PROMETHEUS_MULTIPROC_DIR",
                                            "PROMETHEUS_MULTIPROC_DIR"),
        description="Shared directory for metrics of several server processes "
        "(set by `rewardd serve` when --workers > 1).")
    log_level: str = Field("info", description="Log level of the server.")

    # ---- distributed execution (Celery over Redis); see workers/celery_app.py ----
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
    worker_lost_retries: int = Field(
        1, ge=0, description="Times a call whose worker process died is sent again before it "
        "is reported `crashed` (a group: replayed one sample per call).")
    queue_timeout_s: float = Field(
        3600.0, gt=0, description="Longest a call may wait in a queue for a worker; later it "
        "expires unrun and its samples are reported `unavailable`.")
    queue_routes: str = Field(
        "", description="Extra verifier-to-queue routes, `name=queue,...` (e.g. "
        "`my_judge=gpu`); verifiers not named here or built in go to the `cpu` queue.")
    worker_queues: str = Field(
        "cpu", description="Comma-separated queues a `rewardd worker` consumes (cpu, sandbox, "
        "gpu or a custom one).")
    worker_concurrency: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1), ge=1,
        description="Prefork child processes of a `rewardd worker` (verifier calls it runs at "
        "once).")

    # ---- shared infrastructure: tenants, jobs and state in Redis; see service/tenancy.py ----
    api_keys: str = Field(
        "", description="API keys, `key=tenant,...`. Set (here or in REWARDD_API_KEYS_FILE): "
        "every /v1 request needs `Authorization: Bearer <key>` (else 401), and jobs and run "
        "state are visible only to the key's tenant. Unset: one tenant, `default`, no keys.")
    api_keys_file: str | None = Field(
        None, description='JSON file of tenants, keys and per-tenant limits: {"tenants": '
        '{"name": {"keys": ["..."], "max_concurrent_jobs": 4, "max_body_bytes": 1048576}}}.')
    tenant_max_concurrent_jobs: int = Field(
        16, ge=1, description="Scoring requests and jobs one tenant may have running at once "
        "(across all API pods when state is in Redis); beyond it: 429 with Retry-After.")
    retry_after_s: int = Field(
        2, ge=1, description="Retry-After (seconds) sent with 429 when a tenant is at its "
        "limit of concurrent work.")
    state_url: str | None = Field(
        None, description="Redis for jobs, run state and tenant limits, shared by all API "
        "pods (e.g. redis://127.0.0.1:6379/1). Default: the broker URL; with neither, state "
        "lives in the API process (lost when it restarts).")
    job_ttl_s: int = Field(
        24 * 3600, ge=1, description="A job (its state, progress and result) is kept this "
        "long after it finished; then GET /v1/jobs/{id} answers 404.")

    @property
    def plugin_modules(self) -> list[str]:
        return [name.strip() for name in self.plugins.split(",") if name.strip()]

    @property
    def result_backend_url(self) -> str | None:
        """The result backend: REWARDD_RESULT_BACKEND, else the broker."""
        return self.result_backend or self.broker_url

    @property
    def state_redis_url(self) -> str | None:
        """Where shared state lives: REWARDD_STATE_URL, else the broker (None: in process)."""
        return self.state_url or self.broker_url

    @property
    def worker_queue_names(self) -> list[str]:
        return [name.strip() for name in self.worker_queues.split(",") if name.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
