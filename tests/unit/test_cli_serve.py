"""``rewardd serve`` hands uvicorn a worker health check that a busy process survives
(:data:`rewardd.service.cli.WORKER_HEALTHCHECK_S`): with uvicorn's default of 5 s, a
``--workers 2`` start on a loaded machine was killed while it imported torch and never became
ready (tests/grpc/test_grpc_workers.py at load average 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import uvicorn
from click.testing import CliRunner

from rewardd.service import cli


def test_serve_gives_uvicorn_a_health_check_that_outlasts_a_busy_start(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: seen.update(options, app=app))
    # set (and restored after) so that serve does not set one for the rest of the suite
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    result = CliRunner().invoke(cli.main, ["serve", "--workers", "2", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert seen["app"] == "rewardd.service.app:create_app" and seen["workers"] == 2
    assert seen["timeout_worker_healthcheck"] == cli.WORKER_HEALTHCHECK_S >= 30
