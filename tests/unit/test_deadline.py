"""The soft per-check deadline (rewardd.workers.deadline) and the group task that uses it, in-process.

These run in pytest's main thread, where SIGALRM handlers work, exactly as in a pebble
worker (test_group_calls proves the workers run tasks in their main thread).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

import tests.plugins.faulty  # noqa: F401 - registers the test verifiers
from rewardd.workers.deadline import CheckTimeout, SoftDeadline, can_arm
from rewardd.workers.tasks import verify_group_task


def test_interrupts_a_sleep_in_the_main_thread() -> None:
    started = time.perf_counter()
    deadline = SoftDeadline(0.2)
    with pytest.raises(CheckTimeout), deadline:
        time.sleep(30)
    # interrupted: far below the 30 s sleep (generous for a loaded machine), never early
    assert 0.15 < time.perf_counter() - started < 10.0
    assert deadline.expired and not deadline.armed


def test_except_exception_cannot_swallow_it() -> None:
    deadline = SoftDeadline(0.1)
    with pytest.raises(CheckTimeout), deadline:
        try:
            time.sleep(5)
        except Exception:  # what verifier code does; a timeout must get through
            pytest.fail("CheckTimeout was caught as an Exception")


def test_a_fast_block_is_untouched_and_everything_is_restored() -> None:
    def sentinel(signum, frame) -> None:
        raise AssertionError("the previous handler must not run here")

    previous = signal.signal(signal.SIGALRM, sentinel)
    outer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, if it uses signals
    try:
        deadline = SoftDeadline(0.3)
        with deadline:
            assert deadline.armed and signal.getitimer(signal.ITIMER_REAL)[0] > 0
        assert not deadline.expired and not deadline.armed
        assert signal.getsignal(signal.SIGALRM) is sentinel
        after = signal.getitimer(signal.ITIMER_REAL)
        assert after == (0.0, 0.0) if outer == (0.0, 0.0) else outer[0] - 1 < after[0] <= outer[0]
        time.sleep(0.4)  # past the limit: nothing fires any more
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_an_outer_timer_is_rearmed_with_what_is_left() -> None:
    fired: list[float] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.monotonic()))
    outer = signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        started = time.monotonic()
        with SoftDeadline(1.0):
            time.sleep(0.1)
        assert 0.2 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.4
        time.sleep(1.0)
        assert len(fired) == 1 and 0.4 < fired[0] - started < 0.8
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer)
        signal.signal(signal.SIGALRM, previous)


def test_is_a_no_op_off_the_main_thread() -> None:
    seen: dict[str, object] = {}

    def body() -> None:
        seen["can_arm"] = can_arm()
        deadline = SoftDeadline(0.05)
        with deadline:
            time.sleep(0.3)  # past the limit: nothing may interrupt it here
        seen["armed"], seen["expired"] = deadline.armed, deadline.expired

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=5)
    assert seen == {"can_arm": False, "armed": False, "expired": False}
    assert can_arm()


def test_rejects_a_non_positive_limit() -> None:
    with pytest.raises(ValueError):
        SoftDeadline(0)


def sample(completion: str) -> dict[str, object]:
    return {"completion": completion, "prompt": "", "num_tokens": None}


def test_group_task_times_out_only_the_slow_sample() -> None:
    handler_before = signal.getsignal(signal.SIGALRM)
    started = time.perf_counter()
    items = verify_group_task("test_sleep", [sample(c) for c in ("1", "2", "3")], {},
                              {"seconds": 30, "when": ["2"]}, 0.3)
    assert time.perf_counter() - started < 10.0  # not the 30 s sleep; generous under load
    assert [i["outcome"]["reward"] for i in items] == [1.0, None, 3.0]
    slow = items[1]["outcome"]
    assert slow["error"] == "timeout" and slow["detail"]["limit_s"] == 0.3
    assert "interrupted" in slow["detail"]["message"]
    assert items[1]["elapsed_s"] == 0.3 and items[0]["elapsed_s"] < 0.3
    assert signal.getsignal(signal.SIGALRM) is handler_before  # restored after every sample


@pytest.mark.parametrize("swallow", [1, 10**9])
def test_group_task_times_out_a_check_that_swallows_the_interrupt(swallow: int) -> None:
    """Swallowed once: the repeating alarm gets through. Swallowed every time: the check
    returns a reward, and the sample is still a timeout (the deadline expired)."""
    items = verify_group_task("test_swallow", [sample("1"), sample("2")], {},
                              {"seconds": 0.6, "swallow": swallow, "when": ["2"]}, 0.2)
    assert items[0]["outcome"]["reward"] == 1.0
    assert items[1]["outcome"]["error"] == "timeout"


def test_group_task_keeps_typed_failures_of_other_kinds() -> None:
    items = verify_group_task("test_raise", [sample("1"), sample("0")], {},
                              {"when": ["0"]}, 1.0)
    assert items[0]["outcome"]["reward"] == 1.0
    assert items[1]["outcome"]["error"] == "error"
    assert items[1]["outcome"]["detail"]["exception"] == "ZeroDivisionError"
