"""The heavy lane: where an API process does the CPU work of its large requests.

Why it exists (issue 15, measured on a valid 60,000-rollout /v1/score, 4.5 MB in, a 17 MB
answer, on the 2-core machine): the API process spends about 1.6 s of its own CPU on such a
request (validating the model 0.28 s, the cross-field checks 0.18 s, planning 0.1 s,
recording 60,000 outcomes 0.3 s, the response 0.38 s, encoding 0.05 s), and every
generation-2 collection of the cyclic garbage collector while the request's ~800,000 objects
are alive takes another 0.26-0.37 s. That work already ran in worker threads, off the event
loop, but the threads share one GIL, and the stalls came from three things threads do not
fix:

* a long C call holds the GIL throughout: pydantic validating 60,000 rollouts at once
  (0.28 s, more on a busy machine), and each full garbage collection (0.3 s), during
  which /healthz and every other tenant's request stood still (measured 0.5-1.0 s);
* a CPU-bound thread keeps the GIL for a whole switch interval (5 ms) each time the event
  loop hands it over, and the loop hands it over at every turn (each poll for I/O), so
  every turn of the loop took up to 5 ms longer while a big request computed;
* nothing bounded how many big requests computed at once: two of them took two threads'
  worth of the GIL.

So a request is *heavy* once its body is over :data:`HEAVY_BODY_BYTES` or it holds more
than :data:`HEAVY_ROLLOUTS` rollouts (trainers' usual batches stay below: they keep the
default thread pool and pay nothing new). A heavy request's CPU steps (decoding and
validating, the checks, planning, building and encoding the answer) run in one dedicated
thread per API process, the lane, so big requests queue behind each other there while small
ones never wait behind them; the lane runs at a lower scheduling priority
(:data:`LANE_NICE`), so where the verifier processes fill the cores the kernel gives the
CPU to them, the event loop and the usual requests first; while the lane computes, the interpreter's switch interval is
:data:`LANE_SWITCH_INTERVAL_S` instead of 5 ms, so the event loop waits at most that long
for the GIL; its model is validated :data:`VALIDATE_CHUNK_GROUPS` groups at a time, so no
single C call holds the GIL for long; and the objects it built are moved out of the
collector's reach (``gc.freeze``) until the last heavy request ends, so no collection
rescans them (reference counting still frees them as usual; only cycles among them wait).

Measured after (tests/e2e/test_tenant_isolation.py: a 48,000-rollout score against a real
server with a pool of 1, /healthz pinged every 10 ms and another tenant's small scores sent
back to back; the shared 2-core machine at load average 3 to 11): the worst /healthz and
small-request answer while it ran was 5.2-10.1% of the big request's duration before,
2.1-4.9% with the lane, 0.8-4.0% with the lane at a lower priority, and up to 4 times as
many small requests completed meanwhile (the big request itself took longer: it yields).

Written here rather than taken from a library: the standard library gives the pieces (a
one-thread executor, ``sys.setswitchinterval``, ``gc.freeze``); what is ours is when to use
them. Moving the heavy steps to another process was the alternative: the validated batch
would have to be pickled back into the API process (as long a C call as the validation).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from rewardd.service.gcpause import gc_paused

T = TypeVar("T")

HEAVY_BODY_BYTES = 1 << 20
"""A request body over this many bytes (1 MiB; 32 trainer rollouts are ~10 KB) is heavy."""
HEAVY_ROLLOUTS = 4096
"""A request of more rollouts than this is heavy. A heavy request pays nothing extra when
alone: the lane is one thread hop per step (~50 us), like the default pool's."""
LANE_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval while the lane computes (5 ms otherwise): how long the
event loop may wait for the GIL held by heavy Python code."""
VALIDATE_CHUNK_GROUPS = 64
"""Groups validated per pydantic call in the lane (~1,000 rollouts, ~5 ms of GIL)."""

LANE_NICE = 10
"""How much lower the lane thread's scheduling priority is than the process's (Linux nice,
per thread; at most 19): on a machine whose cores the verifier processes fill, the kernel
runs them, the event loop and the usual requests' threads before a big request's own work.
The GIL does not invert it for long: a lane descheduled while holding the GIL is asked to
drop it after :data:`LANE_SWITCH_INTERVAL_S` and does at its next time slice."""


def _lower_priority() -> None:
    try:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me,
                       min(19, os.getpriority(os.PRIO_PROCESS, me) + LANE_NICE))
    except (OSError, AttributeError):  # not Linux, or not allowed: the process's priority
        pass


_lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewardd-heavy",
                           initializer=_lower_priority)


@dataclass(slots=True)
class _Scope:
    """One request (or job) the service is serving; ``heavy`` once it was found heavy."""

    heavy: bool = False


_scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("rewardd_heavy_scope",
                                                                        default=None)
_lock = threading.Lock()
_active = 0
"""Heavy scopes open now; the collector's frozen objects are released when it falls to 0."""


@contextmanager
def scope() -> Iterator[None]:
    """Around a whole request or job: what it marks heavy (:func:`mark`) is accounted to it,
    and released when it ends, however it ends. Nested scopes are the outer one."""
    if _scope.get() is not None:
        yield
        return
    current = _Scope()
    token = _scope.set(current)
    try:
        yield
    finally:
        _scope.reset(token)
        if current.heavy:
            _release()


def mark(heavy: bool = True) -> None:
    """Mark the current scope heavy (a no-op outside a scope, or when ``heavy`` is false)."""
    global _active
    current = _scope.get()
    if not heavy or current is None or current.heavy:
        return
    current.heavy = True
    with _lock:
        _active += 1


def is_heavy() -> bool:
    current = _scope.get()
    return current is not None and current.heavy


def heavy_body(size: int) -> bool:
    return size > HEAVY_BODY_BYTES


def heavy_rollouts(count: int) -> bool:
    return count > HEAVY_ROLLOUTS


def active() -> int:
    """Heavy requests in this process now (for tests and /readyz-style introspection)."""
    return _active


def _release() -> None:
    global _active
    with _lock:
        _active -= 1
        if _active == 0:
            gc.unfreeze()  # what is still alive goes back to the oldest generation


async def offload(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` off the event loop: in the lane for a heavy scope, else in the
    default thread pool (``asyncio.to_thread``), with the caller's context either way."""
    if not is_heavy():
        return await asyncio.to_thread(fn, *args)
    call = functools.partial(contextvars.copy_context().run, _in_lane, fn, args)
    return await asyncio.get_running_loop().run_in_executor(_lane, call)


def _keep_out_of_collections() -> None:
    """Move every object alive now out of the collector's scans while a heavy request is
    served (``gc.freeze`` is O(1)); none once its scope has ended (nothing would unfreeze).
    Only after the lane's steps, which built the request's objects: freezing as each of its
    results arrived as well gained nothing measurable and held other requests' cyclic
    garbage until the next full collection (+130 MB of API memory in bench_load)."""
    with _lock:
        if _active:
            gc.freeze()


def _in_lane(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    before = sys.getswitchinterval()
    sys.setswitchinterval(LANE_SWITCH_INTERVAL_S)
    try:
        with gc_paused():
            result = fn(*args)
            _keep_out_of_collections()
            return result
    finally:
        sys.setswitchinterval(before)


def in_lane() -> bool:
    """True in the lane's thread (chunked work yields the GIL between chunks only there)."""
    return threading.current_thread().name.startswith("rewardd-heavy")
