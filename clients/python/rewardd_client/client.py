"""Python client for rewardd (httpx; sync and async; JSON or msgpack on the wire).

    from rewardd_client import RewarddClient
    with RewarddClient("http://127.0.0.1:8000", wire="msgpack") as client:
        result = client.score(request_dict)

Requests may be dicts or pydantic models (anything with ``model_dump``); responses are plain
dicts shaped like ``ScoreResponse``. A 4xx or 5xx raises :class:`RewarddError` carrying the
server's ``detail`` (field paths and reasons).
"""

from __future__ import annotations

from typing import Any, Literal

import gc
from contextlib import contextmanager
from typing import Iterator

import httpx
import msgpack

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

Wire = Literal["json", "msgpack"]
_MEDIA = {"json": "application/json", "msgpack": "application/msgpack"}


class RewarddError(Exception):
    """A non-2xx response; ``detail`` is the server's explanation."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"rewardd answered {status}: {detail}")
        self.status = status
        self.detail = detail


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


def _decode(response: httpx.Response) -> Any:
    media = response.headers.get("content-type", "")
    with _gc_paused():
        if media.startswith("application/msgpack"):
            data = msgpack.unpackb(response.content, raw=False, strict_map_key=False)
        elif media.startswith("application/json"):
            data = _json_loads(response.content)
        else:
            data = response.text
    if response.is_error:
        raise RewarddError(response.status_code,
                           data.get("detail", data) if isinstance(data, dict) else data)
    return data


class _Base:
    def __init__(self, base_url: str, wire: Wire, api_key: str | None) -> None:
        self.wire = wire
        self.base_url = base_url.rstrip("/")
        self.headers = {"Content-Type": _MEDIA[wire], "Accept": _MEDIA[wire]}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"


class RewarddClient(_Base):
    """Blocking client."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, wire: Wire = "json",
                 api_key: str | None = None, timeout: float = 600.0) -> None:
        super().__init__(base_url, wire, api_key)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout)

    def _post(self, path: str, body: Any) -> Any:
        return _decode(self._http.post(path, content=_encode(body, self.wire)))

    def _get(self, path: str) -> Any:
        return _decode(self._http.get(path))

    def score(self, request: Any) -> dict[str, Any]:
        return self._post("/v1/score", request)

    def rewards(self, request: Any) -> dict[str, Any]:
        return self._post("/v1/rewards", request)

    def advantages(self, request: Any) -> dict[str, Any]:
        return self._post("/v1/advantages", request)

    def verify(self, verifier: str, completion: str, reference: dict | None = None,
               params: dict | None = None, **extra: Any) -> dict[str, Any]:
        body = {"completion": completion, "reference": reference or {}, "params": params or {},
                **extra}
        return self._post(f"/v1/verify/{verifier}", body)

    def verifiers(self) -> list[dict[str, Any]]:
        return self._get("/v1/verifiers")

    def estimators(self) -> list[dict[str, Any]]:
        return self._get("/v1/estimators")

    def health(self) -> dict[str, Any]:
        return self._get("/healthz")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewarddClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRewarddClient(_Base):
    """Asyncio client with the same methods as :class:`RewarddClient`, awaited."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, wire: Wire = "json",
                 api_key: str | None = None, timeout: float = 600.0) -> None:
        super().__init__(base_url, wire, api_key)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                       timeout=timeout)

    async def _post(self, path: str, body: Any) -> Any:
        return _decode(await self._http.post(path, content=_encode(body, self.wire)))

    async def _get(self, path: str) -> Any:
        return _decode(await self._http.get(path))

    async def score(self, request: Any) -> dict[str, Any]:
        return await self._post("/v1/score", request)

    async def rewards(self, request: Any) -> dict[str, Any]:
        return await self._post("/v1/rewards", request)

    async def advantages(self, request: Any) -> dict[str, Any]:
        return await self._post("/v1/advantages", request)

    async def verify(self, verifier: str, completion: str, reference: dict | None = None,
                     params: dict | None = None, **extra: Any) -> dict[str, Any]:
        body = {"completion": completion, "reference": reference or {}, "params": params or {},
                **extra}
        return await self._post(f"/v1/verify/{verifier}", body)

    async def verifiers(self) -> list[dict[str, Any]]:
        return await self._get("/v1/verifiers")

    async def estimators(self) -> list[dict[str, Any]]:
        return await self._get("/v1/estimators")

    async def health(self) -> dict[str, Any]:
        return await self._get("/healthz")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRewarddClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
