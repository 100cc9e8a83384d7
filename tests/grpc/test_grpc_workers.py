"""`rewardd serve --workers 2 --grpc-port P` starts and answers over gRPC: each uvicorn worker
process binds the same port (SO_REUSEPORT, gRPC's default on Linux). Weak spot: it cannot tell
which process answered, so a worker that failed to bind while the other served would pass."""

from __future__ import annotations

import grpc
import pytest

from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc import rewardd_pb2_grpc as pb_grpc
from tests.support.server import free_port, running_server

pytestmark = pytest.mark.e2e


def test_two_worker_processes_share_the_grpc_port():
    port = free_port()
    with running_server("--workers", "2", "--pool-size", "1", "--grpc-port", str(port)):
        for _ in range(4):  # fresh connections: the kernel spreads them over both processes
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = pb_grpc.RewarddStub(channel).Verify(pb.VerifyRequest(
                    verifier="exact_match", completion="a", reference={"answer": "a"}),
                    timeout=120)
                assert (reply.ok, reply.reward) == (True, 1.0)
