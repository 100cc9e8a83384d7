"""Routing, task sizes and time limits of the Celery executor (pure functions), and a bad
configuration stopping real `rewardd serve` / `worker` commands at start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import make_settings
from tests.support.server import REPO_ROOT, child_env
from rewardd.verifiers.base import Sample
from rewardd.workers.celery_app import (KILL_GRACE_S, check_settings, group_timeout_s,
                                longest_task_s, max_samples_per_task, parse_exitcode,
                                task_time_limits)
from rewardd.workers.executor import VerifyCall
from rewardd.workers.routing import Router, parse_routes


def test_verifiers_go_to_the_queue_their_workers_need() -> None:
    router = Router.from_text("my_judge=gpu, math=cpu-big")
    assert [router.queue_for(name) for name in ("exact_match", "regex", "length")] == ["cpu"] * 3
    assert router.queue_for("code") == "sandbox"
    assert {router.queue_for(n) for n in ("rubric", "arena", "reward_model")} == {"gpu"}
    assert router.queue_for("my_judge") == "gpu"
    assert router.queue_for("math") == "cpu-big"  # a route may override a built-in
    assert router.queue_for("some_plugin") == "cpu"
    assert router.queues == ["cpu", "sandbox", "gpu", "cpu-big"]


@pytest.mark.parametrize("text", ["judge", "judge=", "=gpu", "judge=g p u"])
def test_malformed_routes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad queue route"):
        parse_routes(text)


def test_time_limits_derive_from_the_calls_hard_limit() -> None:
    call = VerifyCall("math", (Sample("a"),) * 4, {}, {}, 2.0)
    soft, hard = task_time_limits(call)
    assert soft == call.hard_limit_s() and hard == soft + KILL_GRACE_S


def test_no_task_outlives_the_visibility_timeout() -> None:
    settings = make_settings(visibility_timeout_s=60.0, task_max_samples=64)
    assert max_samples_per_task(1.0, settings) == 56
    assert longest_task_s(56, 1.0) <= 60.0 < longest_task_s(57, 1.0)
    assert max_samples_per_task(0.1, settings) == 64  # capped by task_max_samples
    assert max_samples_per_task(50.0, settings) == 1


def test_a_judge_group_that_cannot_be_split_is_fitted_to_the_visibility_timeout() -> None:
    settings = make_settings(visibility_timeout_s=900.0)
    assert longest_task_s(16, 60.0) > 900.0  # 16 rollouts at 60 s would outlive it
    fitted = group_timeout_s(16, 60.0, settings)
    assert fitted < 60.0 and longest_task_s(16, fitted) == pytest.approx(900.0)
    assert group_timeout_s(8, 60.0, settings) == 60.0  # fits: unchanged


def test_a_visibility_timeout_shorter_than_one_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="VISIBILITY_TIMEOUT"):
        check_settings(make_settings(visibility_timeout_s=60.0, max_verifier_timeout_s=120.0))
    with pytest.raises(ValueError, match="BROKER_URL"):
        check_settings(make_settings(broker_url=None))


def test_exit_status_of_a_lost_worker() -> None:
    assert parse_exitcode("Worker exited prematurely: signal 9 (SIGKILL) Job: 3.") == -9
    assert parse_exitcode("Worker exited prematurely: exitcode 1 Job: 3.") == 1
    assert parse_exitcode("its worker vanished") is None


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A real ``rewardd`` command with ``env`` on top of a clean environment."""
    return subprocess.run([sys.executable, "-m", "rewardd.service.cli", *args], cwd=REPO_ROOT,
                          env={**child_env(), **env}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_bad_configuration_stops_the_command_with_one_line_per_variable(
        command: str) -> None:
    done = run_cli(command, env={"REWARDD_LOG_LEVEL": "verbose", "REWARDD_POOL_SIZ": "4",
                                 "REWARDD_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "REWARDD_LOG_LEVEL=verbose: must be one of debug, info, warning, error or " \
           "critical" in done.stderr
    assert "REWARDD_POOL_SIZ: not a rewardd setting; did you mean REWARDD_POOL_SIZE?" \
           in done.stderr


def test_a_flag_value_is_checked_like_its_variable() -> None:
    done = run_cli("serve", "--port", "0", "--log-level", "loud", env={})
    assert done.returncode == 2 and "REWARDD_LOG_LEVEL=loud: must be one of" in done.stderr
