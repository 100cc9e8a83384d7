"""The edge of every call (issue 28, rows 5 and 13) against the real server: the key and
the tenant's body limit come before the message is parsed, malformed bytes are
INVALID_ARGUMENT with details, Structs nest as deep as REST allows and no deeper, and an
echoed 10 KB id still fits the status."""

from __future__ import annotations

import grpc
import httpx
import pytest

from rewardd.advantages.bounds import MAX_DEPTH
from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc.errors import ECHO_CHARS
from rewardd.service.grpc.intake import receive_limit
from rewardd.service.settings import Settings
from rewardd.service.tenancy import KeyRing, Tenant
from tests.grpc.conftest import KEY, SMALL_KEY, auth
from tests.grpc.requests import MALFORMED, chain_of, verify_bytes
from tests.grpc.test_grpc_errors import call_error, status_of

pytestmark = pytest.mark.e2e

def raw_call(channel: grpc.Channel, method: str, payload: bytes, key: str | None = KEY
             ) -> tuple[grpc.StatusCode, dict]:
    """Call ``method`` with ``payload`` as the message's bytes, unchecked by any stub."""
    call = channel.unary_unary(f"/rewardd.v1.Rewardd/{method}")  # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as caught:
        call(payload, metadata=auth(key) if key else (), timeout=60)
    return status_of(caught.value)


def test_a_call_without_a_key_is_refused_before_its_message_is_parsed(grpc_server):
    code, got = raw_call(grpc_server.channel, "Score", MALFORMED, key=None)
    assert code == grpc.StatusCode.UNAUTHENTICATED  # not INVALID_ARGUMENT: never parsed
    assert got["info"] == ("rewardd", "unauthenticated")


def test_a_message_over_the_tenants_limit_is_refused_before_it_is_parsed(grpc_server):
    payload = MALFORMED + b"\x00" * 5000  # tenant 'small' may send 4096 bytes
    with pytest.raises(grpc.RpcError) as caught:
        grpc_server.channel.unary_unary("/rewardd.v1.Rewardd/Score")(
            payload, metadata=auth(SMALL_KEY), timeout=60)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # not a parse error
    assert status_of(caught.value)[1]["info"] == ("rewardd", "body_too_large")
    assert caught.value.details() == (
        f"request message of {len(payload)} bytes is over the limit of 4096 bytes "
        "(max_body_bytes of tenant 'small'); split the batch")


@pytest.mark.parametrize("method", ["Score", "Verify", "SubmitJob", "GetJob", "WatchJob"])
def test_malformed_bytes_are_invalid_argument_with_details(grpc_server, method):
    if method == "WatchJob":
        call = grpc_server.channel.unary_stream(f"/rewardd.v1.Rewardd/{method}")
        with pytest.raises(grpc.RpcError) as caught:
            list(call(MALFORMED, metadata=auth(), timeout=60))
        code, got = status_of(caught.value)
    else:
        code, got = raw_call(grpc_server.channel, method, MALFORMED)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert got["violations"] == [("body", "protobuf_invalid")]
    assert got["info"] == ("rewardd", "request_invalid")


def test_structs_nest_as_deep_as_rest_allows_and_no_deeper(grpc_server):
    verify = grpc_server.channel.unary_unary("/rewardd.v1.Rewardd/Verify",
                                             response_deserializer=pb.VerifyResponse.FromString)
    for levels, ok in ((33, True), (MAX_DEPTH, True), (MAX_DEPTH + 1, False), (500, False)):
        reference = {"answer": "1", "deep": chain_of(levels - 1)}  # `levels` deep in all
        rest = httpx.post(f"{grpc_server.url}/v1/verify/math",
                          json={"completion": "\\boxed{1}", "reference": reference},
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        if ok:
            assert rest.status_code == 200, (levels, rest.text)
            reply = verify(verify_bytes(levels), metadata=auth(), timeout=60)
            assert reply.ok is rest.json()["ok"] is True
            continue
        assert rest.status_code == 422, (levels, rest.text)
        code, got = raw_call(grpc_server.channel, "Verify", verify_bytes(levels))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, levels
        want = [(".".join(map(str, e["loc"])), e["type"]) for e in rest.json()["detail"]]
        assert got["violations"] == want == [("body.reference", "too_deep")]


def test_a_hand_built_struct_is_the_generated_ones_bytes():
    request = pb.VerifyRequest(verifier="math", completion="\\boxed{1}")
    request.reference.update({"answer": "1", "deep": chain_of(3)})
    assert pb.VerifyRequest.FromString(verify_bytes(4)) == request


def test_a_10_kb_job_id_is_not_found_with_the_id_cut(grpc_server):
    job_id = "j" * 10_000
    with pytest.raises(grpc.RpcError) as caught:
        grpc_server.stub().GetJob(pb.GetJobRequest(id=job_id), metadata=auth(), timeout=60)
    code, got = status_of(caught.value)
    assert code == grpc.StatusCode.NOT_FOUND and got["info"] == ("rewardd", "not_found")
    # the id (with its quotes) keeps its first characters and says how long it was
    assert caught.value.details() == f"no job '{'j' * (ECHO_CHARS - 1)}…(10002 chars)"


def test_grpcs_own_receive_limit_is_the_largest_tenants():
    settings = Settings(max_body_bytes=1000)
    ring = KeyRing({"d1": Tenant("a", 1, 100, "max_body_bytes of tenant 'a'"),
                    "d2": Tenant("b", 1, 700, "max_body_bytes of tenant 'b'")})
    assert receive_limit(ring, settings) == 700  # no tenant may send more
    assert receive_limit(KeyRing({}), settings) == 1000  # keys off: the server's setting
