"""PostgreSQL for the record's tests: a scratch database per test on the machine's server,
and a private server that a test may kill.

The machine's PostgreSQL (127.0.0.1:5432, trust auth, user postgres; override with
REWARDD_TEST_POSTGRES) is where the record's tests run, each in a database of its own that
the fixture creates and drops. Where that server is not reachable (a user's fresh machine),
the tests start a private one from the PostgreSQL binaries (`make postgres` installs them) for
the whole session, rather than skip. :class:`PostgresServer` is also what a test stops to see
the database die mid-run.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import psycopg

from tests.support.redis_server import free_port

MACHINE_URL = os.environ.get("REWARDD_TEST_POSTGRES",
                             "postgresql://postgres@127.0.0.1:5432/postgres")
START_WITHIN_S = 120.0


def reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def postgres_bin(name: str) -> str:
    """A PostgreSQL server binary (Debian keeps them off PATH)."""
    found = shutil.which(name) or next(iter(sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: run `make postgres` "
                           "(apt-get install postgresql) or set REWARDD_TEST_POSTGRES")
    return found


class PostgresServer:
    """A private ``postgres`` on 127.0.0.1:``port`` with trust auth, its data in a temporary
    folder. Run as the ``postgres`` OS user when the tests run as root (PostgreSQL refuses
    root)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rewardd-postgres-"))
        self.data = self.dir / "data"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            os.chmod(self.dir, 0o777)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run(postgres_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as_user, *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=START_WITHIN_S)

    def start(self) -> PostgresServer:
        self._run(postgres_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"),
                  "-w", "-t", str(int(START_WITHIN_S)), "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
                  "start")
        return self

    def kill(self) -> None:
        """Stop at once (``immediate``: no checkpoint, connections cut), as a crash does."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                      "stop")

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str = "rewardd_test") -> Iterator[str]:
    """A new database on ``server_url``'s server, dropped afterwards: its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                break
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
