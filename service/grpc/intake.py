"""The edge of every rewardd.v1 call: who is calling and how large the message is, known
before a byte of the message is parsed (issue 28, row 5).

gRPC reads a unary call's message whole and hands the handler the parsed message: four
unauthenticated 200 MB calls were each read and parsed (+1.9 GB, /healthz stalled 4.2 s)
before the key or the tenant's body limit was looked at, where REST refuses the same body
from its headers in 30 ms, 0 bytes read. So every method is registered here as if its
request streamed (the wire is the same for gRPC; a unary client cannot tell), which lets the
handler run when the call's metadata arrives, before the message is read:

1. authenticate from the ``authorization`` metadata: a call without a valid key ends with
   UNAUTHENTICATED and its message is never read (HTTP/2 flow control holds the client to a
   window of a few KB to a few MB, dropped with the call);
2. read the message as bytes (gRPC's own receive limit is the largest tenant limit, see
   :func:`receive_limit`) and refuse one over the caller's own limit with
   RESOURCE_EXHAUSTED naming the limit and its setting, unparsed;
3. parse it off the event loop (a large one in the heavy lane, :mod:`rewardd.service.heavy`)
   as its wire twin (:mod:`.wire`, REST's nesting limit); malformed bytes are
   INVALID_ARGUMENT with BadRequest details;

then the servicer's method runs with the message, as gRPC would have called it.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.message import Message

from rewardd.service import heavy
from rewardd.service.codec import BodyError
from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc import wire
from rewardd.service.grpc.errors import abort_with, status_of
from rewardd.service.grpc.servicer import RewarddServicer, tenant_of
from rewardd.service.services import Services
from rewardd.service.tenancy import KeyRing
from rewardd.service.settings import Settings

SERVICE = pb.DESCRIPTOR.services_by_name["Rewardd"]


def receive_limit(keys: KeyRing, settings: Settings) -> int:
    """gRPC's receive limit for the whole server: the largest message any caller may send
    (the largest tenant's limit; REWARDD_MAX_BODY_BYTES without keys). Each caller's own,
    possibly lower, limit is applied by :func:`receive` before parsing."""
    limits = [tenant.max_body_bytes for tenant in keys.tenants.values()]
    return max(limits) if limits else settings.max_body_bytes


async def _first(requests: AsyncIterator[bytes]) -> bytes:
    async for raw in requests:
        return raw
    raise BodyError(400, "the call ended without its request message: send exactly one")


async def receive(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                  cls: type[Message], services: Services) -> Message:
    """The call's one message, parsed as ``cls`` once its caller is known and its size is
    within the caller's limit; the call ends with the typed status otherwise."""
    try:
        tenant = tenant_of(context, services)  # before a byte of the message is read
        raw = await _first(requests)
        if len(raw) > tenant.max_body_bytes:
            raise BodyError(413, f"request message of {len(raw)} bytes is over the limit of "
                            f"{tenant.max_body_bytes} bytes ({tenant.max_body_setting}); "
                            "split the batch")
        heavy.mark(heavy.heavy_body(len(raw)))
        return await heavy.offload(wire.parse, cls, raw)
    except Exception as exc:  # cancellation (deadline, client gone) is not an Exception
        status = status_of(exc)
    await abort_with(context, status)
    raise AssertionError("unreachable: abort raises")


def _unary(behavior: Callable[..., Any], cls: type[Message], services: Services) -> Any:
    async def handle(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        with heavy.scope():  # a large message's steps share the heavy lane, like REST's
            return await behavior(await receive(requests, context, cls, services), context)
    return handle


def _streaming(behavior: Callable[..., Any], cls: type[Message], services: Services) -> Any:
    async def handle(requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        message = await receive(requests, context, cls, services)
        async for item in behavior(message, context):
            yield item
    return handle


def handlers(servicer: RewarddServicer, services: Services,
             serialize: Callable[[Any], bytes]) -> grpc.GenericRpcHandler:
    """rewardd.v1.Rewardd's methods, each behind :func:`receive` (requests as raw bytes:
    no deserializer), answers through ``serialize``."""
    methods = {}
    for method in SERVICE.methods:
        behavior = getattr(servicer, method.name)
        cls = wire.request_class(method.input_type.name)
        if method.server_streaming:
            methods[method.name] = grpc.stream_stream_rpc_method_handler(
                _streaming(behavior, cls, services), response_serializer=serialize)
        else:
            methods[method.name] = grpc.stream_unary_rpc_method_handler(
                _unary(behavior, cls, services), response_serializer=serialize)
    return grpc.method_handlers_generic_handler(SERVICE.full_name, methods)
