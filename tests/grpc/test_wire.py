"""The server's own Struct decoding (service/grpc/wire.py) and the status texts cut to fit a
call's trailers (service/grpc/errors.py), without a server."""

from __future__ import annotations

import math

import pytest
from google.protobuf import struct_pb2
from google.rpc import code_pb2, error_details_pb2

from rewardd.advantages.bounds import MAX_DEPTH, too_deep
from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service.errors import NotFound
from rewardd.service.grpc import wire
from rewardd.service.grpc.errors import DETAILS_BYTES, ECHO_CHARS, cut, status_of
from rewardd.service.grpc import rewardd_pb2 as pb


def encoded(value: dict) -> bytes:
    message = struct_pb2.Struct()
    message.update(value)
    return message.SerializeToString()


def test_a_struct_decodes_as_its_json_with_whole_numbers_as_ints():
    value = {"n": 3, "x": 0.5, "big": 2.0 ** 60, "s": "é", "t": True, "z": None,
             "l": [1, [2, {"k": "v"}], []], "o": {}}
    decoded = wire.struct_of(encoded(value), ("body", "params"))
    assert decoded == value
    assert isinstance(decoded["n"], int) and isinstance(decoded["big"], float)


def test_levels_past_the_bound_are_left_empty_so_the_model_names_the_first():
    value: dict = {"leaf": 1}
    for _ in range(MAX_DEPTH + 5):
        value = {"a": value}
    decoded = wire.struct_of(encoded(value), ())
    assert too_deep(decoded) == ("a",) * MAX_DEPTH  # REST's path to the first level too deep
    inner = decoded
    for _ in range(MAX_DEPTH):
        inner = inner["a"]
    assert inner == {"a": {}}  # level 65 decoded, empty; below it nothing was read


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_a_non_finite_number_names_its_key(number):
    with pytest.raises(RequestInvalid) as caught:
        wire.struct_of(encoded({"o": {"x": number}}), ("body", "params"))
    assert [(e["loc"], e["type"]) for e in caught.value.errors] == [
        (["body", "params", "o", "x"], "finite_number")]


def test_bytes_that_are_no_struct_are_refused_at_the_field():
    bad_utf8 = b"\x0a\x08\x0a\x02\xff\xfe\x12\x02\x08\x00"  # key b"\xff\xfe"
    for data, kind in ((b"\x0a\x05\x0a", "protobuf_invalid"), (b"\x0b", "protobuf_invalid"),
                       (bad_utf8, "string_unicode")):
        with pytest.raises(RequestInvalid) as caught:
            wire.struct_of(data, ("body", "reference"))
        assert [(e["loc"], e["type"]) for e in caught.value.errors] == [
            (["body", "reference"], kind)], data


def test_the_wire_twins_read_the_generated_messages_bytes():
    request = pb.VerifyRequest(verifier="math", completion="x", num_tokens=3)
    request.reference.update({"answer": "1"})
    request.params.SetInParent()  # an empty Struct is present, as with the generated class
    twin = wire.parse(wire.request_class("VerifyRequest"), request.SerializeToString())
    assert twin.verifier == "math" and twin.num_tokens == 3
    assert twin.HasField("params") and not twin.HasField("prompt")
    assert wire.struct_of(twin.reference, ()) == {"answer": "1"}
    with pytest.raises(RequestInvalid) as caught:
        wire.parse(wire.request_class("ScoreRequest"), b"\x0a\xff")
    assert caught.value.errors[0]["type"] == "protobuf_invalid"
    assert "rewardd.v1.ScoreRequest" in caught.value.errors[0]["msg"]


def test_echoed_values_are_cut_and_the_details_fit_the_trailers():
    assert cut("short id 'abc'") == "short id 'abc'"
    assert cut(f"no job '{'x' * 10_000}' here") == (
        f"no job '{'x' * (ECHO_CHARS - 1)}…(10002 chars) here")
    status = status_of(NotFound("no job " + "y " * 5000))  # long, with spaces
    assert len(status.message) < 1100 and status.code == code_pb2.NOT_FOUND
    many = RequestInvalid([error(("body", "groups", i, "x" * 300), "z " * 300)
                           for i in range(100)])
    status = status_of(many)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad) and 0 < len(bad.field_violations) < 100
    assert bad.ByteSize() <= DETAILS_BYTES and status.ByteSize() < DETAILS_BYTES + 1500
