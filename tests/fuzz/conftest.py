"""Fixtures for the fuzzers: one real ``rewardd serve`` for the whole fuzz package.

A server of its own (not the suite's shared ``server`` fixture): schemathesis sends tens of
thousands of bytes of hostile input per second, jobs and run state pile up, and a hang it
provokes must not be charged to the end-to-end tests that share a server. It loads no faulty
test plugins, so every 5xx it answers is rewardd's own.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.server import ServerFailed, running_server

# A body limit a generated request can actually reach, and a verifier limit that is generous
# on a loaded machine (a fuzzed math reference must finish or time out, never hang a case).
FUZZ_MAX_BODY_BYTES = 1024 * 1024
FUZZ_VERIFIER_TIMEOUT_S = 10


@pytest.fixture(scope="session")
def fuzz_server() -> Iterator[str]:
    """Base URL of a real server: embedded pool of 2, 1 MiB bodies, in-memory jobs."""
    try:
        with running_server("--pool-size", "2",
                            "--verifier-timeout-s", str(FUZZ_VERIFIER_TIMEOUT_S),
                            "--max-body-bytes", str(FUZZ_MAX_BODY_BYTES)) as url:
            yield url
    except ServerFailed as exc:
        pytest.fail(str(exc))
