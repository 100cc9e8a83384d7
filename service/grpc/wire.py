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

_DOUBLE = _struct.Struct("<d")
# Tags (field number << 3 | wire type) of the fields read; one byte each. Others are skipped.
_ENTRY = _KEY = _ITEM = 0x0A      # Struct.fields, entry key, ListValue.values (1, LEN)
_ENTRY_VALUE = 0x12               # the entry's value (2, LEN)
_NULL, _NUMBER, _STRING, _BOOL, _STRUCT, _LIST = 0x08, 0x11, 0x1A, 0x20, 0x2A, 0x32


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


def _span(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, end) of the length-delimited value whose length starts at ``pos``."""
    size, pos = _varint(buf, pos)
    if pos + size > end:
        raise _Malformed("a field runs past its message")
    return pos, pos + size


def _skip(buf: bytes, pos: int, end: int) -> int:
    """The position after the (unknown) field starting at ``pos``."""
    key, pos = _varint(buf, pos)
    kind = key & 7
    if kind == 0:
        return _varint(buf, pos)[1]
    if kind == 2:
        return _span(buf, pos, end)[1]
    if kind in (1, 5):
        pos += 8 if kind == 1 else 4
        if pos > end:
            raise _Malformed("a field runs past its message")
        return pos
    raise _Malformed(f"wire type {kind} (groups) in a Struct")


def _text(buf: bytes, start: int, end: int, loc: Loc) -> str:
    try:
        return buf[start:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestInvalid([error(loc, f"string is not valid UTF-8 ({exc.reason} at byte "
                                    f"{exc.start}): protobuf strings must be UTF-8",
                                    "string_unicode")]) from None


def _number(value: float, loc: Loc) -> float | int:
    if value != value or value in (float("inf"), float("-inf")):
        raise RequestInvalid([error(loc, f"{value} is not a finite number (JSON has no NaN "
                                    "or Infinity)", "finite_number")])
    return int(value) if value.is_integer() and abs(value) < MAX_EXACT_INT else value


def _value(buf: bytes, pos: int, end: int, level: int, loc: Loc, key: Any) -> Any:
    """A Value's content (the last kind set wins, as protobuf's parser has it); ``loc`` and
    ``key`` place it, joined only when needed (an error, a container)."""
    out: Any = None
    while pos < end:
        tag = buf[pos]
        if tag == _NUMBER:
            if pos + 9 > end:
                raise _Malformed("a field runs past its message")
            out = _number(_DOUBLE.unpack_from(buf, pos + 1)[0], loc + (key,))
            pos += 9
        elif tag == _STRING:
            start, pos = _span(buf, pos + 1, end)
            out = _text(buf, start, pos, loc + (key,))
        elif tag in (_NULL, _BOOL):
            flag, pos = _varint(buf, pos + 1)
            out = bool(flag) if tag == _BOOL else None
        elif tag == _STRUCT:
            start, pos = _span(buf, pos + 1, end)
            out = _struct_at(buf, start, pos, level + 1, loc + (key,))
        elif tag == _LIST:
            start, pos = _span(buf, pos + 1, end)
            out = _list_at(buf, start, pos, level + 1, loc + (key,))
        else:
            pos = _skip(buf, pos, end)
    return out


def _struct_at(buf: bytes, pos: int, end: int, level: int, loc: Loc) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if level > DECODED_LEVELS:
        return out
    while pos < end:
        if buf[pos] != _ENTRY:
            pos = _skip(buf, pos, end)
            continue
        at, stop = _span(buf, pos + 1, end)
        key, item = "", None
        while at < stop:
            tag = buf[at]
            if tag == _KEY:
                start, at = _span(buf, at + 1, stop)
                key = _text(buf, start, at, loc)
            elif tag == _ENTRY_VALUE:
                item = _span(buf, at + 1, stop)
                at = item[1]
            else:
                at = _skip(buf, at, stop)
        out[key] = None if item is None else _value(buf, *item, level, loc, key)
        pos = stop
    return out


def _list_at(buf: bytes, pos: int, end: int, level: int, loc: Loc) -> list[Any]:
    out: list[Any] = []
    if level > DECODED_LEVELS:
        return out
    while pos < end:
        if buf[pos] != _ITEM:
            pos = _skip(buf, pos, end)
            continue
        start, pos = _span(buf, pos + 1, end)
        out.append(_value(buf, start, pos, level, loc, len(out)))
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
