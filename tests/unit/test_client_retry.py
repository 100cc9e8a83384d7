"""rewardd_client retries against a real HTTP server on 127.0.0.1 that answers a script.

Waits are checked through the policy's ``on_retry`` events and the server's request count;
the only clock assertions are lower bounds (the server saw the retry no sooner than the
Retry-After asked), which a loaded machine cannot break.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import httpx
import pytest

from rewardd_client import (AsyncRewarddClient, ConnectionFailed, InvalidRequest, RetryEvent,
                            RetryPolicy, RewarddClient, ServerError, TooBusy, Unavailable)
from rewardd_client.retry import retry_after_seconds
from tests.support.server import free_port

DROP = "drop"  # script step: read the request, close the connection without an answer


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    at: float


@dataclass
class Script:
    """Answers in order (``(status, headers, body)`` or DROP); the last one repeats."""

    steps: list[Any]
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, seen: Seen) -> Any:
        with self.lock:
            self.seen.append(seen)
            return self.steps[min(len(self.seen), len(self.steps)) - 1]


def handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            step = script.next(Seen(self.command, self.path, dict(self.headers),
                                    time.monotonic()))
            if step == DROP:
                self.close_connection = True
                return
            status, headers, body = step
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def scripted() -> Iterator[Any]:
    """``start(steps)`` -> (base URL, Script); servers stop at the end of the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(*steps: Any) -> tuple[str, Script]:
        script = Script(list(steps))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler(script))
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", script

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


OK = (200, {}, {"status": "ok"})


def busy(retry_after: str | None = None, status: int = 429) -> tuple[int, dict, dict]:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return status, headers, {"detail": "tenant 'default' is at its limit of 1"}


def recording(**options: Any) -> tuple[RetryPolicy, list[RetryEvent]]:
    events: list[RetryEvent] = []
    return RetryPolicy(on_retry=events.append, **options), events


def test_429_is_retried_after_exactly_the_retry_after_seconds(scripted: Any) -> None:
    url, script = scripted(busy("1"), busy("1"), OK)
    policy, events = recording(jitter=0.0)
    with RewarddClient(url, retry=policy) as client:
        assert client.health() == {"status": "ok"}
    assert len(script.seen) == 3
    assert [(e.attempt, e.status, e.retry_after, e.wait_s) for e in events] == \
        [(1, 429, 1.0, 1.0), (2, 429, 1.0, 1.0)]
    gaps = [b.at - a.at for a, b in zip(script.seen, script.seen[1:])]
    assert min(gaps) >= 1.0  # honoured: never sooner than asked


def test_retry_after_jitter_only_ever_adds_up_to_its_fraction(scripted: Any) -> None:
    url, script = scripted(busy("1"), busy("1"), OK)
    policy, events = recording(jitter=0.25, rng=random.Random(7))
    with RewarddClient(url, retry=policy) as client:
        client.health()
    expected = random.Random(7)
    assert [e.wait_s for e in events] == [1 + expected.uniform(0, 0.25) for _ in range(2)]
    assert all(1.0 <= e.wait_s <= 1.25 for e in events)


def test_503_without_retry_after_backs_off_exponentially_with_equal_jitter(scripted: Any
                                                                         ) -> None:
    url, script = scripted(busy(status=503), busy(status=503), busy(status=503), OK)
    policy, events = recording(backoff_s=0.02, rng=random.Random(3))
    with RewarddClient(url, retry=policy) as client:
        assert client.verifiers() == {"status": "ok"}
    expected = random.Random(3)
    ceilings = [0.02, 0.04, 0.08]
    assert [e.wait_s for e in events] == [c / 2 + expected.uniform(0, c / 2) for c in ceilings]
    assert [e.retry_after for e in events] == [None] * 3
    assert len(script.seen) == 4


def test_backoff_is_capped_by_max_backoff() -> None:
    policy = RetryPolicy(backoff_s=1.0, max_backoff_s=3.0, rng=random.Random(0))
    assert all(1.5 <= policy.backoff(retry) <= 3.0 for retry in (3, 4, 10))


def test_exhausted_retries_raise_too_busy_with_the_attempts_and_retry_after(scripted: Any
                                                                           ) -> None:
    url, script = scripted(busy("0"))
    with RewarddClient(url, max_retries=2) as client, pytest.raises(TooBusy) as info:
        client.score({"groups": []})
    assert len(script.seen) == 3
    assert info.value.status == 429 and info.value.attempts == 3
    assert info.value.retry_after == 0.0
    assert str(info.value).startswith("rewardd answered 429 (after 3 attempts): tenant "
                                      "'default' is at its limit of 1; wait and retry")


def test_a_retry_after_past_the_total_wait_bound_is_raised_at_once(scripted: Any) -> None:
    url, script = scripted(busy("3600"), OK)
    policy, events = recording(max_wait_s=10.0)
    with RewarddClient(url, retry=policy) as client, pytest.raises(TooBusy) as info:
        client.health()
    assert len(script.seen) == 1 and events == []
    assert info.value.retry_after == 3600.0 and info.value.attempts == 1


def test_503_after_retries_is_unavailable(scripted: Any) -> None:
    url, script = scripted(busy("0", status=503))
    with RewarddClient(url, max_retries=1) as client, pytest.raises(Unavailable) as info:
        client.health()
    assert isinstance(info.value, ServerError) and info.value.attempts == 2
    assert len(script.seen) == 2


@pytest.mark.parametrize("status,error", [(500, ServerError), (422, InvalidRequest)])
def test_other_error_statuses_are_not_retried(scripted: Any, status: int, error: type) -> None:
    url, script = scripted((status, {}, {"detail": "no"}), OK)
    with RewarddClient(url) as client, pytest.raises(error):
        client.score({})
    assert len(script.seen) == 1


def test_max_retries_zero_turns_retries_off(scripted: Any) -> None:
    url, script = scripted(busy("0"), OK)
    with RewarddClient(url, max_retries=0) as client, pytest.raises(TooBusy):
        client.health()
    assert len(script.seen) == 1


def test_a_refused_connection_is_retried_even_for_score_then_raised() -> None:
    port = free_port()  # nothing listens there
    policy, events = recording(backoff_s=0.001, max_retries=3)
    with RewarddClient(f"http://127.0.0.1:{port}", retry=policy) as client, \
            pytest.raises(ConnectionFailed) as info:
        client.score({"groups": []})
    assert info.value.attempts == 4 and len(events) == 3
    assert info.value.status is None
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert "POST /v1/score: ConnectError" in str(info.value)


def test_a_connection_lost_mid_score_is_not_resent(scripted: Any) -> None:
    url, script = scripted(DROP, OK)
    with RewarddClient(url, retry=RetryPolicy(backoff_s=0.001)) as client, \
            pytest.raises(ConnectionFailed) as info:
        client.score({"groups": []})
    assert len(script.seen) == 1 and info.value.attempts == 1


def test_a_job_submit_lost_mid_request_is_resent_with_the_same_idempotency_key(
        scripted: Any) -> None:
    url, script = scripted(DROP, (202, {}, {"id": "j1", "state": "queued"}))
    with RewarddClient(url, retry=RetryPolicy(backoff_s=0.001)) as client:
        assert client.submit_job({"groups": []})["id"] == "j1"
    keys = [seen.headers["Idempotency-Key"] for seen in script.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) == 32
    with RewarddClient(url) as client:
        client.submit_job({"groups": []}, idempotency_key="batch-17")
    assert script.seen[-1].headers["Idempotency-Key"] == "batch-17"


@pytest.mark.parametrize("call", ["get_job", "cancel_job"])
def test_reads_and_cancels_lost_mid_request_are_resent(scripted: Any, call: str) -> None:
    url, script = scripted(DROP, (200, {}, {"id": "j1", "state": "cancelled"}))
    with RewarddClient(url, retry=RetryPolicy(backoff_s=0.001)) as client:
        assert getattr(client, call)("j1")["state"] == "cancelled"
    assert [(s.method, s.path) for s in script.seen] == \
        [("DELETE" if call == "cancel_job" else "GET", "/v1/jobs/j1")] * 2


async def test_async_client_retries_the_same_way(scripted: Any) -> None:
    url, script = scripted(busy("1"), DROP, (202, {}, {"id": "j2", "state": "queued"}))
    policy, events = recording(jitter=0.0, backoff_s=0.001)
    async with AsyncRewarddClient(url, retry=policy, wire="msgpack") as client:
        assert (await client.submit_job({"groups": []}))["id"] == "j2"
    assert len(script.seen) == 3
    assert [(e.status, e.wait_s) for e in events[:1]] == [(429, 1.0)]
    assert events[1].status is None and isinstance(events[1].error, httpx.TransportError)
    assert script.seen[0].headers["Content-Type"] == "application/msgpack"


# ---- Retry-After parsing -----------------------------------------------------------------

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("value,seconds", [
    ("2", 2.0), (" 7 ", 7.0), ("0", 0.0), ("1.5", 1.5),
    (format_datetime(NOW + timedelta(seconds=30), usegmt=True), 30.0),
    (format_datetime(NOW - timedelta(seconds=30), usegmt=True), 0.0),
    ("Thu, 03 Dec 2026 12:01:00 GMT", 60.0),
    (None, None), ("", None), ("soon", None),
])
def test_retry_after_reads_seconds_and_http_dates(value: str | None,
                                                  seconds: float | None) -> None:
    assert retry_after_seconds(value, now=NOW) == seconds
