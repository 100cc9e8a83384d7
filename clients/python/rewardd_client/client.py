"""Python client for rewardd (httpx; sync and async; JSON or msgpack on the wire).

    from rewardd_client import RewarddClient
    with RewarddClient("http://127.0.0.1:8000", wire="msgpack") as client:
        result = client.score(request_dict)
        job = client.submit_job(request_dict)
        for event in client.iter_events(job["id"]):
            ...
        final = client.result(job["id"])

Requests may be dicts or pydantic models (anything with ``model_dump``); responses are plain
dicts shaped like the server's models. Errors are typed (:mod:`rewardd_client.errors`).

Design:

* One set of request methods (:class:`_Api`) serves both clients: each method calls
  ``self._call``, which the blocking client implements with a plain return and the asyncio
  client as a coroutine, so ``await async_client.score(...)`` works without a second copy of
  every method (redis-py's command mixins do the same). Only what must differ (the retry
  loop's sleep, the event stream's iteration) is written twice, around shared state
  machines (:class:`rewardd_client.retry.Retrying`, :class:`rewardd_client.jobs.EventCursor`).
* Retries: :mod:`rewardd_client.retry` (429 and 503 for every call, honouring
  ``Retry-After``; a lost connection only where resending is safe).
* Bodies are encoded once per call, whatever the number of attempts.
"""

from __future__ import annotations

import asyncio
import gc
import time
import urllib.parse
import uuid
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Literal, Mapping

import httpx
import msgpack

from rewardd_client.errors import RewarddError, error_for
from rewardd_client.jobs import AsyncJobs, SyncJobs
from rewardd_client.retry import RetryEvent, RetryPolicy, Retrying, retry_after_seconds

try:  # optional: several times faster on large batches
    import orjson

    def _json_dumps(body: Any) -> bytes:
        return orjson.dumps(body)

    _json_loads = orjson.loads
except ImportError:  # pragma: no cover - exercised in the client-only environment test
    import json

    def _json_dumps(body: Any) -> bytes:
        return json.dumps(body, separators=(",", ":")).encode()

    _json_loads = json.loads

__all__ = ["AsyncRewarddClient", "RetryEvent", "RetryPolicy", "RewarddClient", "RewarddError"]

Wire = Literal["json", "msgpack"]
_MEDIA = {"json": "application/json", "msgpack": "application/msgpack"}
_MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")


# ---- wire ----------------------------------------------------------------------------------

@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding a batch builds ~10 small acyclic objects per rollout; the cyclic collector
    rescanning them midway costs more than the decode (see rewardd's gcpause module)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _encode(body: Any, wire: Wire) -> bytes:
    if hasattr(body, "model_dump"):  # a pydantic model of the contract
        body = body.model_dump(mode="json", exclude_none=True)
    return msgpack.packb(body, use_bin_type=True) if wire == "msgpack" else _json_dumps(body)


def _decode(response: httpx.Response, attempts: int = 1) -> Any:
    """The body as Python data; a typed :class:`RewarddError` for an error status."""
    media = response.headers.get("content-type", "")
    with _gc_paused():
        if media.startswith(_MSGPACK_TYPES):
            data = msgpack.unpackb(response.content, raw=False, strict_map_key=False)
        elif media.startswith("application/json"):
            data = _json_loads(response.content)
        else:
            data = response.text
    if response.is_error:
        detail = data.get("detail", data) if isinstance(data, dict) else data
        raise error_for(response.status_code, detail, attempts=attempts,
                        retry_after=retry_after_seconds(response.headers.get("retry-after")))
    return data


# ---- the methods both clients share ----------------------------------------------------------

class _Api:
    """Request methods shared by both clients. In :class:`AsyncRewarddClient` each returns
    an awaitable of what the blocking client returns."""

    wire: Wire

    def _call(self, method: str, path: str, body: Any = None, *, resendable: bool = False,
              headers: Mapping[str, str] | None = None) -> Any:
        raise NotImplementedError

    def _post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body)

    def _get(self, path: str) -> Any:
        return self._call("GET", path, resendable=True)

    def score(self, request: Any) -> Any:
        """POST /v1/score: verify every rollout, then advantages (``ScoreResponse``)."""
        return self._post("/v1/score", request)

    def rewards(self, request: Any) -> Any:
        """POST /v1/rewards: verify every rollout, no advantages."""
        return self._post("/v1/rewards", request)

    def advantages(self, request: Any) -> Any:
        """POST /v1/advantages: advantages from rewards the rollouts carry."""
        return self._post("/v1/advantages", request)

    def verify(self, verifier: str, completion: str, reference: dict | None = None,
               params: dict | None = None, **extra: Any) -> Any:
        """POST /v1/verify/{verifier}: one completion, for debugging a verifier."""
        body = {"completion": completion, "reference": reference or {}, "params": params or {},
                **extra}
        return self._post(f"/v1/verify/{verifier}", body)

    def verifiers(self) -> Any:
        """GET /v1/verifiers: the verifier catalogue (names, references, parameters)."""
        return self._get("/v1/verifiers")

    def estimators(self) -> Any:
        """GET /v1/estimators: the advantage catalogue."""
        return self._get("/v1/estimators")

    def health(self) -> Any:
        """GET /healthz."""
        return self._get("/healthz")

    def submit_job(self, request: Any, idempotency_key: str | None = None) -> Any:
        """POST /v1/jobs: run a /v1/score body in the background; ``{"id", "state",
        "links"}``. Sent with an ``Idempotency-Key`` (a fresh one unless given), so a submit
        whose answer was lost is resent safely, and the same key returns the same job: pass
        your own (at most 255 characters) to make a retry across process restarts safe."""
        key = idempotency_key if idempotency_key is not None else uuid.uuid4().hex
        return self._call("POST", "/v1/jobs", request, resendable=True,
                          headers={"Idempotency-Key": key})

    def get_job(self, job_id: str) -> Any:
        """GET /v1/jobs/{id}: state, progress and, once succeeded, ``result``."""
        return self._get(f"/v1/jobs/{job_id}")

    def cancel_job(self, job_id: str) -> Any:
        """DELETE /v1/jobs/{id}: cancel (idempotent); the job's state afterwards (a job that
        had already finished keeps its final state)."""
        return self._call("DELETE", f"/v1/jobs/{job_id}", resendable=True)

    # ---- the run record (docs/records.md) ----

    def runs(self, limit: int = 100) -> Any:
        """GET /v1/runs: this key's tenant's recorded runs, the most recently scored first
        (``{"runs": [{"run_id", "first_at", "last_at", "last_step", "rollouts"}]}``)."""
        return self._get(_with_query("/v1/runs", limit=limit))

    def run(self, run_id: str, steps: int = 20) -> Any:
        """GET /v1/runs/{run_id}: its state, its record and per-step summaries of its last
        ``steps`` steps (newest first)."""
        return self._get(_with_query(f"/v1/runs/{_segment(run_id)}", steps=steps))

    def run_rollouts(self, run_id: str, *, step: int | None = None, source: str | None = None,
                     component: str | None = None, outcome: str | None = None,
                     q: str | None = None, cursor: str | None = None,
                     limit: int = 100) -> Any:
        """GET /v1/runs/{run_id}/rollouts: one page of its recorded rollouts (verdicts,
        evidence, completion), filtered; pass the page's ``next_cursor`` as ``cursor`` for
        the next (None: the last page)."""
        return self._get(_with_query(f"/v1/runs/{_segment(run_id)}/rollouts", step=step,
                                     source=source, component=component, outcome=outcome,
                                     q=q, cursor=cursor, limit=limit))

    def reverify(self, run_id: str, *, steps: tuple[int, int] | None = None,
                 set: dict[str, Any] | None = None,
                 idempotency_key: str | None = None) -> Any:
        """POST /v1/runs/{run_id}/reverify: re-score the run's recorded rollouts with
        today's verifiers, or parameters changed by ``set`` (``{"component.param": value}``),
        as a job (``{"id", "state", "links"}``); its ``result`` (``result(id)``) lists the
        ``flips`` with both receipts and a ``summary``."""
        body: dict[str, Any] = {"set": dict(set or {})}
        if steps is not None:
            body["steps"] = list(steps)
        key = idempotency_key if idempotency_key is not None else uuid.uuid4().hex
        return self._call("POST", f"/v1/runs/{_segment(run_id)}/reverify", body,
                          resendable=True, headers={"Idempotency-Key": key})


def _segment(value: str) -> str:
    """A path segment: run ids may hold ``/`` and other characters a URL reserves."""
    return urllib.parse.quote(value, safe="")


def _with_query(path: str, **params: Any) -> str:
    present = {k: v for k, v in params.items() if v is not None}
    return f"{path}?{urllib.parse.urlencode(present)}" if present else path


class _Base(_Api):
    def __init__(self, base_url: str, wire: Wire, api_key: str | None,
                 retry: RetryPolicy | None, max_retries: int | None) -> None:
        if wire not in _MEDIA:
            raise ValueError(f"wire must be 'json' or 'msgpack', not {wire!r}")
        self.wire = wire
        self.base_url = base_url.rstrip("/")
        self.headers = {"Content-Type": _MEDIA[wire], "Accept": _MEDIA[wire]}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        retry = retry or RetryPolicy()
        self.retry = retry if max_retries is None else replace(retry, max_retries=max_retries)

    def _request(self, http: httpx.Client | httpx.AsyncClient, method: str, path: str,
                 body: Any, headers: Mapping[str, str] | None) -> httpx.Request:
        content = _encode(body, self.wire) if body is not None else None
        return http.build_request(method, path, content=content, headers=headers)


class RewarddClient(SyncJobs, _Base):
    """Blocking client.

    ``retry`` sets the retry policy (:class:`RetryPolicy`); ``max_retries`` overrides just
    its number of retries (0: none). ``timeout`` bounds each network operation (connect,
    each read, each write), not the whole call.
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, wire: Wire = "json",
                 api_key: str | None = None, timeout: float = 600.0,
                 retry: RetryPolicy | None = None, max_retries: int | None = None) -> None:
        super().__init__(base_url, wire, api_key, retry, max_retries)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout)

    def _send(self, method: str, path: str, body: Any = None, *, resendable: bool = False,
              headers: Mapping[str, str] | None = None,
              stream: bool = False) -> tuple[httpx.Response, int]:
        """The final response and the attempts it took, after retries. A streamed
        response with an error status is read and raised; others are returned whatever
        their status."""
        request = self._request(self._http, method, path, body, headers)
        retrying = Retrying(self.retry, method, path, resendable)
        while True:
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                wait = retrying.after_error(exc)
            else:
                wait = retrying.wait_after(response)
                if wait is None:
                    if stream and response.is_error:
                        response.read()
                        _decode(response, retrying.attempts)
                    return response, retrying.attempts
                response.close()
            time.sleep(wait)

    def _call(self, method: str, path: str, body: Any = None, *, resendable: bool = False,
              headers: Mapping[str, str] | None = None) -> Any:
        return _decode(*self._send(method, path, body, resendable=resendable, headers=headers))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewarddClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRewarddClient(AsyncJobs, _Base):
    """Asyncio client with the same methods and options as :class:`RewarddClient`, awaited
    (``iter_events`` is an async iterator)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, wire: Wire = "json",
                 api_key: str | None = None, timeout: float = 600.0,
                 retry: RetryPolicy | None = None, max_retries: int | None = None) -> None:
        super().__init__(base_url, wire, api_key, retry, max_retries)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                       timeout=timeout)

    async def _send(self, method: str, path: str, body: Any = None, *,
                    resendable: bool = False, headers: Mapping[str, str] | None = None,
                    stream: bool = False) -> tuple[httpx.Response, int]:
        request = self._request(self._http, method, path, body, headers)
        retrying = Retrying(self.retry, method, path, resendable)
        while True:
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                wait = retrying.after_error(exc)
            else:
                wait = retrying.wait_after(response)
                if wait is None:
                    if stream and response.is_error:
                        await response.aread()
                        _decode(response, retrying.attempts)
                    return response, retrying.attempts
                await response.aclose()
            await asyncio.sleep(wait)

    async def _call(self, method: str, path: str, body: Any = None, *,
                    resendable: bool = False, headers: Mapping[str, str] | None = None) -> Any:
        response, attempts = await self._send(method, path, body, resendable=resendable,
                                              headers=headers)
        return _decode(response, attempts)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRewarddClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
