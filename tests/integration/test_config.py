"""Routing, task sizes and time limits of the Celery executor (pure functions)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import make_settings
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
