"""Request messages as the server parses them: the rewardd.v1 requests with every
``google.protobuf.Struct`` field read as bytes, and those bytes decoded here, to REST's
nesting limit.

Why not parse the generated messages directly: protobuf's parser (upb) stops at 100 levels
of messages, and each JSON level of a Struct costs three (Struct, its map entry, Value), so
a free-form field nested deeper than about 32 levels was refused with a bare decode error
while REST accepts up to :data:`~rewardd.advantages.bounds.MAX_DEPTH` (64). Raising the
parser's limit is process-wide (``SetAllowOversizeProtos``) and lets any message nest 65,535
deep, and the C parser recurses once per level. So the server parses *wire twins* of the
request messages (same names, numbers and types, built at import from the generated
descriptor) whose Struct fields are ``bytes``, which are wire-compatible, and decodes each
Struct with :func:`struct_of`: its containers below ``MAX_DEPTH + 1`` levels are skipped, not
descended, so a deeper one costs nothing and still reaches the request model, whose depth
check (:mod:`rewardd.advantages.bounds`) refuses it with REST's 422 at REST's path.

The decoder gives what ``json_format.MessageToDict`` gave, plus REST's number rule
(whole-number doubles below 2^53 are ints) and typed refusals where it raised a bare
ValueError (NaN and infinities, which JSON cannot carry) or where upb checked UTF-8.
"""

from __future__ import annotations

import struct as _struct
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2
from google.protobuf.message import DecodeError, Message

from rewardd.advantages.bounds import MAX_DEPTH
from rewardd.advantages.errors import Loc, RequestInvalid, error
from rewardd.service.grpc import rewardd_pb2 as pb

PACKAGE = "rewardd.v1.wire"
MAX_EXACT_INT = 2 ** 53
"""Whole-number doubles below this in a Struct read as ints (JSON cannot tell them apart
either; above it a double no longer holds every integer)."""
DECODED_LEVELS = MAX_DEPTH + 1
"""Levels of a Struct decoded: one past REST's limit, so the model names the first level
too deep at its path; deeper containers are left empty, unread."""

_STRUCT_NAME = "." + struct_pb2.Struct.DESCRIPTOR.full_name
_SOURCE = pb.DESCRIPTOR.package


def _twin_file() -> descriptor_pb2.FileDescriptorProto:
    """The generated file's descriptor in package :data:`PACKAGE`, Struct fields as bytes."""
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    proto.name = "rewardd/v1/rewardd_wire.proto"
    proto.package = PACKAGE
    proto.ClearField("service")
    messages = list(proto.message_type)
    while messages:
        message = messages.pop()
        messages.extend(message.nested_type)
        for field in message.field:
            if field.type_name == _STRUCT_NAME:
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                field.ClearField("type_name")
                if not field.proto3_optional:  # presence, as the message field had it
                    field.proto3_optional = True
                    field.oneof_index = len(message.oneof_decl)
                    message.oneof_decl.add(name=f"_{field.name}")
            elif field.type_name.startswith(f".{_SOURCE}."):
                field.type_name = f".{PACKAGE}." + field.type_name[len(_SOURCE) + 2:]
    return proto


def _build() -> tuple[dict[str, type[Message]], frozenset[str]]:
    pool = descriptor_pool.DescriptorPool()
    for dependency in pb.DESCRIPTOR.dependencies:
        dep = descriptor_pb2.FileDescriptorProto()
        dependency.CopyToProto(dep)
        pool.Add(dep)
    pool.Add(_twin_file())
    classes, structs = {}, set()
    for name, source in pb.DESCRIPTOR.message_types_by_name.items():
        twin = pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
        classes[name] = message_factory.GetMessageClass(twin)
        for field in source.fields:
            if field.message_type is struct_pb2.Struct.DESCRIPTOR:
                structs.add(twin.fields_by_name[field.name].full_name)
    return classes, frozenset(structs)


_CLASSES, STRUCT_FIELDS = _build()
"""STRUCT_FIELDS: full names of the twins' fields that hold a serialized Struct."""


def request_class(name: str) -> type[Message]:
    """The wire twin of rewardd.v1 message ``name`` (e.g. ``ScoreRequest``)."""
    return _CLASSES[name]


def parse(cls: type[Message], raw: bytes) -> Message:
    """``raw`` as a ``cls`` message; malformed bytes are a 422-style RequestInvalid naming
    the message type (INVALID_ARGUMENT with BadRequest details over gRPC)."""
    try:
        return cls.FromString(raw)
    except DecodeError as exc:
        name = cls.DESCRIPTOR.name
        raise RequestInvalid([error(("body",), f"not a valid rewardd.v1.{name} message "
                                    f"({len(raw)} bytes): {exc}".replace(PACKAGE, "rewardd.v1"),
                                    "protobuf_invalid")]) from None


# ---- Struct, Value and ListValue from their wire bytes ---------------------------------

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_DOUBLE = _struct.Struct("<d")


class _Malformed(Exception):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _Malformed("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> Any:
    """(field number, wire type, value) of each field in ``buf[start:end]``; a
    length-delimited value is its (start, end), others their integer."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            value, pos = _varint(buf, pos)
        elif kind == _I64:
            value, pos = (pos, pos + 8), pos + 8
        elif kind == _LEN:
            size, pos = _varint(buf, pos)
            value, pos = (pos, pos + size), pos + size
        elif kind == _I32:
            value, pos = (pos, pos + 4), pos + 4
        else:
            raise _Malformed(f"wire type {kind} (groups) in a Struct")
        if pos > end:
            raise _Malformed("a field runs past its message")
        yield number, kind, value


def _text(buf: bytes, span: tuple[int, int], loc: Loc) -> str:
    try:
        return buf[span[0]:span[1]].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestInvalid([error(loc, f"string is not valid UTF-8 ({exc.reason} at byte "
                                    f"{exc.start}): protobuf strings must be UTF-8",
                                    "string_unicode")]) from None


def _value(buf: bytes, start: int, end: int, level: int, loc: Loc) -> Any:
    out: Any = None
    for number, kind, value in _fields(buf, start, end):
        if number == 1 and kind == _VARINT:
            out = None
        elif number == 2 and kind == _I64:
            out = _number(_DOUBLE.unpack_from(buf, value[0])[0], loc)
        elif number == 3 and kind == _LEN:
            out = _text(buf, value, loc)
        elif number == 4 and kind == _VARINT:
            out = bool(value)
        elif number == 5 and kind == _LEN:
            out = _struct_at(buf, *value, level + 1, loc)
        elif number == 6 and kind == _LEN:
            out = _list_at(buf, *value, level + 1, loc)
    return out


def _number(value: float, loc: Loc) -> float | int:
    if value != value or value in (float("inf"), float("-inf")):
        raise RequestInvalid([error(loc, f"{value} is not a finite number (JSON has no NaN "
                                    "or Infinity)", "finite_number")])
    return int(value) if value.is_integer() and abs(value) < MAX_EXACT_INT else value


def _struct_at(buf: bytes, start: int, end: int, level: int, loc: Loc) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if level > DECODED_LEVELS:
        return out
    for number, kind, span in _fields(buf, start, end):
        if number != 1 or kind != _LEN:
            continue
        key, item = "", None
        for entry, entry_kind, value in _fields(buf, *span):
            if entry == 1 and entry_kind == _LEN:
                key = _text(buf, value, loc)
            elif entry == 2 and entry_kind == _LEN:
                item = value
        out[key] = None if item is None else _value(buf, *item, level, loc + (key,))
    return out


def _list_at(buf: bytes, start: int, end: int, level: int, loc: Loc) -> list[Any]:
    out: list[Any] = []
    if level > DECODED_LEVELS:
        return out
    for number, kind, span in _fields(buf, start, end):
        if number == 1 and kind == _LEN:
            out.append(_value(buf, *span, level, loc + (len(out),)))
    return out


def struct_of(data: bytes, loc: Loc) -> dict[str, Any]:
    """A serialized ``google.protobuf.Struct`` as the JSON object it stands for (``data``
    itself is level 1); nesting past :data:`DECODED_LEVELS` is left empty (see the module
    docstring). Malformed bytes are a RequestInvalid at ``loc``."""
    try:
        return _struct_at(data, 0, len(data), 1, loc)
    except _Malformed as exc:
        raise RequestInvalid([error(loc, f"not a valid google.protobuf.Struct: {exc}",
                                    "protobuf_invalid")]) from None
