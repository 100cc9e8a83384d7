"""The Celery application of distributed rewardd: configuration, tasks and time limits.

Used when ``REWARDD_BROKER_URL`` is set: the API (:class:`rewardd.workers.distributed.CeleryExecutor`)
publishes verifier calls (a group through one reward component each) as tasks to a queue
chosen by :mod:`rewardd.workers.routing` (big groups split, small ones packed several to a task:
:mod:`rewardd.workers.packing`), and ``rewardd worker`` processes run them. Without a broker nothing
here is imported and the embedded executor runs the same calls in a local process pool.

Task discipline, and why:

* **Idempotent tasks.** A task is a pure function of its arguments (verifier name, samples,
  reference, params, limit) returning plain data; running it twice stores the same result.
  That is what makes at-least-once delivery safe: every guarantee below may run a call again.
* **Acks late.** A message is acknowledged after its task finished, not when a worker takes
  it, so a worker machine that dies mid-call does not lose it: once its heartbeat expires
  (REWARDD_WORKER_LOST_AFTER_S, :mod:`rewardd.workers.liveness`) a reaper puts the unacked
  message back on its queue; the broker's own ``visibility_timeout`` is the last resort.
* **Reject on worker lost, with a budget.** When a worker's child process dies under a task
  (SIGKILL, OOM, a segfault in C code) the message is requeued (``reject_on_worker_lost``),
  and a worker machine that vanished leaves it unacknowledged for the broker to redeliver.
  Redelivered messages are counted per task in Redis (:func:`guard_redelivery`); past
  ``REWARDD_WORKER_LOST_RETRIES`` the task fails with :class:`CallAbandoned` without running,
  which the executor reports as ``crashed`` (a group: replayed one sample per call), instead
  of a poison call looping through the fleet for ever. (Celery's own
  ``retry_on_worker_lost`` is not used: it stores RETRY after publishing the retry, which can
  overwrite the retry's result when another worker is quick.)
* **Explicit time limits.** Each sample has its own soft deadline inside the task (SIGALRM,
  :mod:`rewardd.workers.deadline`; prefork children run tasks in their main thread, so it arms). The
  task as a whole gets Celery's soft limit at the call's hard limit
  (:meth:`~rewardd.workers.executor.VerifyCall.hard_limit_s`) and is killed
  :data:`KILL_GRACE_S` later; a timed-out task is acknowledged, never redelivered: it would
  time out again.
* **Visibility timeout longer than any task.** Otherwise the broker would hand a call that is
  still running to a second worker. The executor splits groups into (and packs them as)
  tasks whose time limit fits inside ``REWARDD_VISIBILITY_TIMEOUT_S`` (see
  :func:`max_samples_per_task`), so the bound holds for any group size and any request
  timeout.
* **Results expire.** Every stored result has a TTL (``REWARDD_RESULT_TTL_S``) and the
  executor deletes each result as soon as it has read it, so Redis never accumulates them.
* **Retries only for transient errors.** Publishing retries with backoff on broker
  connection errors, and workers retry storing a result while the backend is unreachable.
  Verifier outcomes (rewards and typed failures such as ``timeout`` or ``error``) are results,
  never exceptions, so no task ever retries because of what a verifier said.
* **JSON messages.** Plain data only (no pickle): nothing a message carries can run code in
  a worker.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import socket
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from celery import Celery
from celery.backends.redis import RedisBackend
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_ready
from celery.utils.collections import AttributeDict
from celery.worker.control import inspect_command
from kombu import Exchange, Queue

from rewardd.verifiers import REGISTRY
from rewardd.workers import exporter
from rewardd.workers.settings import WorkerSettings
from rewardd.workers.deadline import can_arm
from rewardd.workers.executor import VerifyCall, hard_limit_for
from rewardd.workers.liveness import Heartbeat
from rewardd.workers.packing import Pack
from rewardd.workers.routing import DEFAULT_QUEUE, Router
from rewardd.workers.tasks import ping_task, verify_groups_task

VERIFY_TASK = "rewardd.verify_groups"
"""Named for its arguments: a worker of a release that took one group per task rejects these
messages as an unknown task instead of misreading them."""
PING_TASK = "rewardd.ping"
CENSUS_COMMAND = "rewardd_census"

KILL_GRACE_S = 0.5
"""Celery's hard time limit (the child is killed) comes this long after its soft limit
(SoftTimeLimitExceeded is raised in the task), which is set at the call's hard limit. By then
every per-sample soft deadline has long fired; only a check that signals cannot interrupt is
still running."""

VISIBILITY_MARGIN_S = 2.0
"""Slack of the visibility timeout over a task's hard time limit: the time between the broker
handing the message to a worker and the task starting, and between the task ending and the
acknowledgement (milliseconds with a prefetch of one, seconds on a struggling machine)."""

PUBLISH_RETRY_POLICY = {"max_retries": 3, "interval_start": 0.0, "interval_step": 0.25,
                        "interval_max": 1.0}
"""Publishing a call retries broker connection errors for about 1.5 s, then the call is
reported ``unavailable``: a training step should hear that the broker is down, not hang."""


def task_time_limits(call: VerifyCall | Pack) -> tuple[float, float]:
    """(soft, hard) Celery time limits of ``call``'s task, both from its hard limit."""
    soft = call.hard_limit_s()
    return soft, soft + KILL_GRACE_S


def longest_task_s(samples: int, timeout_s: float) -> float:
    """Hard time limit of a task of ``samples`` samples at ``timeout_s`` each, plus the
    visibility margin: how long its message may stay unacknowledged."""
    return hard_limit_for(samples, timeout_s) + KILL_GRACE_S + VISIBILITY_MARGIN_S


def max_samples_per_task(timeout_s: float, settings: WorkerSettings) -> int:
    """How many samples at ``timeout_s`` one task may carry: at most ``task_max_samples``,
    and few enough that the task ends before the visibility timeout (never below one; the
    settings check guarantees one sample fits)."""
    n = settings.task_max_samples
    while n > 1 and longest_task_s(n, timeout_s) > settings.visibility_timeout_s:
        n -= 1
    return n


MIN_GROUP_TIMEOUT_S = 0.1


def group_timeout_s(samples: int, timeout_s: float, settings: WorkerSettings) -> float:
    """The per-sample timeout of a group-level call (one task, never split: an arena or a
    rubric judges the group as a whole), lowered where need be so that the task ends before
    the broker's visibility timeout. Past it the broker would hand the message to a second
    worker while the first still runs, asking the judge twice; lowered, a group that really
    takes that long ends as a typed ``timeout`` instead."""
    if longest_task_s(samples, timeout_s) <= settings.visibility_timeout_s:
        return timeout_s
    spare = settings.visibility_timeout_s - longest_task_s(samples, 0.0)
    return max(spare / max(samples, 1), MIN_GROUP_TIMEOUT_S)


def check_settings(settings: WorkerSettings) -> None:
    """Refuse a configuration in which one sample at the largest allowed timeout could still
    be running when the broker redelivers its message."""
    if not settings.broker_url:
        raise ValueError("distributed execution needs REWARDD_BROKER_URL (--broker-url)")
    if settings.worker_lost_after_s < 2 * settings.worker_heartbeat_s:
        raise ValueError(
            f"REWARDD_WORKER_LOST_AFTER_S={settings.worker_lost_after_s:g} must be at least two "
            f"heartbeats (REWARDD_WORKER_HEARTBEAT_S={settings.worker_heartbeat_s:g}), or a "
            "live worker's tasks would be requeued under it")
    need = longest_task_s(1, settings.max_verifier_timeout_s)
    if settings.visibility_timeout_s < need:
        raise ValueError(
            f"REWARDD_VISIBILITY_TIMEOUT_S={settings.visibility_timeout_s:g} is shorter than "
            f"the longest one-sample task ({need:g} s at REWARDD_MAX_VERIFIER_TIMEOUT_S="
            f"{settings.max_verifier_timeout_s:g}); raise it or lower the maximum timeout")


class PollingRedisBackend(RedisBackend):
    """Celery's Redis result backend without the subscription ``apply_async`` makes.

    Stock, publishing a task SUBSCRIBEs its result channel in the publishing process so that
    ``AsyncResult.get()`` can be woken by pub/sub; the subscriptions pile up until each result
    is fetched that way (and, with the backend down, publishing waits for the subscribe's
    reconnect retries). The executor reads results by polling their keys instead
    (:mod:`rewardd.workers.distributed`), so it needs none of that. Selected with Celery's
    ``module:Class+redis://...`` backend URL form.
    """

    def on_task_call(self, producer: Any, task_id: str) -> None:
        pass


def backend_url(settings: WorkerSettings) -> str:
    """The result backend URL Celery gets: REWARDD_RESULT_BACKEND (or the broker), read and
    written with :class:`PollingRedisBackend`."""
    url = settings.result_backend_url or ""
    if urlsplit(url).scheme not in ("redis", "rediss"):
        raise ValueError(f"the result backend must be Redis (redis:// or rediss://), got "
                         f"{redact_url(url)!r} (REWARDD_RESULT_BACKEND)")
    return f"{__name__}:{PollingRedisBackend.__name__}+{url}"


def redact_url(url: str | None) -> str | None:
    """``redis://:secret@host:6379/0`` -> ``redis://:***@host:6379/0`` (for /readyz, logs)."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _restore_interval(visibility_timeout_s: float) -> int:
    """Seconds between a worker's sweeps for messages whose visibility timeout has passed
    (left unacked by a dead worker): a fifth of the timeout, 1..10 s. Each sweep is one
    ZRANGE under a short Redis lock."""
    return int(max(1, min(10, visibility_timeout_s // 5)))


# ---- tasks: thin wrappers over workers.tasks, the functions the embedded pool runs too ----

def verify_groups(verifier: str, groups: Sequence[Any], params: Mapping[str, Any],
                  timeout_s: float) -> list[dict[str, Any]]:
    """Celery task body: :func:`rewardd.workers.tasks.verify_groups_task`, unchanged.

    One guard only: Celery's soft time limit raises SoftTimeLimitExceeded, an Exception, so
    :func:`rewardd.verifiers.base.run_verifier` would turn it into an ``error`` cell of whichever
    sample was running. The task then fails as a whole instead (the executor replays the
    group sample by sample, and a single sample becomes ``timeout``), as a kill at the hard
    limit does in the embedded pool.
    """
    items = verify_groups_task(verifier, groups, params, timeout_s)
    for item in items:
        detail = item["outcome"].get("detail") or {}
        if item["outcome"].get("error") == "error" and \
                detail.get("exception") == SoftTimeLimitExceeded.__name__:
            raise SoftTimeLimitExceeded("the call ran past its time limit")
    return items


class CallAbandoned(Exception):
    """A call whose worker died on every delivery its budget allowed: not run again.

    Deliberately not billiard's WorkerLostError, which Celery would requeue once more."""


def deliveries_key(task_id: str) -> str:
    """Redis hash counting a task's redeliveries (``redeliveries``) and saying how its last
    worker died (``lost``); expires with the results, deleted by the executor with them."""
    return f"rewardd-deliveries-{task_id}"


def guard_redelivery(task: Any, retries: int, ttl_s: int) -> None:
    """Run in the worker before a task: raise :class:`CallAbandoned` when this is a
    redelivery past the budget.

    Only redelivered messages pay the Redis round trip: kombu marks a message ``redelivered``
    when it requeues it after a child died (reject) or restores it after its worker vanished
    (visibility timeout). A call is run at most ``1 + retries`` times whose workers never
    finished it.
    """
    request = task.request
    if not (request.delivery_info or {}).get("redelivered"):
        return
    key = deliveries_key(request.id)
    with task.backend.client.pipeline() as pipe:
        pipe.hincrby(key, "redeliveries", 1)
        pipe.expire(key, ttl_s)
        pipe.hget(key, "lost")
        redeliveries, _, lost = pipe.execute()
    if redeliveries > retries:
        how = lost.decode(errors="replace") if lost else "its worker vanished"
        raise CallAbandoned(f"worker lost on each of the {redeliveries} runs this call was "
                            f"allowed (last: {how})")


def record_worker_loss(client: Any, task_id: str, reason: str, ttl_s: int) -> None:
    """In the worker's main process, before Celery requeues a task whose child died: keep
    how it died (with the exit status) for :func:`guard_redelivery` to report."""
    try:
        with client.pipeline() as pipe:
            pipe.hset(deliveries_key(task_id), "lost", reason)
            pipe.expire(deliveries_key(task_id), ttl_s)
            pipe.execute()
    except Exception:  # diagnostics only: never let it break the requeue
        pass


def ping() -> dict[str, Any]:
    """Readiness round trip. Also says whether this worker's tasks can arm the per-sample
    soft deadline (they run in the child's main thread under the prefork pool)."""
    return {"pong": ping_task(), "soft_deadline": can_arm(), "pid": os.getpid()}


@inspect_command(name=CENSUS_COMMAND)
def rewardd_census(state: AttributeDict) -> dict[str, Any]:
    """Remote inspect command: the queues this worker consumes and its pool size, in one
    reply. The API's census is then one broadcast; asking Celery's ``active_queues`` and
    ``stats`` one after the other was two, and the second often missed its reply window."""
    consumer = state.consumer
    queues = [queue.name for queue in consumer.task_consumer.queues] \
        if consumer.task_consumer else []
    return {"queues": queues, "slots": getattr(consumer.pool, "limit", None)}


def create_celery(settings: WorkerSettings) -> Celery:
    """The Celery app for ``settings`` (API and workers build it the same way, so both must
    see the same REWARDD_* broker, backend, TTL and visibility settings)."""
    check_settings(settings)
    router = Router.from_text(settings.queue_routes)
    visibility = settings.visibility_timeout_s
    app = Celery("rewardd", broker=settings.broker_url, backend=backend_url(settings),
                 set_as_current=False)
    app.conf.update(
        # plain data on the wire, both ways
        task_serializer="json", result_serializer="json",
        accept_content=["json"], result_accept_content=["json"],
        # at-least-once delivery of idempotent tasks
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure=True,   # a failed task would fail again: do not redeliver
        task_acks_on_timeout=True,   # nor one that hit its time limit
        worker_prefetch_multiplier=1,  # a worker holds only the calls it is running
        worker_cancel_long_running_tasks_on_connection_loss=False,  # reruns are harmless
        # results: stored with a TTL, deleted by the executor once read
        result_expires=settings.result_ttl_s,
        result_failure_expires=settings.result_ttl_s,
        task_ignore_result=False,
        task_track_started=False,    # one write per task, not two
        result_extended=False,
        # queues: one direct exchange per queue, named like it
        task_queues=[Queue(q, Exchange(q, type="direct"), routing_key=q) for q in router.queues],
        task_default_queue=DEFAULT_QUEUE,
        task_default_exchange=DEFAULT_QUEUE,
        task_default_routing_key=DEFAULT_QUEUE,
        task_create_missing_queues=True,
        # broker: visibility timeout and transient-error handling
        broker_transport_options={
            "visibility_timeout": visibility,
            "unacked_restore_interval": _restore_interval(visibility),
            "unacked_restore_throttle": 1,
            "socket_connect_timeout": 5,
            "socket_timeout": 30,
        },
        broker_connection_timeout=5,
        broker_connection_retry_on_startup=True,
        task_publish_retry=True,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        # result backend: workers retry storing while Redis is briefly unreachable
        result_backend_always_retry=True,
        result_backend_max_retries=10,
        result_backend_base_sleep_between_retries_ms=100,
        result_backend_max_sleep_between_retries_ms=2000,
        redis_socket_connect_timeout=5,
        redis_socket_timeout=30,
        redis_retry_on_timeout=True,
        # no monitoring chatter
        worker_send_task_events=False,
        task_send_sent_event=False,
        enable_utc=True,
    )
    retries, ttl_s = settings.worker_lost_retries, settings.result_ttl_s

    # resultrepr_maxsize: Celery logs a repr of every result; a whole group's outcomes cost
    # about 0.4 ms per task to render for a log line nobody reads at info level.
    @app.task(name=VERIFY_TASK, bind=True, shared=False, autoretry_for=(), max_retries=0,
              Request="rewardd.workers.celery_app:RewarddRequest", resultrepr_maxsize=64)
    def verify(task: Any, verifier: str, groups: Sequence[Any], params: Mapping[str, Any],
               timeout_s: float) -> list[dict[str, Any]]:
        guard_redelivery(task, retries, ttl_s)
        return verify_groups(verifier, groups, params, timeout_s)

    app.task(name=PING_TASK, shared=False, max_retries=0)(ping)
    return app


def parse_exitcode(message: str) -> int | None:
    """The exit status in billiard's "Worker exited prematurely: signal 9 (SIGKILL) Job: 3."
    as a Popen-style code (-9), or "exitcode 1" as 1; None if absent."""
    found = re.search(r"signal (\d+)", message)
    if found:
        return -int(found.group(1))
    found = re.search(r"exitcode (-?\d+)", message)
    return int(found.group(1)) if found else None


# ---- the worker process ---------------------------------------------------------------------

def run_worker(settings: WorkerSettings) -> None:
    """``rewardd worker``: import plugins, warm the verifiers this worker's queues need, then
    run Celery's prefork worker (does not return).

    Warming happens once, here in the parent, before the pool forks its children, so every
    child (and every replacement of a child that died) starts with the math grammar built.
    Only verifiers routed to this worker's queues are warmed, so a ``cpu`` worker never loads
    a GPU judge; nothing else is started in the parent.
    """
    app = create_celery(settings)  # validates the settings first
    exporter.start(settings.worker_metrics_port, settings.worker_metrics_host,
                   settings.queue_timeout_s)
    router = Router.from_text(settings.queue_routes)
    queues = settings.worker_queue_names or [DEFAULT_QUEUE]
    for module in settings.plugin_modules:
        importlib.import_module(module)
    for name, verifier in REGISTRY.items():
        if router.queue_for(name) in queues:
            exporter.timed_warm_up(name, verifier)
    # prefork: tasks run in each child's main thread, so SIGALRM soft deadlines arm; the
    # subclass reaps dead children promptly (see _prefork_pool_class)
    app.conf.worker_pool = "rewardd.workers.celery_app:PreforkPool"
    hostname = f"rewardd-{os.getpid()}@{socket.gethostname()}"
    _start_heartbeat_when_ready(app, settings, hostname, queues)
    app.worker_main([
        "worker",
        "--pool=prefork",  # the configured subclass, see above
        f"--concurrency={settings.worker_concurrency}",
        f"--queues={','.join(queues)}",
        # unique per process, so a census counts two workers on one host as two
        f"--hostname={hostname}",
        f"--loglevel={settings.log_level.upper()}",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ])


def _start_heartbeat_when_ready(app: Celery, settings: WorkerSettings, hostname: str,
                                queues: list[str]) -> None:
    """Once the worker consumes, its main process beats (:class:`rewardd.workers.liveness.
    Heartbeat`): the API sees it as a live consumer of ``queues``, and the tasks it holds go
    back on their queues within REWARDD_WORKER_LOST_AFTER_S if it vanishes."""

    def on_ready(**_: Any) -> None:
        Heartbeat(app, hostname, queues, settings.worker_concurrency,
                  settings.worker_heartbeat_s, settings.worker_lost_after_s).start()

    worker_ready.connect(on_ready, weak=False)


# ---- worker-side classes: prompt detection of a dead child, and why it died -------------------

REAP_RETRY_S = 0.01
REAP_RETRIES = 200
"""Up to 2 s of retries; the window is normally well under a millisecond."""


@functools.lru_cache(maxsize=1)
def _prefork_pool_class() -> type:
    """Celery's prefork TaskPool with one fix: a dead child is noticed at once.

    Celery's AsynPool learns that a child died when the child's sentinel pipe hits EOF, and
    then reaps it with ``waitpid(WNOHANG)``. The pipe closes while the kernel tears the
    process down, a moment before it becomes reapable; when the reap runs in that window it
    finds nothing, and the sentinel is not watched any more, so the death goes unnoticed until
    the next 5 s pool maintenance or the task's hard time limit. A call that crashed its
    worker would then come back late, and as ``timeout`` instead of ``crashed``, depending on
    scheduling (often, on a loaded two-core machine). The subclass keeps reaping every
    :data:`REAP_RETRY_S` until the child is gone.
    """
    from celery.concurrency.asynpool import AsynPool
    from celery.concurrency.prefork import TaskPool

    class ReapingAsynPool(AsynPool):
        def _event_process_exit(self, hub: Any, proc: Any) -> None:
            super()._event_process_exit(hub, proc)
            self._reap_soon(hub, proc, REAP_RETRIES)

        def _reap_soon(self, hub: Any, proc: Any, tries: int) -> None:
            if proc in self._pool and proc.exitcode is None and tries > 0:
                hub.call_later(REAP_RETRY_S, self._reap_again, hub, proc, tries - 1)

        def _reap_again(self, hub: Any, proc: Any, tries: int) -> None:
            self.maintain_pool()
            self._reap_soon(hub, proc, tries)

    class ReapingTaskPool(TaskPool):
        Pool = ReapingAsynPool

    return ReapingTaskPool


@functools.lru_cache(maxsize=1)
def _request_class() -> type:
    """Celery's worker-side Request, recording how a child died before the requeue."""
    from billiard.exceptions import WorkerLostError
    from celery.worker.request import Request

    class RewarddRequest(Request):
        def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                       return_ok: bool = False) -> Any:
            exc = getattr(exc_info.exception, "exc", exc_info.exception)
            if isinstance(exc, WorkerLostError):
                reason = str(exc)
            elif isinstance(exc, SystemExit):  # billiard >= 4.3 may report the exit itself
                reason = f"Worker exited prematurely: exitcode {exc.code}"
            else:
                reason = None
            if reason is not None:
                record_worker_loss(self.task.backend.client, self.id, reason,
                                   int(self.task.backend.expires or 3600))
            return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                      return_ok=return_ok)

    return RewarddRequest


def __getattr__(name: str) -> Any:
    # Worker-only classes, named in the app's configuration and built on first use, which
    # keeps celery.worker and celery.concurrency out of the API process.
    if name == "PreforkPool":
        return _prefork_pool_class()
    if name == "RewarddRequest":
        return _request_class()
    raise AttributeError(name)
