"""Shared fixtures: a real ``rewardd serve`` process for the end-to-end tests, and a real
OpenAI-compatible judge server for the judge tests of every layer."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest

from tests.support.judge_server import JudgeServer
from tests.support.server import ServerFailed, running_server

SERVER_MAX_BODY_BYTES = 8 * 1024 * 1024
CREATED_DATA_DIR = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """The suite's run record goes to a folder of its own (the servers it starts inherit it
    through tests/support/server.child_env), never to the user's ~/.local/share/rewardd."""
    if "REWARDD_DATA_DIR" not in os.environ:
        os.environ["REWARDD_DATA_DIR"] = tempfile.mkdtemp(prefix="rewardd-test-data-")
        config.stash[CREATED_DATA_DIR] = os.environ["REWARDD_DATA_DIR"]


def pytest_unconfigure(config: pytest.Config) -> None:
    created = config.stash.get(CREATED_DATA_DIR, None)
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """Base URL of a real uvicorn server (embedded pool of 2, faulty test plugins loaded)."""
    try:
        with running_server("--pool-size", "2", "--plugins", "tests.plugins.faulty",
                            "--verifier-timeout-s", "5",
                            "--max-body-bytes", str(SERVER_MAX_BODY_BYTES)) as url:
            yield url
    except ServerFailed as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    """A rule-based OpenAI-compatible judge server (tests/support/judge_server.py), one per
    test module, answering over real HTTP on 127.0.0.1."""
    server = JudgeServer().start()
    yield server
    server.stop()
