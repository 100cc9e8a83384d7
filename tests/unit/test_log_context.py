"""Issue 21 B, logs: the ids a log line carries where work happens. The executor below
records :func:`rewardd.workers.logs.current` when the API hands it a batch, so the test sees
exactly what a log line written there (by the pipeline, a verifier call, an error handler)
would carry: for a request its request id and tenant, for a job also the job id. The JSON
format and the probe filter on real records."""

from __future__ import annotations

import io
import json
import logging
from typing import Any, Sequence

import httpx

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.verifiers.base import Outcome
from rewardd.workers import logs
from rewardd.workers.executor import CallResult, ItemResult, VerifyCall
from tests.support.executors import RefusingExecutor
from tests.support.jobs import final

BODY = {"groups": [{"group_id": "g", "rollouts": [
    {"rollout_id": "a", "completion": "x", "num_tokens": 2},
    {"rollout_id": "b", "completion": "y", "num_tokens": 2}]}],
    "rewards": [{"name": "r", "verifier": "regex", "params": {"pattern": "x"}}],
    "advantage": {"estimator": "grpo", "output": "none"},
    "cache": False}  # each request reaches the executor (the verdict cache would answer)


class RecordingExecutor(RefusingExecutor):
    """Reward 1 for every sample; remembers the log context of each batch."""

    kind = "recording"

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[dict[str, str]] = []

    async def run(self, calls: Sequence[VerifyCall], progress: Any = None,
                  on_call_done: Any = None) -> list[CallResult]:
        self.contexts.append(logs.current())
        results = [CallResult([ItemResult(Outcome.success(1.0), 0.0) for _ in call.samples])
                   for call in calls]
        if on_call_done is not None:
            for index, result in enumerate(results):
                on_call_done(index, result)
        return results


async def test_request_and_job_work_carry_request_job_and_tenant_ids() -> None:
    executor = RecordingExecutor()
    app = create_app(Settings(api_keys="k1=acme"), executor=executor)
    auth = {"Authorization": "Bearer k1"}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://rewardd") as http:
            resp = await http.post("/v1/score", json=BODY,
                                   headers={**auth, "X-Request-ID": "step-17.a"})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-request-id"] == "step-17.a"
            bad = await http.post("/v1/score", json=BODY,
                                  headers={**auth, "X-Request-ID": "no spaces\tor tabs"})
            assert bad.status_code == 200 and len(bad.headers["x-request-id"]) == 32
            job = (await http.post("/v1/jobs", json=BODY, headers=auth)).json()
            assert (await final(http, job["id"], auth))["state"] == "succeeded"
    request, generated, in_job = executor.contexts
    assert request == {"request_id": "step-17.a", "tenant": "acme"}
    assert generated == {"request_id": bad.headers["x-request-id"], "tenant": "acme"}
    assert in_job["job_id"] == job["id"] and in_job["tenant"] == "acme"


LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")


def records_through(fmt: str, level: str, emit: Any) -> list[str]:
    """Lines the configured handler writes while ``emit()`` logs; the loggers' previous
    handlers, levels and propagation are restored afterwards (pytest's capture included)."""
    saved = [(logging.getLogger(name), list(logging.getLogger(name).handlers),
              logging.getLogger(name).level, logging.getLogger(name).propagate)
             for name in LOGGERS]
    logs.configure(fmt, level)
    stream = io.StringIO()
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        emit()
    finally:
        for logger, handlers, old_level, propagate in saved:
            logger.handlers[:] = handlers
            logger.setLevel(old_level)
            logger.propagate = propagate
    return stream.getvalue().splitlines()


def access(path: str, status: int = 200) -> None:
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5",
                                             "GET", path, "1.1", status)


def test_json_lines_carry_bound_ids_and_probes_are_debug_only() -> None:
    def emit() -> None:
        with logs.bound(request_id="r1", tenant="acme"):
            access("/v1/jobs/abc")
            access("/healthz")
            access("/metrics?x=1")
        with logs.bound(task_id="t-9", queue="cpu", verifier="math"):
            logging.getLogger("rewardd.test").warning("slow %s", "check")

    lines = [json.loads(line) for line in records_through("json", "info", emit)]
    assert [line.get("path") for line in lines] == ["/v1/jobs/abc", None]
    assert lines[0]["request_id"] == "r1" and lines[0]["tenant"] == "acme"
    assert lines[0]["status"] == 200 and lines[0]["level"] == "info"
    assert lines[1]["message"] == "slow check" and lines[1]["task_id"] == "t-9"
    assert lines[1]["verifier"] == "math" and "request_id" not in lines[1]
    debug = records_through("json", "debug", emit)
    assert [json.loads(line).get("path") for line in debug][:3] == \
        ["/v1/jobs/abc", "/healthz", "/metrics?x=1"]


def test_text_lines_name_the_ids() -> None:
    def emit() -> None:
        with logs.bound(job_id="j-1"):
            logging.getLogger("rewardd.test").info("started")

    (line,) = records_through("text", "info", emit)
    assert line.endswith("INFO rewardd.test [job_id=j-1] started")
