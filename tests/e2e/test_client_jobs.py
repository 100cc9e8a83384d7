"""rewardd_client's jobs and typed errors against a real ``rewardd serve`` (the session's
``server``: embedded pool of 2, the faulty test verifiers loaded).

Jobs sleep on purpose (test_sleep on one rollout per group) so events arrive over time; no
assertion is on time. A dropped event stream is made real by a TCP proxy between client and
server that cuts the first connection right after it forwarded a ``group`` event.
"""

from __future__ import annotations

import re
import socket
import threading
import uuid
from typing import Any, Iterator

import pytest

from rewardd_client import (AsyncRewarddClient, InvalidRequest, JobFailed, NotFound,
                            PayloadTooLarge, RetryPolicy, RewarddClient)
from tests.conftest import SERVER_MAX_BODY_BYTES

pytestmark = pytest.mark.e2e


def sleepy(groups: int = 3, seconds: float = 0.3, tag: str = "s") -> dict[str, Any]:
    """Each group: one rollout that sleeps ``seconds`` then scores 1.0, and echoes 0 and 1."""
    return {"groups": [{"group_id": f"{tag}{g}", "rollouts": [
        {"rollout_id": f"{tag}{g}r{r}", "completion": c, "num_tokens": 2}
        for r, c in enumerate(["zz", "0", "1"])]} for g in range(groups)],
        "rewards": [{"name": "s", "verifier": "test_sleep",
                     "params": {"seconds": seconds, "when": ["zz"]}}],
        "advantage": {"estimator": "grpo", "output": "rle"}}


def key() -> str:
    return f"test-{uuid.uuid4().hex}"  # the session's server remembers every key


def stored(events: list[Any]) -> list[tuple[str, int, Any]]:
    """The events the server stores (those with ids), comparable."""
    return [(e.event, e.id, e.data) for e in events if e.id is not None]


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_a_submit_repeated_with_its_key_is_the_same_job_and_its_result_is_score(
        server: str, wire: str) -> None:
    body, idem = sleepy(tag=f"k{wire}"), key()
    with RewarddClient(server, wire=wire) as client:
        first = client.submit_job(body, idempotency_key=idem)
        again = client.submit_job(body, idempotency_key=idem)
        other = client.submit_job(body)  # a fresh key of its own
        assert again["id"] == first["id"] and other["id"] != first["id"]
        assert first["links"] == {"status": f"/v1/jobs/{first['id']}",
                                  "events": f"/v1/jobs/{first['id']}/events"}
        result = client.result(first["id"])
        assert result == client.score(body)
        job = client.get_job(first["id"])
        assert job["state"] == "succeeded" and job["progress"] == {"done": 9, "total": 9}
        assert job["result"] == result


def test_a_key_reused_with_another_body_is_invalid_at_the_header(server: str) -> None:
    idem = key()
    with RewarddClient(server) as client:
        client.submit_job(sleepy(1, 0.0, "r"), idempotency_key=idem)
        with pytest.raises(InvalidRequest) as info:
            client.submit_job(sleepy(2, 0.0, "r"), idempotency_key=idem)
    (error,) = info.value.errors
    assert error.path == "header.Idempotency-Key" and error.type == "idempotency_key_reused"
    assert "already used for a different request body" in str(info.value)


def test_events_are_progress_groups_then_the_end_and_resume_after_an_id(server: str) -> None:
    with RewarddClient(server) as client:
        job = client.submit_job(sleepy(4, 0.3, "e"))
        live = list(client.iter_events(job["id"]))
        replay = list(client.iter_events(job["id"]))
        groups = [e for e in live if e.event == "group"]
        assert sorted(e.data["group_index"] for e in groups) == [0, 1, 2, 3]
        assert live[-1].event == "succeeded" and live[-1].data["id"] == job["id"]
        assert {e.event for e in live} <= {"progress", "group", "succeeded"}
        assert stored(replay) == stored(live)  # ids are the job's, stable across streams
        cut = groups[1].id
        resumed = list(client.iter_events(job["id"], last_event_id=cut))
        assert stored(resumed) == [s for s in stored(live) if s[1] > cut]
        result = client.get_job(job["id"])["result"]
    # group events carry the final rewards
    final = {r["rollout_id"]: r["reward"] for g in result["groups"] for r in g["rollouts"]}
    assert {r["rollout_id"]: r["reward"] for e in groups for r in e.data["rollouts"]} == final


def test_resuming_after_the_final_event_ends_at_once(server: str) -> None:
    with RewarddClient(server) as client:
        job = client.submit_job(sleepy(1, 0.0, "f"))
        last = list(client.iter_events(job["id"]))[-1]
        assert list(client.iter_events(job["id"], last_event_id=last.id)) == []


def test_cancel_ends_an_active_job_and_result_raises_job_failed(server: str) -> None:
    with RewarddClient(server) as client:
        job = client.submit_job(sleepy(2, 4.0, "c"))
        cancelled = client.cancel_job(job["id"])
        assert cancelled["state"] == "cancelled" and cancelled["result"] is None
        assert client.cancel_job(job["id"])["state"] == "cancelled"  # idempotent
        events = list(client.iter_events(job["id"]))
        assert events[-1].event == "cancelled"
        with pytest.raises(JobFailed) as info:
            client.result(job["id"])
    assert info.value.job["state"] == "cancelled" and info.value.status is None


def test_an_unknown_job_is_not_found_everywhere(server: str) -> None:
    missing = uuid.uuid4().hex
    with RewarddClient(server) as client:
        for call in (client.get_job, client.cancel_job,
                     lambda i: list(client.iter_events(i))):
            with pytest.raises(NotFound) as info:
                call(missing)
            assert info.value.status == 404 and missing in str(info.value)


async def test_async_client_submits_streams_and_waits(server: str) -> None:
    body = sleepy(2, 0.2, "a")
    async with AsyncRewarddClient(server, wire="msgpack") as client:
        job = await client.submit_job(body)
        events = [e async for e in client.iter_events(job["id"])]
        assert events[-1].event == "succeeded"
        assert sorted(e.data["group_index"] for e in events if e.event == "group") == [0, 1]
        assert await client.result(job["id"]) == await client.score(body)


# ---- typed errors from the real server ----------------------------------------------------

@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_an_invalid_body_is_invalid_request_with_field_paths(server: str, wire: str) -> None:
    body = sleepy(1, 0.0, "i")
    body["groups"][0]["rollouts"][1]["num_tokens"] = -1
    with RewarddClient(server, wire=wire) as client:
        for call in (client.score, client.submit_job):
            with pytest.raises(InvalidRequest) as info:
                call(body)
            assert info.value.status == 422
            paths = [e.path for e in info.value.errors]
            assert paths == ["body.groups.0.rollouts.1.num_tokens"]
            assert info.value.errors[0].loc == ("body", "groups", 0, "rollouts", 1, "num_tokens")
            assert str(info.value).startswith(
                "rewardd answered 422: body.groups.0.rollouts.1.num_tokens: ")


def test_an_oversized_body_is_payload_too_large(server: str) -> None:
    body = sleepy(1, 0.0, "o")
    body["groups"][0]["rollouts"][0]["completion"] = "x" * (SERVER_MAX_BODY_BYTES + 1024)
    with RewarddClient(server) as client, pytest.raises(PayloadTooLarge) as info:
        client.score(body)
    assert "REWARDD_MAX_BODY_BYTES" in str(info.value)
    assert str(info.value).endswith("split the batch into smaller requests")


# ---- a dropped event stream --------------------------------------------------------------

class CuttingProxy:
    """TCP proxy to ``upstream`` that closes the first connection whose answer carried a
    ``group`` event, right after forwarding it; records what clients sent."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent: list[bytes] = []
        self.cuts = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream)

        def forward_requests() -> None:
            try:
                while data := client.recv(65536):
                    with self.lock:
                        self.sent.append(data)
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=forward_requests, daemon=True).start()
        try:
            while data := upstream.recv(65536):
                client.sendall(data)
                with self.lock:
                    cut = self.cuts == 0 and b"event: group" in data
                    self.cuts += cut
                if cut:
                    break
        except OSError:
            pass
        for sock in (client, upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def stream_requests(self) -> list[str]:
        with self.lock:
            raw = b"".join(self.sent).decode("latin-1")
        return [head for head in raw.split("\r\n\r\n") if "/events " in head]

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def cutting_proxy(server: str) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(server)
    yield proxy
    proxy.close()


def test_a_dropped_stream_resumes_from_the_last_id_without_loss_or_repeats(
        server: str, cutting_proxy: CuttingProxy) -> None:
    with RewarddClient(server) as direct:
        job = direct.submit_job(sleepy(4, 0.3, "d"))
    with RewarddClient(cutting_proxy.url, retry=RetryPolicy(backoff_s=0.05)) as client:
        seen = list(client.iter_events(job["id"]))
        replay = list(client.iter_events(job["id"]))
    assert cutting_proxy.cuts == 1
    first, second = cutting_proxy.stream_requests()[:2]
    assert not re.search(r"(?i)last-event-id", first)
    resumed_from = int(re.search(r"(?i)last-event-id: (\d+)", second).group(1))
    ids = [e.id for e in seen if e.id is not None]
    assert resumed_from in ids
    assert ids == sorted(set(ids))  # each stored event once, in order
    assert stored(seen) == stored(replay)  # and none missing
    assert sorted(e.data["group_index"] for e in seen if e.event == "group") == [0, 1, 2, 3]
    assert seen[-1].event == "succeeded"
