"""Issue 28 rows 5 and 13 replayed against a real server's gRPC port.

Row 5: four unauthenticated 200 MB calls were parsed before the key was looked at (+1.9 GB,
/healthz stalled 4.2 s); an authenticated call over its tenant's limit was parsed too. Row
13: malformed protobuf was UNKNOWN without details, Structs deeper than 32 levels were
refused while REST takes 64, and a 10 KB job id echoed into NOT_FOUND overflowed the status
(the client saw RESOURCE_EXHAUSTED)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from rewardd.advantages.bounds import MAX_DEPTH
from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc import rewardd_pb2_grpc
from tests.grpc.requests import MALFORMED, chain_of, verify_bytes
from tests.support.abuse import (HOSTILE, HOSTILE_KEY, MB, OTHER_KEY, AbuseServer, Neighbour,
                                 abuse_server)
from tests.support.server import free_port

HOSTILE_LIMIT = 8 * MB
"""The hostile tenant's own body limit here (the other tenant keeps the server's 256 MiB,
so gRPC's server-wide receive limit stays 256 MiB)."""
HOSTILE_MD = (("authorization", f"Bearer {HOSTILE_KEY}"),)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[AbuseServer, grpc.Channel]]:
    keys = tmp_path / "grpc-keys.json"
    keys.write_text(json.dumps({"tenants": {
        "hostile": {"keys": [HOSTILE_KEY], "max_body_bytes": HOSTILE_LIMIT},
        "other": {"keys": [OTHER_KEY]}}}))
    port = free_port()
    with abuse_server("--grpc-port", str(port), "--api-keys-file", str(keys),
                      tmp_dir=tmp_path) as running:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            yield running, channel


def refusal(channel: grpc.Channel, method: str, payload: bytes,
            metadata: tuple = ()) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(f"/rewardd.v1.Rewardd/{method}")(payload, metadata=metadata,
                                                              timeout=300)
    return caught.value


def details(exc: grpc.RpcError) -> list[tuple[str, str]]:
    """(field, reason) of each BadRequest violation in the call's status."""
    out = []
    for detail in rpc_status.from_call(exc).details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            out += [(v.field, v.reason) for v in bad.field_violations]
    return out


def test_row5_unauthenticated_200_mb_calls_are_refused_unread(server):
    running, channel = server
    body = b"\x0a" + b"\xff" * 9 + bytes(200 * MB)  # 200 MB that would not even parse
    rss, cpu = running.rss_bytes(), running.api_cpu_s()
    with Neighbour(running.url) as neighbour, ThreadPoolExecutor(4) as pool:
        neighbour.hostile_running.set()
        rounds = 0
        while rounds < 1 or neighbour.answered_during_hostile < 2:
            refused = list(pool.map(lambda _: refusal(channel, "Score", body), range(4)))
            assert {exc.code() for exc in refused} == {grpc.StatusCode.UNAUTHENTICATED}
            rounds += 1
            if rounds == 1:  # the four calls: what they cost the server
                rss_growth, api_cpu = running.rss_bytes() - rss, running.api_cpu_s() - cpu
        neighbour.hostile_running.clear()
    assert rss_growth < 200 * MB, f"API + workers grew {rss_growth / MB:.0f} MB"
    assert api_cpu < 2.0, f"API CPU {api_cpu:.2f} s on four refused calls"
    assert neighbour.statuses and set(neighbour.statuses) == {200}


def test_row5_a_message_over_the_tenants_limit_is_refused_unparsed(server):
    running, channel = server
    body = bytes(64 * MB)  # 8x the tenant's limit, under the server's
    rss, cpu = running.rss_bytes(), running.api_cpu_s()
    exc = refusal(channel, "Score", body, HOSTILE_MD)
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert exc.details() == (f"request message of {64 * MB} bytes is over the limit of "
                             f"{HOSTILE_LIMIT} bytes (max_body_bytes of tenant 'hostile'); "
                             "split the batch")
    assert running.api_cpu_s() - cpu < 2.0
    assert running.rss_bytes() - rss < 200 * MB


def test_row13_malformed_deep_and_long_ids_get_their_typed_statuses(server):
    running, channel = server
    exc = refusal(channel, "Score", MALFORMED, HOSTILE_MD)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(exc) == [("body", "protobuf_invalid")]

    verify = channel.unary_unary("/rewardd.v1.Rewardd/Verify",
                                 response_deserializer=pb.VerifyResponse.FromString)
    for levels in (MAX_DEPTH, MAX_DEPTH + 1):
        rest = httpx.post(f"{running.url}/v1/verify/math", headers=HOSTILE, timeout=60,
                          json={"completion": "\\boxed{1}",
                                "reference": {"answer": "1", "deep": chain_of(levels - 1)}})
        if levels == MAX_DEPTH:
            assert rest.status_code == 200 and rest.json()["ok"] is True
            assert verify(verify_bytes(levels), metadata=HOSTILE_MD, timeout=60).ok
        else:
            assert rest.status_code == 422
            exc = refusal(channel, "Verify", verify_bytes(levels), HOSTILE_MD)
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert details(exc) == [("body.reference", "too_deep")]

    with pytest.raises(grpc.RpcError) as caught:
        rewardd_pb2_grpc.RewarddStub(channel).GetJob(pb.GetJobRequest(id="j" * 10_000), metadata=HOSTILE_MD,
                                     timeout=60)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND

