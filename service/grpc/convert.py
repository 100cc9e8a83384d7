"""Messages <-> the REST bodies: requests become the dict the pydantic models validate,
response dicts become messages.

Why through the REST body rather than a second set of validators: one validation, so a
gRPC request is refused exactly when its JSON twin would be, at the same field path.

Per-token inputs (``Float32Row``) become lists of floats; per-token outputs of the whole
batch become one ``RaggedFloat32`` (dense, float32 little-endian) or ``RaggedRle``
(float64 runs, bit for bit REST's rle) with rows in request order.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import orjson
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rewardd.advantages.errors import Loc, RequestInvalid, error
from rewardd.service.gcpause import gc_paused
from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc import wire

M = TypeVar("M", bound=Message)

MAX_EXACT_INT = wire.MAX_EXACT_INT

_STRUCT = struct_pb2.Struct.DESCRIPTOR
_VALUE = struct_pb2.Value.DESCRIPTOR
_ROW = pb.Float32Row.DESCRIPTOR
_TOKEN_VALUES = pb.TokenValues.DESCRIPTOR
PATH_FIELDS = {"VerifyRequest": ("verifier",)}
"""Fields that are the REST path's parameters, not the body's."""


def _row(row: pb.Float32Row, loc: Loc) -> list[float]:
    data = row.data_f32le
    if len(data) % 4:
        raise RequestInvalid([error(loc + ("data_f32le",), f"{len(data)} bytes is not a whole "
                                    "number of float32 values (4 bytes each, little-endian)")])
    return np.frombuffer(data, dtype="<f4").astype(np.float64).tolist()


def to_body(message: Message, loc: Loc = ("body",)) -> dict[str, Any]:
    """The REST body ``message`` stands for: set fields only (an unset optional is absent,
    so the model's default or 'Field required' applies at the same path as REST). Takes a
    generated message or its wire twin (:mod:`.wire`: what the server parses), whose
    Structs are decoded to REST's nesting limit."""
    skip = PATH_FIELDS.get(message.DESCRIPTOR.name, ())
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        name = field.name
        if name in skip:
            continue
        here = loc + (name,)
        if field.full_name in wire.STRUCT_FIELDS:  # a wire twin's Struct, still bytes
            out[name] = wire.struct_of(value, here)
        elif field.message_type is None:
            out[name] = list(value) if _is_repeated(field) else value
        elif field.message_type.GetOptions().map_entry:
            out[name] = dict(value)  # request maps hold scalars (weights)
        elif field.message_type is _STRUCT:
            out[name] = wire.struct_of(value.SerializeToString(), here)
        elif field.message_type.name == _ROW.name:  # the generated message or its twin
            out[name] = _row(value, here)
        elif _is_repeated(field):
            out[name] = [to_body(item, here + (i,)) for i, item in enumerate(value)]
        else:
            out[name] = to_body(value, here)
    return out


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


# ---- responses ----------------------------------------------------------------------------

def fill(message: Message, data: dict[str, Any]) -> Message:
    """Set ``message``'s fields from a REST body (null: left unset); per-token lists become
    Float32Row. How a Python client (the tests, the benchmark) builds a request from a REST
    body; a key the message lacks raises KeyError."""
    fields = message.DESCRIPTOR.fields_by_name
    for key, value in data.items():
        if value is None:
            continue
        field = fields[key]
        target = getattr(message, key) if field.message_type is not None else None
        if field.message_type is None:
            if _is_repeated(field):
                getattr(message, key).extend(value)
            else:
                setattr(message, key, value)
        elif field.message_type is _STRUCT:
            target.update(value)
        elif field.message_type is _ROW:  # a client's per-token list, packed
            target.data_f32le = np.asarray(value, dtype="<f4").tobytes()
        elif field.message_type is _VALUE:
            json_format.ParseDict(value, target)
        elif field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is None:
                target.update({k: v for k, v in value.items() if v is not None})
            else:
                for k, v in value.items():
                    fill(target[k], v)
        elif _is_repeated(field):
            for item in value:
                fill(target.add(), item)
        else:
            fill(target, value)
    return message


def _json_shaped(payload: Any) -> Any:
    """Enums, numpy values and dataclasses as JSON has them (what REST's render sends)."""
    return orjson.loads(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _length_delimited(number: int, parts: list[Any]) -> list[Any]:
    """Field ``number`` (wire type 2) framing ``parts``, the parts themselves uncopied."""
    return [_varint(number << 3 | 2) + _varint(sum(len(p) for p in parts)), *parts]


def _token_values(rows: list[Any]) -> list[Any]:
    """The per-rollout ``advantages`` (or ``returns``) of a response as the parts of one
    serialized TokenValues (none: output none): dense arrays as RaggedFloat32, whose
    float32 bytes are framed by hand so they are copied once, into the answer; ``{"rle":
    [[v, n], ...]}`` as RaggedRle; floats as Scalars."""
    first = next((r for r in rows if r is not None), None)
    if first is None:
        return []
    if isinstance(first, dict):
        runs = [r["rle"] if r is not None else [] for r in rows]
        offsets = np.zeros(len(runs) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in runs], out=offsets[1:])
        flat = [run for row in runs for run in row]
        return [pb.TokenValues(rle=pb.RaggedRle(
            values=[v for v, _ in flat], lengths=[n for _, n in flat],
            row_offsets=offsets.tolist())).SerializeToString()]
    if isinstance(first, (int, float)):
        return [pb.TokenValues(scalar=pb.Scalars(
            values=[0.0 if r is None else r for r in rows])).SerializeToString()]
    arrays = [np.asarray(r if r is not None else (), dtype=np.float64) for r in rows]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    packed = np.concatenate(arrays, dtype="<f4", casting="same_kind")  # no float64 copy
    data = memoryview(packed).cast("B")
    ragged = [*_length_delimited(_DATA_F32LE, [data]),
              pb.RaggedFloat32(row_offsets=offsets.tolist()).SerializeToString()]
    return _length_delimited(_DENSE, ragged)


_DATA_F32LE = pb.RaggedFloat32.DESCRIPTOR.fields_by_name["data_f32le"].number
_DENSE = pb.TokenValues.DESCRIPTOR.fields_by_name["dense"].number
_ADVANTAGES = pb.ScoreResponse.DESCRIPTOR.fields_by_name["advantages"].number
_RETURNS = pb.ScoreResponse.DESCRIPTOR.fields_by_name["returns"].number


def score_wire(payload: dict[str, Any]) -> bytes:
    """A /v1/score (rewards, advantages, job result) body as a serialized ScoreResponse
    (CPU-bound: callers run it off the event loop). The message without its tensors is
    serialized by protobuf, the tensor fields appended (protobuf reads fields in any
    order): 67 MB of dense float32 cost one copy instead of four."""
    advantages: list[Any] = []
    returns: list[Any] = []
    with gc_paused():
        groups = []
        for group in payload["groups"]:
            rollouts = []
            for rollout in group["rollouts"]:
                advantages.append(rollout.get("advantages"))
                returns.append(rollout.get("returns"))
                rollouts.append({k: v for k, v in rollout.items()
                                 if k not in ("advantages", "returns")})
            groups.append({**group, "rollouts": rollouts})
        parts = [message_of(pb.ScoreResponse, {**payload, "groups": groups}).SerializeToString()]
        for number, rows in ((_ADVANTAGES, advantages), (_RETURNS, returns)):
            values = _token_values(rows)
            if values:
                parts += _length_delimited(number, values)
        return b"".join(parts)


def score_response(payload: dict[str, Any]) -> pb.ScoreResponse:
    """:func:`score_wire` as a message (a job's result inside JobStatus; tests)."""
    return pb.ScoreResponse.FromString(score_wire(payload))


def message_of(cls: type[M], payload: Any) -> M:
    """A response body as ``cls``, built by the message's own constructor from the body as
    JSON has it (nested dicts, Structs and maps in C; a key the message lacks raises, and
    tests/grpc/test_mirror.py keeps the two in step)."""
    return cls(**_json_shaped(payload))


def catalogue_message(cls: type[M], payload: Any) -> M:
    """:func:`message_of` for bodies with a ``google.protobuf.Value`` (ParamInfo.default),
    which the constructor does not build from a plain value."""
    return fill(cls(), _json_shaped(payload))  # type: ignore[return-value]


def rows_of(values: pb.TokenValues) -> list[list[float]] | list[float]:
    """The client-side inverse of :func:`token_values` (tests and the benchmark): dense rows
    as float lists, rle rows decoded to dense, scalars as they are."""
    kind = values.WhichOneof("values")
    if kind == "dense":
        data = np.frombuffer(values.dense.data_f32le, dtype="<f4")
        off = values.dense.row_offsets
        return [data[off[i]:off[i + 1]].tolist() for i in range(len(off) - 1)]
    if kind == "rle":
        rle, out = values.rle, []
        for i in range(len(rle.row_offsets) - 1):
            row: list[float] = []
            for j in range(rle.row_offsets[i], rle.row_offsets[i + 1]):
                row.extend([rle.values[j]] * rle.lengths[j])
            out.append(row)
        return out
    return list(values.scalar.values)

