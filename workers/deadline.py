"""A soft wall-clock deadline for one check, enforced inside the worker with SIGALRM.

Why: a worker runs a whole group of checks in one task, and each check must keep its own
limit. Killing the process (pebble's hard limit) would cost a fork and lose the group's
finished results, so a check that overruns is interrupted in place instead: the timer's
signal handler raises :class:`CheckTimeout` in the main thread, the check unwinds, and the
worker goes on with the next sample. Only a hang that signals cannot interrupt (C code that
never checks for signals, a blocked SIGALRM) is left to the executor's hard limit.

Signals are delivered to the main thread only, so off the main thread :class:`SoftDeadline`
arms nothing and only the hard limit applies. pebble's workers run tasks in their main
thread, and so do Celery's prefork workers.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

REPEAT_S = 0.1
"""After the first alarm the timer fires again every REPEAT_S seconds until disarmed, so a
check whose code swallows the first :class:`CheckTimeout` (a bare ``except:``) is interrupted
again rather than left to run until the hard limit."""


class CheckTimeout(BaseException):
    """Raised into a check that ran past its soft deadline.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` in verifier code (and in
    :func:`rewardd.verifiers.base.run_verifier`) lets it through.
    """


def can_arm() -> bool:
    """True when this thread can take SIGALRM handlers (the main thread)."""
    return threading.current_thread() is threading.main_thread()


class SoftDeadline:
    """Context manager: raise :class:`CheckTimeout` in the block once ``timeout_s`` has passed.

    On exit the timer is disarmed and the previous SIGALRM handler restored. ``expired`` says
    whether the deadline fired, even if the block swallowed the exception, so the caller can
    report a timeout whatever the block returned. It owns ``ITIMER_REAL`` while armed: a timer
    already running (pytest-timeout's, say) cannot fire meanwhile and is re-armed on exit
    with what is left of its own deadline. Off the main thread it does nothing (``armed``
    stays False).
    """

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.armed = False
        self.expired = False
        self._previous: Any = None
        self._outer: tuple[float, float] = (0.0, 0.0)
        self._armed_at = 0.0

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:  # a late signal after disarming must not hit the caller
            self.expired = True
            raise CheckTimeout(f"check ran past its {self.timeout_s:g}s limit")

    def __enter__(self) -> SoftDeadline:
        if can_arm():
            previous = signal.signal(signal.SIGALRM, self._on_alarm)
            self._previous = signal.SIG_DFL if previous is None else previous
            self.armed = True
            self._armed_at = time.monotonic()
            self._outer = signal.setitimer(signal.ITIMER_REAL, self.timeout_s, REPEAT_S)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.disarm()

    def disarm(self) -> None:
        """Stop the timer and restore the previous handler; idempotent.

        ``armed`` drops first, so an alarm already on its way is ignored. An alarm handled
        just before that (on the way into ``__exit__``) raises out of the ``with`` block
        before the cleanup ran: callers that catch :class:`CheckTimeout` call ``disarm``
        again in their ``finally``.
        """
        if not self.armed:
            return
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous)
        delay, interval = self._outer
        if delay > 0:  # an outer timer was running: it keeps its own wall-clock deadline
            left = delay - (time.monotonic() - self._armed_at)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), interval)
