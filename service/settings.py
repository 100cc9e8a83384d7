"""Configuration: one settings object read from ``REWARDD_*`` environment variables.

The CLI mirrors these as flags (``rewardd serve --port 9000`` overrides ``REWARDD_PORT``);
nothing else in the code base reads the environment.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field

from rewardd.workers.settings import WorkerSettings


class Settings(WorkerSettings):
    """Every knob of a rewardd process: the workers' (:class:`WorkerSettings`) and the API's.
    Field descriptions double as the CLI help."""

    host: str = Field("127.0.0.1", description="Address the API server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API server listens on.")
    workers: int = Field(1, ge=1, description="Uvicorn worker processes for `rewardd serve`.")
    grpc_port: int | None = Field(
        None, ge=0, le=65535, description="Port of the gRPC API (rewardd.v1, the same calls "
        "as /v1), served by the same process and event loop as REST on the same host; unset: "
        "no gRPC. 0 binds a free port.")
    max_body_bytes: int = Field(
        256 * 1024 * 1024, gt=0, description="Largest accepted request body; larger gets 413.")
    max_rollouts_per_request: int = Field(
        65_536, ge=1, description="Most rollouts one /v1/score, /v1/rewards, /v1/advantages, "
        "job or session add may send (more: 422 naming body.groups). It bounds the verifier "
        "and advantage work one request can hold: a 10^5-rollout score kept a 2-worker pool "
        "busy for 20 s. Lower it on shared fleets; trainers split larger batches or submit "
        "several jobs.")
    run_state_ttl_s: float = Field(
        7 * 24 * 3600, gt=0, description="Run state (difficulty anchors, UCB statistics) "
        "expires this long after the run's last request.")
    torch_threads: int = Field(
        1, ge=1, description="Intra-op threads of torch in the API process. One by default: "
        "advantage tensors of a request are small and extra threads only contend with the "
        "event loop and the verifier workers.")
    prometheus_multiproc_dir: str | None = Field(
        None, validation_alias=AliasChoices("REWARDD_PROMETHEUS_MULTIPROC_DIR",
                                            "PROMETHEUS_MULTIPROC_DIR"),
        description="Shared directory for metrics of several server processes "
        "(set by `rewardd serve` when --workers > 1).")
    # ---- distributed execution (Celery over Redis); see workers/celery_app.py ----
    # ---- shared infrastructure: tenants, jobs and state in Redis; see service/tenancy.py ----
    api_keys: str = Field(
        "", description="API keys, `key=tenant,...`. Set (here or in REWARDD_API_KEYS_FILE): "
        "every /v1 request needs `Authorization: Bearer <key>` (else 401), and jobs and run "
        "state are visible only to the key's tenant. Unset: one tenant, `default`, no keys.")
    api_keys_file: str | None = Field(
        None, description='JSON file of tenants, keys and per-tenant limits: {"tenants": '
        '{"name": {"keys": ["..."], "max_concurrent_jobs": 4, "max_body_bytes": 1048576}}}.')
    metrics_token: str | None = Field(
        None, description="Scrape token of GET /metrics. Set: /metrics needs "
        "`Authorization: Bearer <token>` and tenants' API keys do not open it. Unset: with "
        "API keys configured any valid key opens it (else 401); without keys it is open.")
    tenant_max_concurrent_jobs: int = Field(
        16, ge=1, description="Requests (score, rewards, advantages, verify) and jobs one "
        "tenant may have running at once (across all API pods when state is in Redis); "
        "beyond it: 429 with Retry-After.")
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
    session_max_open: int = Field(
        8, ge=1, description="Streaming sessions (/v1/sessions) one tenant may have open at "
        "once; beyond it: 429 with Retry-After.")
    session_max_inflight: int = Field(
        8192, ge=1, description="Rollouts one tenant may have sent to its open sessions and "
        "not yet seen checked (over every API pod); beyond it: 429 with Retry-After.")
    session_idle_timeout_s: float = Field(
        600.0, gt=0, description="A session that received no request for this long is "
        "expired (its groups are dropped; a `closed` event with the error ends its stream).")
    session_ttl_s: int = Field(
        3600, ge=1, description="A closed session (its events and result) is kept this long.")

    compat_config: str | None = Field(
        None, description="Per-sample trainer protocols (OpenRLHF /get_reward, slime, "
        "NeMo-Gym /verify): a JSON/YAML file or inline JSON choosing the reward components, "
        "how a label maps to a reference, group size and timeout, group advantages and "
        "per-protocol options (see service/compat/config.py). Unset: the math verifier, "
        "the label as the answer, each sample on its own. Checked when the settings load "
        "and when the app is built: a bad one stops `rewardd serve`, not a trainer.")

    shutdown_grace_s: float = Field(
        25.0, gt=0, le=3600, description="On SIGTERM, how long `rewardd serve` lets requests "
        "in flight finish (new connections are refused at once); then their work is cancelled, "
        "running jobs are handed over (or failed, without Redis) and the process exits. Below "
        "Kubernetes' default 30 s grace, so the pod is not SIGKILLed first. A request whose "
        "client disconnected is cancelled at once, grace or not.")

    # ---- sessions: what the session store keeps per tenant (issue #28) -------------------
    session_max_groups: int = Field(
        4096, ge=1, description="Groups one streaming session may hold; beyond it an add is "
        "refused (422 naming the setting): bounds one session's memory in the store.")
    session_tenant_max_groups: int = Field(
        16384, ge=1, description="Groups one tenant's stored sessions may hold together (over "
        "every API pod); the tenant's oldest ended sessions are deleted to make room, then an "
        "add is refused (429 naming the setting): bounds the store's memory per tenant.")
    session_tenant_max_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="Bytes of rollouts, prompts and references one "
        "tenant's stored sessions may hold together (over every API pod); the tenant's oldest "
        "ended sessions are deleted to make room, then an add is refused (429 naming the "
        "setting): bounds the store's memory per tenant.")
    session_tenant_max_retained: int = Field(
        32, ge=1, description="Ended sessions (closed, cancelled, expired) kept per tenant for "
        "their results and events; past it the oldest is deleted at once, before its "
        "REWARDD_SESSION_TTL_S: bounds what open/close churn keeps.")

    # ---- per-sample trainer protocols (issue 28: /get_reward, slime, /verify) ----
    compat_max_samples_per_request: int = Field(
        8192, ge=1, description="Most samples one per-sample protocol request (/get_reward's "
        "query) may carry (and at most REWARDD_MAX_ROLLOUTS_PER_REQUEST); more: 422 naming "
        "body.query. Trainers send one sample, or a micro-batch, per request: this bounds the "
        "API memory and CPU one request takes (a 60,000-sample /get_reward held ~360 MB and "
        "seconds of the API's CPU).")
    compat_max_parked_requests: int = Field(
        16_384, ge=1, description="Per-sample protocol requests (/get_reward, slime, /verify) one "
        "tenant may have waiting for their answer in one API process (for a batch, or for their "
        "group in group mode); beyond it: 429 naming this setting. Each waiting request holds a "
        "connection, its body and its samples in the API process: this bounds that memory.")
    compat_max_parked_samples: int = Field(
        65_536, ge=1, description="Samples of those waiting requests one tenant may have in one "
        "API process; a request that alone has more is refused with 422, one that would pass it "
        "with what is already waiting with 429. Bounds the samples (and, in group mode, the open "
        "groups they start) one tenant keeps parked in the API process.")

    # --- issue 28: code references and JSON Schemas (untrusted code, schema checks)
    max_code_field_bytes: int = Field(
        1 << 20, ge=1024, le=64 << 20, description="Largest code field of a reference "
        "(UTF-8 bytes): a code reference's `test_code` and `checker.code`. Larger: 422 naming "
        "the field. Protects the sandbox run that reads the code (parsing Python takes "
        "hundreds of bytes of memory per byte of code) and the workers that carry it.")
    max_schema_check_cpu_s: float = Field(
        1.0, ge=0, le=60, description="API CPU seconds one request may spend checking its "
        "JSON Schemas (json_schema, tool_call) against their metaschema, for schemas the "
        "process has not checked before (verdicts are cached by content). Schemas past it, "
        "and any single schema over 16 KiB, are checked by the worker that uses them, under "
        "its time limit: a bad one is then `invalid_reference` instead of a 422. Protects "
        "the API's CPU.")

    # ---- event streams and long polls (issue 28, rows 3 and 8) ----
    tenant_max_streams: int = Field(
        64, ge=1, description="Event streams (GET /v1/jobs/{id}/events, GET "
        "/v1/sessions/{id}/events, gRPC WatchJob) one tenant may hold open at once on one "
        "API process; beyond it: 429 with Retry-After (gRPC RESOURCE_EXHAUSTED) before the "
        "stream starts. Bounds the memory and wake-ups one tenant's watchers cost a process.")
    tenant_max_long_polls: int = Field(
        64, ge=1, description="Long polls (GET /v1/sessions/{id}/groups/{group_id} with "
        "wait_s > 0, POST /v1/sessions/{id}/close waiting for its batch) one tenant may "
        "hold at once on one API process; beyond it: 429 with Retry-After. Bounds the "
        "requests one tenant can park on a process.")
    tenant_max_record_queries: int = Field(
        4, ge=1, description="Queries of the run record (GET /v1/runs...) one tenant may have "
        "running at once per API process; more are refused with 429 and Retry-After: a "
        "tenant's summaries of a long run (about a second each) must not hold every "
        "database connection and thread the others need.")

    # ---- answer sizes and per-request counts (issue 28: limits) ----
    max_dense_tokens: int = Field(
        1 << 22, ge=1, description="Most per-token advantages one answer may carry with "
        "output `dense` or `rle` (both hold one number per token while computed): the sum of "
        "num_tokens over a /v1/score, /v1/advantages or job request, and over all of a "
        "session's adds (its close answers with them all); more: 422 naming body.groups. It bounds the answer one request can make the API build: a "
        "1.4 MB /v1/advantages body asking for 2^26 tokens became a 1.3 GB JSON answer and "
        "stalled every tenant's requests. 4,194,304 tokens is 1,024 rollouts of 4,096 tokens "
        "(an answer of ~80 MB of JSON); larger batches use output `scalar` or split.")

    # ---- the run record (issue 29) ----
    record_runs: bool = Field(
        True, description="Record every scored rollout of a request that names a `run_id` "
        "(its verdicts, statuses, advantage summary and, as REWARDD_RECORD_COMPLETIONS says, "
        "its completion) for GET /v1/runs/... Written off the request path; off: nothing is "
        "recorded.")
    data_dir: str = Field(
        default_factory=lambda: str(default_data_dir()),
        description="Where an embedded rewardd keeps its files: the run record's SQLite "
        "database (records.sqlite3) when REWARDD_DATABASE_URL is unset. Default: "
        "$XDG_DATA_HOME/rewardd, else ~/.local/share/rewardd.")
    database_url: str | None = Field(
        None, description="The run record's database for shared deployments: "
        "postgresql://user@host:port/database (every API pod writes and reads the same "
        "record). Unset: a SQLite file under REWARDD_DATA_DIR. Migrated on first use.")
    record_completions: Literal["all", "failed", "sample", "none"] = Field(
        "all", description="Which completions the record keeps (replay re-scores only "
        "rollouts recorded with theirs): `all`; `failed` (a component failed or gave 0); "
        "`sample` (a share, REWARDD_RECORD_SAMPLE_RATE, chosen by a hash of the rollout, so "
        "the same rollouts on every pod); `none`.")
    record_sample_rate: float = Field(
        0.1, ge=0.0, le=1.0, description="The share of completions kept under "
        "REWARDD_RECORD_COMPLETIONS=sample.")
    record_queue: int = Field(
        100_000, ge=1, description="Rollouts waiting to be written to the record, at most, "
        "per API process; more while the database is slow or down are dropped and counted "
        "(rewardd_records_dropped_total), never slowing or failing scoring.")
    record_tenant_queue: int = Field(
        25_000, ge=1, description="Rollouts one tenant may have waiting in the record's queue "
        "per API process; more are dropped and counted (reason tenant_full), so one tenant "
        "flooding a slow database cannot crowd out the others' records.")
    record_queue_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="The same bound in bytes (completions and about "
        "2 KB per rollout besides): rollouts with long completions waiting for a slow "
        "database must not grow the API's memory without bound; beyond it they are dropped "
        "and counted.")
    record_retention_days: float | None = Field(
        30.0, gt=0, description="Recorded rollouts older than this are deleted (per tenant; "
        "unset: kept).")
    record_retention_rollouts: int | None = Field(
        None, gt=0, description="At most this many recorded rollouts per tenant; the oldest "
        "go first (unset: no bound).")

    # ---- the verdict cache (issue 29) ----
    verdict_cache: bool = Field(
        True, description="Answer a check from the verdict cache when the same verifier "
        "revision, effective parameters, reference, prompt and completion were checked "
        "before (RL revisits its prompts every epoch): per API process, and shared in "
        "Redis in distributed mode. Only successful verdicts of verifiers that decide the "
        "same way every time are kept (never a judge sampled above temperature 0 without "
        "a seed). A request bypasses it with `\"cache\": false`.")
    canary_rate: float = Field(
        0.02, ge=0.0, le=1.0, description="Share of a batch's groups whose references become "
        "canaries, per reward component with a probe maker (at least one group per batch "
        "while above 0; 0: none): probes a correct verifier must accept and reject, run "
        "beside the batch, never part of its rewards (docs/canaries.md). A request may "
        "change it with `\"canaries\": {\"rate\": ...}` or turn them off with "
        "`\"canaries\": false`.")
    verdict_cache_entries: int = Field(
        50_000, ge=1, description="Verdicts the API process keeps in memory, at most; when "
        "full, the least recently used verdict of the tenant holding the most goes first "
        "(one tenant cannot flush another's).")
    verdict_cache_ttl_s: float = Field(
        86_400.0, gt=0, description="How long a verdict stays in the shared Redis cache "
        "(distributed mode).")
    verdict_cache_max_bytes: int = Field(
        16_384, ge=256, description="A verdict whose evidence is larger than this (as JSON) "
        "is not put in the shared Redis cache: the cache must not fill Redis with test "
        "outputs.")

    @property
    def record_database_url(self) -> str:
        """REWARDD_DATABASE_URL, else the SQLite file under REWARDD_DATA_DIR."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{Path(self.data_dir).expanduser() / 'records.sqlite3'}"

    @property
    def state_redis_url(self) -> str | None:
        """Where shared state lives: REWARDD_STATE_URL, else the broker (None: in process)."""
        return self.state_url or self.broker_url


def default_data_dir() -> Path:
    """$XDG_DATA_HOME/rewardd, else ~/.local/share/rewardd."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "rewardd"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
