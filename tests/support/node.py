"""Finding Node.js for the tests that run a client in a second language (REST's
``tests/e2e/test_node_client.py``, gRPC's ``tests/grpc/test_node_client.py``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def node_at_least(major: int, why: str) -> str | None:
    """The path of ``node``, None when it is not installed (the caller decides: fail or skip
    loudly); a node older than ``major`` fails the test, saying ``why`` it needs ``major``."""
    node = shutil.which("node")
    if node is None:
        return None
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    if int(version.strip().lstrip("v").split(".")[0]) < major:
        pytest.fail(f"node {version.strip()} {why}: install node {major}+")
    return node
