"""Logging of the API and the workers: JSON lines or text (REWARDD_LOG_FORMAT), with the ids
of the work a line is about, and probes kept out of the info log.

Ids travel in one context variable holding a small dict per unit of work: the API's request
middleware (:class:`rewardd.service.logs.RequestContext`) binds ``request_id`` (and the
request's state, from which ``tenant`` is read once the API key resolved it), a job binds
``job_id``, a worker child binds ``task_id``, ``queue`` and ``verifier`` around each Celery
task. A filter on the handlers copies them onto every record, so any logger's lines carry
them, also those of libraries, and asyncio tasks started during a request inherit them.

Hand-written rather than python-json-logger: the formatter is twenty lines of stdlib and the
API and worker images then need no extra dependency; the field set is fixed here, so log
collectors can rely on it: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the
ids present, ``exc`` (a traceback) when there is one.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import logging.config
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping

IDS = ("request_id", "job_id", "flow_id", "task_id", "tenant", "queue", "verifier")
"""Context fields a record carries (when bound)."""

PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths whose access lines are logged at debug only: scraped and probed every few seconds,
they would drown the lines that matter."""

_context: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "rewardd_log_context", default=None)


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to the log context of the code inside (and of tasks it starts)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> contextvars.Token:
    """Add ``fields`` until :func:`unbind` with the returned token (for signal pairs, such
    as Celery's task_prerun and task_postrun, where no ``with`` block fits)."""
    return _context.set({**(_context.get() or {}), **fields})


def unbind(token: contextvars.Token) -> None:
    _context.reset(token)


def current() -> dict[str, str]:
    """The ids bound now, as strings (``tenant`` read from the request state if resolved)."""
    context = _context.get() or {}
    out = {key: str(context[key]) for key in IDS if context.get(key) is not None}
    state = context.get("state")
    tenant = getattr((state or {}).get("tenant"), "name", None) if isinstance(state, dict) \
        else None
    if tenant and "tenant" not in out:
        out["tenant"] = tenant
    return out


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record (``record.ids``, a dict; ``record.context``,
    ``key=value`` words for text lines; and one attribute each); drops access lines of probes
    unless the access logger is at debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.access" and _is_probe(record) \
                and not logging.getLogger("uvicorn.access").isEnabledFor(logging.DEBUG):
            return False
        ids = current()
        record.ids = ids
        record.context = " ".join(f"{key}={value}" for key, value in ids.items()) or "-"
        for key, value in ids.items():
            setattr(record, key, value)
        return True


def _is_probe(record: logging.LogRecord) -> bool:
    args = record.args if isinstance(record.args, tuple) else ()
    path = str(args[2]) if len(args) > 2 else ""
    return path.split("?", 1)[0] in PROBE_PATHS


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, the bound ids,
    and ``exc`` when the record has a traceback. Uvicorn's access lines also get
    ``method``, ``path`` and ``status``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "ids", {}),
        }
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) \
                and len(record.args) >= 5:
            _, method, path, _, status = record.args[:5]
            line.update(method=method, path=path, status=status)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


FLOW_HEADER = "rewardd_flow"
TENANT_HEADER = "rewardd_tenant"
"""Celery message headers a worker binds as ``flow_id`` and ``tenant`` around a task: the
API's fair-queue flow (a request's or a job's id) and its tenant, when the publisher sets
them (``apply_async(headers={FLOW_HEADER: flow.id, TENANT_HEADER: flow.tenant})``); Celery
exposes message headers as attributes of ``task.request``."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(context)s] %(message)s"


def logging_config(fmt: str, level: str) -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` for ``fmt`` (json or text) at ``level``: uvicorn's
    loggers and the root (every rewardd and library logger) on stderr, each line with the
    bound ids; usable as uvicorn's ``log_config``."""
    level = level.upper()
    formatter: dict[str, Any] = {"()": f"{__name__}.JsonFormatter"} if fmt == "json" else \
        {"format": TEXT_FORMAT}
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
               "formatter": "main", "filters": ["context"]}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": f"{__name__}.ContextFilter"}},
        "formatters": {"main": formatter},
        "handlers": {"main": handler},
        "root": {"handlers": ["main"], "level": level},
        "loggers": {
            "uvicorn": {"handlers": ["main"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["main"], "level": level, "propagate": False},
        },
    }


def configure(fmt: str, level: str) -> None:
    """Configure this process's logging (:func:`logging_config`)."""
    logging.config.dictConfig(logging_config(fmt, level))


def configure_worker(fmt: str, level: str) -> None:
    """In ``rewardd worker`` before Celery starts: Celery leaves logging to us
    (``setup_logging`` connected), and each task runs with ``task_id``, ``queue`` and
    ``verifier`` bound."""
    from celery import signals

    def setup(**_: Any) -> None:
        configure(fmt, level)

    tokens: dict[str, contextvars.Token] = {}

    def prerun(task_id: str = "", task: Any = None, args: Any = None, **_: Any) -> None:
        request = getattr(task, "request", None)
        info = getattr(request, "delivery_info", None) or {}
        verifier = args[0] if args and isinstance(args[0], str) else None
        # what the publisher put in the message's headers (FLOW_HEADER, TENANT_HEADER)
        tokens[task_id] = bind(task_id=task_id, queue=info.get("routing_key"),
                               verifier=verifier,
                               flow_id=getattr(request, FLOW_HEADER, None),
                               tenant=getattr(request, TENANT_HEADER, None))

    def postrun(task_id: str = "", **_: Any) -> None:
        token = tokens.pop(task_id, None)
        if token is not None:
            with contextlib.suppress(ValueError):
                unbind(token)

    signals.setup_logging.connect(setup, weak=False)
    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)
