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

SLEEP_S = 30.0
"""What the interrupted sleeps would take: an answer sooner shows they were cut (a timer
never fires early, so this holds however slow or busy the machine)."""
HANG_S = 60.0  # bounds against a hang, never a measurement


def test_interrupts_a_sleep_in_the_main_thread() -> None:
    started = time.perf_counter()
    deadline = SoftDeadline(0.2)
    with pytest.raises(CheckTimeout), deadline:
        time.sleep(SLEEP_S)
    # interrupted: answered before the sleep could have ended (order, not speed), never early
    assert 0.15 < time.perf_counter() - started < SLEEP_S
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
    """The outer timer keeps its own deadline across an inner one. Checked against clock
    readings taken around each step rather than fixed windows: the inner block sleeps
    half a second, so re-arming with the whole outer delay, or none, would move the outer
    deadline by at least that much, however slow the machine, while the right one moves it
    only by what runs between the deadline's own clock reading and its ``setitimer``."""
    outer_s, inside_s, slack_s = 1.0, 0.5, 0.25
    fired: list[float] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.monotonic()))
    before_arming = time.monotonic()
    outer = signal.setitimer(signal.ITIMER_REAL, outer_s)
    after_arming = time.monotonic()
    try:
        with SoftDeadline(5 * outer_s):
            time.sleep(inside_s)
        before_reading = time.monotonic()
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        after_reading = time.monotonic()
        # the re-armed outer deadline lies where it was armed for (or, on a machine so busy
        # that the inner block outlasted it, is due at once)
        assert before_arming + outer_s - slack_s <= after_reading + left, left
        assert before_reading + left <= max(after_arming + outer_s, before_reading) + slack_s
        hang = time.monotonic() + HANG_S
        while not fired and time.monotonic() < hang:
            time.sleep(0.01)
        assert len(fired) == 1 and fired[0] >= before_arming + outer_s - slack_s
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
    thread.join(timeout=HANG_S)
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
                              {"seconds": SLEEP_S, "when": ["2"]}, 0.3)
    assert time.perf_counter() - started < SLEEP_S  # before the sleep could have ended
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
