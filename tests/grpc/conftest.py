"""A real ``rewardd serve --grpc-port`` for the gRPC tests: API keys for two tenants (one
limited to one request in flight), the test verifiers (``test_sleep``), one pool worker (so
a check the server failed to cancel would visibly hold the next one up), and verifier
time limits up to 600 s (so only a cancel, never the limit, can end a test's long sleep)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

import grpc
import pytest

from rewardd.service.grpc import rewardd_pb2_grpc as pb_grpc
from tests.support.server import free_port, running_server

KEY = "grpc-key-a"
SMALL_KEY = "grpc-key-small"
OTHER_KEY = "grpc-key-b"


@dataclass
class GrpcServer:
    url: str  # REST
    target: str  # gRPC host:port
    channel: grpc.Channel

    def stub(self) -> pb_grpc.RewarddStub:
        return pb_grpc.RewarddStub(self.channel)


def auth(key: str = KEY) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture(scope="package")
def grpc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    keys = tmp_path_factory.mktemp("grpc") / "keys.json"
    keys.write_text(json.dumps({"tenants": {
        "team-a": {"keys": [KEY]}, "team-b": {"keys": [OTHER_KEY]},
        "small": {"keys": [SMALL_KEY], "max_concurrent_jobs": 1, "max_body_bytes": 4096}}}))
    port = free_port()
    with running_server("--grpc-port", str(port), "--pool-size", "1",
                        "--max-verifier-timeout-s", "600",
                        "--plugins", "tests.plugins.faulty", "--api-keys-file", str(keys)) as url:
        target = f"127.0.0.1:{port}"
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            yield GrpcServer(url, target, channel)
