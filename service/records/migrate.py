"""Bring a record database to the current schema with Alembic, from code (no alembic.ini):
every store opens through :func:`upgrade`, so a new release migrates its database on start.

Several API pods start at once against one PostgreSQL: the upgrade runs under a transaction-
scoped advisory lock, so one pod migrates and the others find the work done. SQLite (one
machine) does the same under a lock file beside the database: pysqlite starts no transaction
for DDL, so two processes would both see an empty file and both create the tables. Within a
process a lock serialises upgrades too: Alembic keeps the running migration's context in a
module global.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

MIGRATIONS = Path(__file__).with_name("migrations")
ADVISORY_LOCK = 0x72657761  # "rewa": the record's migration lock in PostgreSQL
_IN_PROCESS = threading.Lock()


def config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head() -> str:
    """The newest revision this release knows."""
    revision = ScriptDirectory.from_config(config()).get_current_head()
    assert revision is not None
    return revision


def current(engine: Engine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine) -> None:
    """Migrate ``engine``'s database to :func:`head` (a no-op when it is there)."""
    cfg = config()
    with _IN_PROCESS, _sqlite_file_lock(engine), engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                               {"key": ADVISORY_LOCK})
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")


@contextlib.contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
