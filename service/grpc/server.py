"""The gRPC server inside the REST app's process: started and stopped by its lifespan, on
the same event loop (``grpc.aio``), with health checking and server reflection."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rewardd.service.grpc import intake
from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc.servicer import RewarddServicer
from rewardd.service.services import Services

SERVICE = pb.DESCRIPTOR.services_by_name["Rewardd"].full_name
STOP_GRACE_S = 5.0
KEEPALIVE_S = 15


def _serialize(message: Any) -> bytes:
    """Responses already serialized (scoring: see convert.score_wire) pass as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


async def start(services: Services) -> tuple[grpc.aio.Server, int]:
    """Serve rewardd.v1.Rewardd on ``settings.host:settings.grpc_port`` (0: a free port);
    (the server, the bound port). Each call is authenticated and held to its tenant's body
    limit before its message is read (:mod:`.intake`); gRPC itself reads no message over
    the largest tenant's limit (larger: RESOURCE_EXHAUSTED from gRPC). Answers are not
    capped, like REST's."""
    settings = services.settings
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", intake.receive_limit(services.keys, settings)),
        ("grpc.max_send_message_length", -1),
        # HTTP/2 pings on idle connections (a WatchJob waiting on a long group): what REST's
        # `: keep-alive` comments do for proxies that cut silent streams
        ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
        ("grpc.keepalive_timeout_ms", 20_000),
    ])
    server.add_generic_rpc_handlers(
        (intake.handlers(RewarddServicer(services), services, _serialize),))
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    reflection.enable_server_reflection(
        (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    if port == 0:
        raise OSError(f"gRPC could not bind {settings.host}:{settings.grpc_port} "
                      "(REWARDD_GRPC_PORT)")
    await server.start()
    for name in ("", SERVICE):
        await checker.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port


async def stop(server: grpc.aio.Server) -> None:
    """Refuse new calls, let running ones finish for STOP_GRACE_S, then cancel them."""
    await server.stop(STOP_GRACE_S)
