"""The ``rewardd`` command: serve the API, score JSONL files offline, write the OpenAPI document,
read the run record of a running server (``rewardd runs``, :mod:`rewardd.service.runs_cli`)
and replay a recorded run (``rewardd reverify``, :mod:`rewardd.service.reverify_cli`).

Every flag mirrors a ``REWARDD_*`` setting (``--pool-size`` <-> ``REWARDD_POOL_SIZE``); a flag
wins over the environment. ``serve`` passes its flags to the server processes through the
environment, which is how uvicorn's worker processes read their settings.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import click

from rewardd.service.environment import ConfigError, load_settings
from rewardd.service.reverify_cli import reverify
from rewardd.service.runs_cli import runs
from rewardd.service.settings import Settings, get_settings
from rewardd.service.tenancy import DEFAULT_TENANT


def settings_options(*names: str) -> Callable[[Callable], Callable]:
    """Add one ``--flag`` per named Settings field, with the field's description as help."""

    def decorate(fn: Callable) -> Callable:
        for name in reversed(names):
            field = Settings.model_fields[name]
            annotation = field.annotation if field.annotation in (int, float, str) else str
            fn = click.option(f"--{name.replace('_', '-')}", name, type=annotation, default=None,
                              help=f"{field.description} [env: REWARDD_{name.upper()}]")(fn)
        return fn

    return decorate


def settings_from(overrides: dict[str, Any]) -> Settings:
    """Environment first, flags on top; exported so child processes see the same values.
    An unknown ``REWARDD_*`` variable or a bad value ends the command here with exit status
    2 and one line per variable (:mod:`rewardd.service.environment`), never a traceback."""
    given = {k: v for k, v in overrides.items() if v is not None}
    for key, value in given.items():
        os.environ[f"REWARDD_{key.upper()}"] = str(value)
    get_settings.cache_clear()
    try:
        load_settings()
    except ConfigError as exc:
        command = click.get_current_context().info_name
        click.echo(f"rewardd {command}: the configuration is not valid:\n  "
                   + "\n  ".join(exc.lines), err=True)
        sys.exit(2)
    return get_settings()


@click.group()
@click.version_option(package_name="rewardd")
def main() -> None:
    """rewardd: rewards and per-token advantages for RL post-training."""


WORKER_HEALTHCHECK_S = 60
"""With ``--workers`` > 1, how long uvicorn's supervisor waits for an API process to answer
its ping (a thread in that process) before it kills it. uvicorn's default of 5 s killed
processes that were only busy: a start imports torch, whose shared libraries load with the
GIL held, and took over 8 s on a loaded 2-core machine, so the server never became ready;
a process encoding a very large answer holds the GIL alike. A hung process still goes,
after a minute."""


@main.command()
@settings_options("host", "port", "grpc_port", "workers", "pool_size", "verifier_timeout_s",
                  "max_verifier_timeout_s", "max_body_bytes", "plugins", "broker_url",
                  "state_url", "api_keys_file", "tenant_max_concurrent_jobs", "log_level",
                  "shutdown_grace_s", "log_format", "compat_config")
def serve(**flags: Any) -> None:
    """Run the HTTP API (and gRPC with --grpc-port): verifiers in an embedded process pool (no Redis needed), or on
    `rewardd worker` processes when a broker is set (--broker-url / REWARDD_BROKER_URL)."""
    import uvicorn

    from rewardd.workers.logs import logging_config

    settings = settings_from(flags)
    if settings.workers > 1 and not settings.prometheus_multiproc_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="rewardd-metrics-")
    uvicorn.run("rewardd.service.app:create_app", factory=True, host=settings.host, port=settings.port,
                workers=settings.workers, log_level=settings.log_level,
                timeout_graceful_shutdown=settings.shutdown_grace_s,
                timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
                log_config=logging_config(settings.log_format, settings.log_level))


@main.command()
@click.option("--queues", "worker_queues", default=None,
              help=f"{Settings.model_fields['worker_queues'].description} "
                   "[env: REWARDD_WORKER_QUEUES]")
@click.option("--concurrency", "worker_concurrency", type=int, default=None,
              help=f"{Settings.model_fields['worker_concurrency'].description} "
                   "[env: REWARDD_WORKER_CONCURRENCY]")
@settings_options("broker_url", "result_backend", "plugins", "result_ttl_s",
                  "visibility_timeout_s", "task_max_samples", "worker_lost_retries",
                  "max_verifier_timeout_s", "queue_routes", "log_level", "log_format")
def worker(**flags: Any) -> None:
    """Run a Celery worker (prefork pool) for verifier calls (needs a broker).

    Start as many as you like, on any machine that reaches the broker, each for the queues
    its host can serve: `rewardd worker --queues cpu,sandbox --concurrency 8`. The API and
    the workers must share the REWARDD_* broker, backend, TTL and visibility settings.
    """
    from rewardd.workers.celery_app import run_worker
    from rewardd.workers.logs import configure_worker

    settings = settings_from(flags)
    configure_worker(settings.log_format, settings.log_level)
    try:
        run_worker(settings)
    except ValueError as exc:  # configuration: no broker, bad routes, visibility too short
        click.echo(f"rewardd worker: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="Where to write one JSON result per line.")
@click.option("--spec", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON with run_id/rewards/advantage: then every input line is one group.")
@click.option("--batch-size", default=64, show_default=True,
              help="Groups per batch when --spec is given.")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar of rollouts scored. [default: only when stderr is a "
                   "terminal]")
@click.option("--record/--no-record", default=True, show_default=True,
              help="Record the rollouts of requests that name a run_id into the local run "
                   "record (REWARDD_DATA_DIR / REWARDD_DATABASE_URL), as the server does.")
@click.option("--tenant", default=DEFAULT_TENANT, show_default=True,
              help="The tenant they are recorded under (`default`: a server without API "
                   "keys).")
@settings_options("pool_size", "verifier_timeout_s", "plugins", "torch_threads", "data_dir",
                  "database_url")
def score(source: Path, output: Path, spec: Path | None, batch_size: int,
          progress: bool | None, record: bool, tenant: str, **flags: Any) -> None:
    """Score SOURCE offline through the same pipeline as POST /v1/score.

    Without --spec every line is a full request (a /v1/score body, or a /v1/advantages body
    when it has no "rewards"), and every output line is its response. With --spec every line
    is one group, and every output line is that group's result.

    A /v1/score body (or spec) naming a run_id is recorded into the run record that
    `rewardd serve` reads (GET /v1/runs, `rewardd runs`), written before the command exits.

    The summary (on stderr) tells warm-up (imports, pool start) from scoring: rollouts_per_s
    is over scoring_s only; `record` says how many rollouts were recorded and dropped.
    """
    started = time.perf_counter()  # before the imports: they are warm-up
    from rewardd.service.batch import BatchInvalid, run_file

    settings = settings_from(flags)
    try:
        summary = run_file(source, output, spec, batch_size, settings, progress, started,
                           record, tenant)
    except BatchInvalid as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    click.echo(json.dumps(summary, indent=2), err=True)
    if summary["record"] is not None and summary["record"]["dropped"]:
        click.echo(f"rewardd score: {summary['record']['dropped']} rollouts could not be "
                   f"recorded ({summary['record']['last_error']})", err=True)


@main.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("openapi/openapi.json"), show_default=True)
def openapi(output: Path) -> None:
    """Write the OpenAPI document generated from the app."""
    from rewardd.service.app import render_openapi

    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_openapi())
    click.echo(f"wrote {output}")


main.add_command(runs)
main.add_command(reverify)


if __name__ == "__main__":
    main()
