"""The record's tests run on both backends: a SQLite file and a scratch database on a real
PostgreSQL (tests/support/postgres.py: the machine's server, else a private one)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from rewardd.service.records.store import RecordStore
from tests.support.postgres import MACHINE_URL, PostgresServer, reachable, scratch_database


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """The machine's PostgreSQL when it answers, else a private server for the session."""
    if reachable(MACHINE_URL):
        yield MACHINE_URL
        return
    server = PostgresServer().start()
    try:
        yield server.url()
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def record_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'data' / 'records.sqlite3'}"
        return
    with scratch_database(request.getfixturevalue("postgres_server_url")) as url:
        yield url


@pytest.fixture
def store(record_url: str) -> Iterator[RecordStore]:
    opened = RecordStore.open(record_url)
    yield opened
    opened.close()
