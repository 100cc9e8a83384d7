"""The record's one interface, :class:`RecordStore`: write rollouts, list runs, page through
a run's rollouts, apply retention. SQLAlchemy Core, no ORM: the writes are bulk inserts and
one upsert per run, the reads a few indexed selects; the same statements run on SQLite and
PostgreSQL (the dialect only picks the upsert construct). The rollouts and verdicts of a write
skip SQLAlchemy's per-row work and go to the driver as prepared rows
(:meth:`RecordStore.write`: ``COPY`` on PostgreSQL, one ``executemany`` on SQLite; 4 to 6 ms
of the writer thread's CPU per 512 rollouts instead of 16 to 37 ms).

Layout of a rollout row: ``rewards`` is ``{component: reward}``, ``status`` is
``{component: {"outcome": ..., "entry": {...the response's status entry...}}}``; the
``verdicts`` table repeats component, reward and outcome per row so that filters use an index.
A rollout read back lists its verdicts by component name (PostgreSQL's JSONB keeps no key
order, so neither backend promises the written one).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import orjson
from sqlalchemy import (Engine, and_, or_, bindparam, case, create_engine, delete, event, exists, func, insert,
                        select, text, update)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url

from rewardd.service.gcpause import gc_paused
from rewardd.service.records.migrate import upgrade
from rewardd.service.stepstats import StepStats
from rewardd.service.records.models import (FAILED, OK, ComponentStep, GroupInputs, Retention,
                                            RolloutPage, RolloutQuery, RolloutRecord,
                                            RunSummary, StepSummary, StoredRollout, Verdict)
from rewardd.service.records.schema import batches, inputs, rollouts, runs, verdicts

MAX_PAGE = 1000
CONNECT_TIMEOUT_S = 5


class UnsupportedDatabase(ValueError):
    """REWARDD_DATABASE_URL names a database the record cannot use."""


def database_url(url: str) -> URL:
    """``url`` as SQLAlchemy needs it: a plain ``postgresql://user@host:port/db`` (or
    ``postgres://``) runs on psycopg 3; ``sqlite:///path`` is a file."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        return parsed
    raise UnsupportedDatabase(
        f"REWARDD_DATABASE_URL: unsupported database {backend!r}; use "
        "postgresql://user@host:port/database or sqlite:///path/to/file")


def dumps(document: Any) -> str:
    """JSON columns through orjson (a 512-rollout write spent most of its time in the
    standard library's encoder); what orjson refuses (an integer beyond 64 bits) falls back."""
    try:
        return orjson.dumps(document).decode()
    except TypeError:
        return json.dumps(document)


def create_record_engine(url: str) -> Engine:
    """An engine for ``url``. SQLite: the file's folder is created, WAL lets the writer and
    readers work at once, foreign keys are enforced (retention cascades to verdicts).
    PostgreSQL: connections are checked before use (a restarted server costs one retry)."""
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"check_same_thread": False,
                                                     "timeout": 30},
                               json_serializer=dumps, json_deserializer=orjson.loads)

        @event.listens_for(engine, "connect")
        def _pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL"):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()
        return engine
    return create_engine(parsed, pool_pre_ping=True, pool_size=4, max_overflow=4,
                         connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
                         json_serializer=dumps, json_deserializer=orjson.loads)


class RecordStore:
    """The run record on one database (see the module doc). Blocking: call it from a thread
    (the writer's, or the API's thread pool), never from the event loop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._rollout_sequence: str | None = None

    @classmethod
    def open(cls, url: str) -> RecordStore:
        """Connect to ``url`` and migrate it to this release's schema."""
        engine = create_record_engine(url)
        upgrade(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def ping(self) -> None:
        """Raises when the database does not answer."""
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    # ---- writing ----------------------------------------------------------------------------

    def write(self, records: Sequence[RolloutRecord | RolloutRow]) -> None:
        """Store ``records`` in one transaction (all or none), in their order (their ids
        ascend with it). A :class:`RolloutRow` is a record already in the table's layout (what
        the writer thread builds); a :class:`RolloutRecord` is laid out here.

        The rows go to the driver as they are, with no statement compiled per row: on
        PostgreSQL ``COPY ... FROM STDIN`` with ids drawn from the table's sequence first, on
        SQLite one ``executemany`` with ids numbered from the first row's (the transaction
        holds SQLite's write lock from its first insert, so another process writing the same
        file waits and numbers after it). :meth:`write_statements` is the same write as plain
        SQLAlchemy statements."""
        if not records:
            return
        rows = [r if type(r) is RolloutRow else rollout_row(r) for r in records]
        with self.engine.begin() as connection:
            driver = connection.connection.driver_connection
            if self.dialect == "postgresql":
                _copy_postgresql(driver, rows, self._sequence(driver))
            else:
                _insert_sqlite(driver, rows)
            stats = _batch_rows(rows)
            if stats and self.dialect == "postgresql":
                with driver.cursor() as cursor:
                    cursor.executemany(_PG_BATCHES, stats)
            elif stats:
                driver.executemany(_SQLITE_BATCHES, stats)
            for values in _run_counters(rows):
                connection.execute(self._upsert_run, values)

    def _sequence(self, driver: Any) -> str:
        """The sequence numbering ``rollouts.id`` (its name, looked up once)."""
        if self._rollout_sequence is None:
            self._rollout_sequence = driver.execute(
                "SELECT pg_get_serial_sequence('rollouts', 'id')").fetchone()[0]
        return self._rollout_sequence

    def write_statements(self, records: Sequence[RolloutRecord | RolloutRow]) -> None:
        """:meth:`write` through SQLAlchemy Core statements (inserts with ``RETURNING``, one
        round of parameter processing per row): slower, and what :meth:`write`'s driver paths
        are tested against."""
        if not records:
            return
        rows = [r if type(r) is RolloutRow else rollout_row(r) for r in records]
        with self.engine.begin() as connection:
            kept = _inputs_rows(rows)
            if kept:
                connection.execute(self._insert_new(inputs), [
                    {"tenant": tenant, "digest": digest, "document": json.loads(document)}
                    for tenant, digest, document in kept])
            ids = connection.execute(
                insert(rollouts).returning(rollouts.c.id, sort_by_parameter_order=True),
                [{**dict(zip(ROW_COLUMNS, row.values)),
                  **{name: json.loads(row.values[i]) for i, name in _DOCUMENTS}}
                 for row in rows]).scalars().all()
            verdict_rows = [{"rollout": rid, "component": component, "reward": reward,
                             "outcome": outcome}
                            for rid, row in zip(ids, rows)
                            for component, reward, outcome in row.verdicts]
            if verdict_rows:
                connection.execute(insert(verdicts), verdict_rows)
            stats = _batch_rows(rows)
            if stats:
                connection.execute(insert(batches), [
                    {"tenant": tenant, "run_id": run_id, "step": step, "recorded_at": at,
                     "stats": json.loads(document)}
                    for tenant, run_id, step, at, document in stats])
            for values in _run_counters(rows):
                connection.execute(self._upsert_run, values)

    def _insert_new(self, table: Any) -> Any:
        """An insert that skips rows whose key is already there (content-addressed rows)."""
        construct = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        return construct(table).on_conflict_do_nothing()

    @functools.cached_property
    def _upsert_run(self) -> Any:
        """The upsert of a run's counters (built once: its parameters are bound per run)."""
        construct = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        statement = construct(runs).values({column: bindparam(column) for column in (
            "tenant", "run_id", "first_at", "last_at", "last_step", "rollouts")})
        new = statement.excluded
        return statement.on_conflict_do_update(
            index_elements=[runs.c.tenant, runs.c.run_id],
            set_={"first_at": case((new.first_at < runs.c.first_at, new.first_at),
                                   else_=runs.c.first_at),
                  "last_at": case((new.last_at > runs.c.last_at, new.last_at),
                                  else_=runs.c.last_at),
                  "last_step": case((runs.c.last_step.is_(None), new.last_step),
                                    (new.last_step > runs.c.last_step, new.last_step),
                                    else_=runs.c.last_step),
                  "rollouts": runs.c.rollouts + new.rollouts})

    # ---- reading ----------------------------------------------------------------------------

    def runs(self, tenant: str, limit: int = 100) -> list[RunSummary]:
        """The tenant's runs, the most recently written first."""
        query = (select(runs).where(runs.c.tenant == tenant)
                 .order_by(runs.c.last_at.desc(), runs.c.run_id).limit(min(limit, MAX_PAGE)))
        with self.engine.connect() as connection:
            return [_summary(row) for row in connection.execute(query)]

    def run(self, tenant: str, run_id: str) -> RunSummary | None:
        query = select(runs).where(runs.c.tenant == tenant, runs.c.run_id == run_id)
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return _summary(row) if row is not None else None

    def rollouts(self, tenant: str, run_id: str, query: RolloutQuery) -> RolloutPage:
        """A page of the run's rollouts in the order they were written, filtered by
        ``query`` (see :class:`RolloutQuery`)."""
        limit = max(1, min(query.limit, MAX_PAGE))
        conditions = [rollouts.c.tenant == tenant, rollouts.c.run_id == run_id]
        if query.after is not None:
            conditions.append(rollouts.c.id > query.after)
        if query.step is not None:
            conditions.append(rollouts.c.step == query.step)
        if query.source is not None:
            conditions.append(rollouts.c.source == query.source)
        if query.text:
            conditions.append(rollouts.c.completion.contains(query.text, autoescape=True))
        conditions.extend(_verdict_conditions(query))
        statement = (select(rollouts).where(and_(*conditions)).order_by(rollouts.c.id)
                     .limit(limit + 1))
        with self.engine.connect() as connection:
            rows = connection.execute(statement).all()
        items = tuple(StoredRollout(row.id, _record(row)) for row in rows[:limit])
        return RolloutPage(items, items[-1].id if len(rows) > limit else None)

    def steps(self, tenant: str, run_id: str, last: int = 100) -> list[StepSummary]:
        """Per-step summaries of the run's ``last`` steps (newest first): rollouts, failed
        rollouts, per component the mean and spread of its rewards and its failures, rollouts
        per source. Three grouped selects over the run's indexed rows."""
        in_run = and_(rollouts.c.tenant == tenant, rollouts.c.run_id == run_id)
        with self.engine.connect() as connection:
            wanted = list(connection.execute(
                select(rollouts.c.step).where(in_run).group_by(rollouts.c.step)
                .order_by(rollouts.c.step.desc().nulls_last()).limit(last)).scalars())
            if not wanted:
                return []
            numbered = [step for step in wanted if step is not None]
            step_match = (rollouts.c.step.in_(numbered) if None not in wanted
                          else (rollouts.c.step.in_(numbered) | rollouts.c.step.is_(None)))
            counts = connection.execute(
                select(rollouts.c.step, rollouts.c.source, rollouts.c.outcome,
                       func.count().label("n"),
                       func.count(rollouts.c.num_tokens).label("with_length"),
                       func.sum(rollouts.c.num_tokens).label("length"),
                       func.count(rollouts.c.zero_advantage).label("with_advantages"),
                       func.sum(case((rollouts.c.zero_advantage, 1), else_=0)).label("zero"))
                .where(in_run, step_match)
                .group_by(rollouts.c.step, rollouts.c.source, rollouts.c.outcome)).all()
            scored = connection.execute(
                select(rollouts.c.step, verdicts.c.component, verdicts.c.outcome,
                       func.count().label("n"), func.count(verdicts.c.reward).label("rewarded"),
                       func.sum(verdicts.c.reward).label("total"),
                       func.sum(verdicts.c.reward * verdicts.c.reward).label("squares"))
                .select_from(rollouts.join(verdicts, verdicts.c.rollout == rollouts.c.id))
                .where(in_run, step_match)
                .group_by(rollouts.c.step, verdicts.c.component, verdicts.c.outcome)).all()
        return [_step_summary(step, counts, scored) for step in wanted]

    def step_stats(self, tenant: str, run_id: str, steps: Sequence[int] | None = None,
                   last: int | None = None) -> list[tuple[int | None, StepStats]]:
        """The run's step statistics (its batches' added up per step), oldest step first
        (the unnumbered step last); only ``steps`` when given, only the ``last`` numbered
        steps with ``last``."""
        in_run = and_(batches.c.tenant == tenant, batches.c.run_id == run_id)
        query = select(batches.c.step, batches.c.stats).where(in_run).order_by(batches.c.id)
        if steps is not None:
            query = query.where(batches.c.step.in_(list(steps)))
        if last is not None:
            recent = (select(batches.c.step).where(in_run, batches.c.step.is_not(None))
                      .group_by(batches.c.step).order_by(batches.c.step.desc()).limit(last))
            query = query.where(batches.c.step.in_(recent))
        merged: dict[int | None, StepStats] = {}
        # a run's statistics are many small lists: with the collector on, its generation-2
        # passes over them cost more than reading them (1,000 steps: 0.6 s -> see README)
        with gc_paused(), self.engine.connect() as connection:
            for step, document in connection.execute(query):
                part = StepStats.from_document(document)
                if step in merged:
                    merged[step].merge(part)
                else:
                    merged[step] = part
        return sorted(merged.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))

    def replay_counts(self, tenant: str, run_id: str,
                      steps: tuple[int, int] | None = None) -> tuple[int, int]:
        """(rollouts of the run within ``steps``, those replay can re-score: recorded with
        their completion and their group's inputs)."""
        conditions = self._replay_conditions(tenant, run_id, steps)
        replayable = case((and_(rollouts.c.completion.is_not(None),
                                rollouts.c.inputs.is_not(None)), 1), else_=0)
        with self.engine.connect() as connection:
            total, able = connection.execute(
                select(func.count(), func.coalesce(func.sum(replayable), 0))
                .where(*conditions)).one()
        return int(total), int(able)

    def replayable(self, tenant: str, run_id: str, steps: tuple[int, int] | None = None,
                   after: int | None = None, limit: int = 500) -> list[StoredRollout]:
        """A page (in written order, after the id ``after``) of the rollouts replay can
        re-score, each with its group's inputs."""
        conditions = self._replay_conditions(tenant, run_id, steps)
        conditions += [rollouts.c.completion.is_not(None)]
        if after is not None:
            conditions.append(rollouts.c.id > after)
        statement = (select(rollouts, inputs.c.document.label("inputs_document"))
                     .join(inputs, and_(inputs.c.tenant == rollouts.c.tenant,
                                        inputs.c.digest == rollouts.c.inputs))
                     .where(*conditions).order_by(rollouts.c.id).limit(limit))
        with self.engine.connect() as connection:
            rows = connection.execute(statement).all()
        return [StoredRollout(row.id, replace(_record(row), inputs=GroupInputs.from_document(
            row.inputs, row.inputs_document))) for row in rows]

    @staticmethod
    def _replay_conditions(tenant: str, run_id: str,
                           steps: tuple[int, int] | None) -> list[Any]:
        conditions = [rollouts.c.tenant == tenant, rollouts.c.run_id == run_id]
        if steps is not None:
            conditions += [rollouts.c.step >= steps[0], rollouts.c.step <= steps[1]]
        return conditions

    def tenants(self) -> list[str]:
        with self.engine.connect() as connection:
            return list(connection.execute(select(runs.c.tenant).distinct()).scalars())

    # ---- retention --------------------------------------------------------------------------

    def prune(self, tenant: str, retention: Retention, now: float | None = None) -> int:
        """Delete the tenant's rollouts older than ``retention.max_age_s`` and, beyond
        ``retention.max_rollouts``, the oldest; runs left empty go too. Returns how many
        rollouts were deleted."""
        now = time.time() if now is None else now
        deleted = 0
        with self.engine.begin() as connection:
            if retention.max_age_s is not None:
                deleted += connection.execute(delete(rollouts).where(
                    rollouts.c.tenant == tenant,
                    rollouts.c.recorded_at < now - retention.max_age_s)).rowcount
            if retention.max_rollouts is not None:
                newest_dropped = connection.execute(
                    select(rollouts.c.id).where(rollouts.c.tenant == tenant)
                    .order_by(rollouts.c.id.desc()).offset(retention.max_rollouts).limit(1)
                ).scalar()
                if newest_dropped is not None:
                    deleted += connection.execute(delete(rollouts).where(
                        rollouts.c.tenant == tenant, rollouts.c.id <= newest_dropped)).rowcount
            if deleted:
                remaining = (select(func.count()).select_from(rollouts)
                             .where(rollouts.c.tenant == runs.c.tenant,
                                    rollouts.c.run_id == runs.c.run_id).scalar_subquery())
                connection.execute(update(runs).where(runs.c.tenant == tenant)
                                   .values(rollouts=remaining))
                connection.execute(delete(runs).where(runs.c.tenant == tenant,
                                                      runs.c.rollouts == 0))
                connection.execute(delete(inputs).where(
                    inputs.c.tenant == tenant,
                    ~exists().where(rollouts.c.tenant == inputs.c.tenant,
                                    rollouts.c.inputs == inputs.c.digest)))
                # a batch's statistics go with the last of its run's rollouts of its step
                connection.execute(delete(batches).where(
                    batches.c.tenant == tenant,
                    ~exists().where(rollouts.c.tenant == batches.c.tenant,
                                    rollouts.c.run_id == batches.c.run_id,
                                    or_(rollouts.c.step == batches.c.step,
                                        and_(rollouts.c.step.is_(None),
                                             batches.c.step.is_(None))))))
        return deleted


ROW_COLUMNS = ("tenant", "run_id", "step", "source", "group_id", "rollout_id", "recorded_at",
               "outcome", "rewards", "status", "summary", "completion", "num_tokens",
               "zero_advantage", "inputs")
"""The ``rollouts`` columns a :class:`RolloutRow` holds (all but ``id``), in its order."""
_DOCUMENTS = tuple((ROW_COLUMNS.index(name), name) for name in ("rewards", "status", "summary"))
_TENANT, _RUN, _STEP, _RECORDED_AT = (ROW_COLUMNS.index(name)
                                      for name in ("tenant", "run_id", "step", "recorded_at"))


@dataclass(slots=True)
class RolloutRow:
    """A rollout in the tables' layout, ready to write: ``values`` are the ``rollouts``
    columns of :data:`ROW_COLUMNS` with the JSON documents (``rewards``, ``status``,
    ``summary``) as JSON text; ``verdicts`` its ``(component, reward, outcome)`` rows;
    ``inputs`` its group's ``(digest, document as JSON text)`` when it keeps them;
    ``batch`` the batch's statistics on its first row."""

    values: tuple[Any, ...]
    verdicts: tuple[tuple[str, float | None, str], ...]
    inputs: tuple[str, str] | None = None
    batch: str | None = None
    """On a batch's first row: the batch's step statistics as JSON text (table ``batches``)."""


def rollout_row(record: RolloutRecord) -> RolloutRow:
    """``record`` laid out as it is stored (see the module doc)."""
    kept = record.inputs
    return RolloutRow(
        (record.tenant, record.run_id, record.step, record.source, record.group_id,
         record.rollout_id, record.recorded_at, record.outcome,
         dumps({v.component: v.reward for v in record.verdicts}),
         dumps({v.component: {"outcome": v.outcome, "entry": dict(v.status)}
                for v in record.verdicts}),
         dumps(dict(record.summary) if record.summary is not None else None),
         record.completion, record.num_tokens, record.zero_advantage,
         kept.digest if kept is not None else None),
        tuple((v.component, v.reward, v.outcome) for v in record.verdicts),
        (kept.digest, dumps(kept.to_document())) if kept is not None else None)


_SQLITE_BATCHES = ("INSERT INTO batches (tenant, run_id, step, recorded_at, stats) "
                   "VALUES (?, ?, ?, ?, ?)")
_PG_BATCHES = ("INSERT INTO batches (tenant, run_id, step, recorded_at, stats) "
               "VALUES (%s, %s, %s, %s, %s::jsonb)")


def _batch_rows(rows: Sequence[RolloutRow]) -> list[tuple[Any, ...]]:
    """``(tenant, run_id, step, recorded_at, stats)`` of each batch among ``rows``."""
    return [(row.values[_TENANT], row.values[_RUN], row.values[_STEP],
             row.values[_RECORDED_AT], row.batch) for row in rows if row.batch is not None]


def _inputs_rows(rows: Sequence[RolloutRow]) -> list[tuple[str, str, str]]:
    """``(tenant, digest, document)`` per distinct group inputs among ``rows``, in key order
    (pods writing the same inputs at once take their row locks in one order)."""
    kept = {(row.values[_TENANT], row.inputs[0]): row.inputs[1]
            for row in rows if row.inputs is not None}
    return [(tenant, digest, kept[tenant, digest]) for tenant, digest in sorted(kept)]


_COLUMN_LIST = ", ".join(ROW_COLUMNS)
_SQLITE_INPUTS = ("INSERT INTO inputs (tenant, digest, document) VALUES (?, ?, ?) "
                  "ON CONFLICT DO NOTHING")
_SQLITE_FIRST = (f"INSERT INTO rollouts ({_COLUMN_LIST}) "
                 f"VALUES ({', '.join('?' * len(ROW_COLUMNS))})")
_SQLITE_NEXT = (f"INSERT INTO rollouts (id, {_COLUMN_LIST}) "
                f"VALUES ({', '.join('?' * (len(ROW_COLUMNS) + 1))})")
_SQLITE_VERDICTS = "INSERT INTO verdicts (rollout, component, reward, outcome) VALUES (?, ?, ?, ?)"


def _insert_sqlite(driver: Any, rows: Sequence[RolloutRow]) -> None:
    """``rows`` through the sqlite3 connection, in the caller's transaction. The first
    rollout takes the next rowid (and the database's write lock, held to the commit: no
    other connection inserts until then), the others the ids after it, given explicitly: a
    rowid SQLite did not pick as the next one would be an integrity error, never a verdict
    on another rollout."""
    cursor = driver.cursor()
    try:
        kept = _inputs_rows(rows)
        if kept:
            cursor.executemany(_SQLITE_INPUTS, kept)
        cursor.execute(_SQLITE_FIRST, rows[0].values)
        if not driver.in_transaction:  # sqlite3 in autocommit: the lock would not be held
            raise RuntimeError("the record's SQLite connection must open a transaction")
        first = cursor.lastrowid
        if len(rows) > 1:
            cursor.executemany(_SQLITE_NEXT, [(first + i, *rows[i].values)
                                              for i in range(1, len(rows))])
        cursor.executemany(_SQLITE_VERDICTS, [
            (first + i, *verdict) for i, row in enumerate(rows) for verdict in row.verdicts])
    finally:
        cursor.close()


_PG_INPUTS = ("INSERT INTO inputs (tenant, digest, document) VALUES (%s, %s, %s::jsonb) "
              "ON CONFLICT DO NOTHING")
_PG_ROLLOUTS = f"COPY rollouts (id, {_COLUMN_LIST}) FROM STDIN"
_PG_VERDICTS = "COPY verdicts (rollout, component, reward, outcome) FROM STDIN"


def _copy_postgresql(driver: Any, rows: Sequence[RolloutRow], sequence: str) -> None:
    """``rows`` through the psycopg connection, in the caller's transaction: their ids from
    the sequence in one round trip (ascending in the rows' order), then one ``COPY`` for the
    rollouts and one for their verdicts (text format: JSON documents go in as their text)."""
    with driver.cursor() as cursor:
        kept = _inputs_rows(rows)
        if kept:
            cursor.executemany(_PG_INPUTS, kept)
        cursor.execute("SELECT nextval(%s::regclass) FROM generate_series(1, %s)",
                       (sequence, len(rows)))
        ids = sorted(rid for rid, in cursor.fetchall())
        with cursor.copy(_PG_ROLLOUTS) as copy:
            write = copy.write_row
            for rid, row in zip(ids, rows):
                write((rid, *row.values))
        with cursor.copy(_PG_VERDICTS) as copy:
            write = copy.write_row
            for rid, row in zip(ids, rows):
                for verdict in row.verdicts:
                    write((rid, *verdict))


def _run_counters(rows: Iterable[RolloutRow]) -> list[dict[str, Any]]:
    """One row of counters per (tenant, run) among ``rows``."""
    by_run: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        values = row.values
        tenant, run_id, step, at = (values[_TENANT], values[_RUN], values[_STEP],
                                    values[_RECORDED_AT])
        counters = by_run.get((tenant, run_id))
        if counters is None:
            by_run[tenant, run_id] = {"tenant": tenant, "run_id": run_id, "first_at": at,
                                      "last_at": at, "last_step": step, "rollouts": 1}
            continue
        counters["rollouts"] += 1
        if at < counters["first_at"]:
            counters["first_at"] = at
        if at > counters["last_at"]:
            counters["last_at"] = at
        if step is not None and (counters["last_step"] is None or step > counters["last_step"]):
            counters["last_step"] = step
    return list(by_run.values())


def _verdict_conditions(query: RolloutQuery) -> list[Any]:
    outcome, component = query.outcome, query.component
    if component is None:
        if outcome in (OK, FAILED):
            return [rollouts.c.outcome == outcome]
        if outcome is None:
            return []
        return [exists().where(verdicts.c.rollout == rollouts.c.id,
                               verdicts.c.outcome == outcome)]
    matches = [verdicts.c.rollout == rollouts.c.id, verdicts.c.component == component]
    if outcome == FAILED:
        matches.append(verdicts.c.outcome != OK)
    elif outcome is not None:
        matches.append(verdicts.c.outcome == outcome)
    return [exists().where(*matches)]


def _step_summary(step: int | None, counts: Sequence[Any],
                  scored: Sequence[Any]) -> StepSummary:
    rollouts_n = failed = with_length = length = with_advantages = zero = 0
    sources: dict[str, int] = {}
    for row in counts:
        if row.step != step:
            continue
        rollouts_n += row.n
        failed += row.n if row.outcome != OK else 0
        sources[row.source or ""] = sources.get(row.source or "", 0) + row.n
        with_length += row.with_length
        length += row.length or 0
        with_advantages += row.with_advantages
        zero += row.zero or 0
    parts: dict[str, dict[str, Any]] = {}
    for row in scored:
        if row.step != step:
            continue
        part = parts.setdefault(row.component, {"n": 0, "rewarded": 0, "total": 0.0,
                                                "squares": 0.0, "failures": {}})
        part["n"] += row.n
        part["rewarded"] += row.rewarded
        part["total"] += row.total or 0.0
        part["squares"] += row.squares or 0.0
        if row.outcome != OK:
            part["failures"][row.outcome] = part["failures"].get(row.outcome, 0) + row.n
    components = {}
    for name, part in sorted(parts.items()):
        k = part["rewarded"]
        mean = part["total"] / k if k else None
        std = (max(part["squares"] / k - mean * mean, 0.0) ** 0.5
               if k and mean is not None else None)
        components[name] = ComponentStep(part["n"], mean, std, dict(part["failures"]))
    return StepSummary(step, rollouts_n, failed, components, dict(sorted(sources.items())),
                       length / with_length if with_length else None,
                       zero / with_advantages if with_advantages else None)


def _summary(row: Any) -> RunSummary:
    return RunSummary(row.run_id, row.first_at, row.last_at, row.last_step, row.rollouts)


def _record(row: Any) -> RolloutRecord:
    rewards, status = row.rewards or {}, row.status or {}
    return RolloutRecord(
        tenant=row.tenant, run_id=row.run_id, group_id=row.group_id,
        rollout_id=row.rollout_id, recorded_at=row.recorded_at, step=row.step,
        source=row.source, summary=row.summary, completion=row.completion,
        num_tokens=row.num_tokens, zero_advantage=row.zero_advantage,
        verdicts=tuple(Verdict(component, rewards.get(component), kept["outcome"],
                               kept.get("entry") or {})
                       for component, kept in sorted(status.items())))
