"""The record's tables (SQLAlchemy Core). The migrations in ``migrations/versions`` create
exactly these; ``tests/unit/test_records_store.py`` fails when the two drift apart.

Why five tables (``batches``: see its doc): a run is listed without counting its rollouts (``runs`` keeps its counters),
a rollout is filtered by component and outcome with an index rather than by reading JSON
(``verdicts``: one row per rollout and reward component), and what replay needs of a group
(its prompt, reference and reward components) is kept once however many rollouts share it
(``inputs``, keyed by the hash of its content, per tenant). What a verdict says in full (its
status entry with evidence and receipt) stays one JSON document on the rollout, read as a
whole and never queried into.
"""

from __future__ import annotations

from sqlalchemy import (JSON, BigInteger, Boolean, Column, Float, ForeignKey, Index, Integer, MetaData,
                        String, Table, Text)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

Document = JSON().with_variant(JSONB(), "postgresql")
"""JSON in SQLite (text), JSONB in PostgreSQL (stored parsed, smaller to read back)."""

TENANT_LENGTH = 128
NAME_LENGTH = 256
"""Run, group and rollout ids and sources are request names (at most 256 characters)."""

runs = Table(
    "runs", metadata,
    Column("tenant", String(TENANT_LENGTH), primary_key=True),
    Column("run_id", String(NAME_LENGTH), primary_key=True),
    Column("first_at", Float, nullable=False),
    Column("last_at", Float, nullable=False),
    Column("last_step", Integer),
    Column("rollouts", BigInteger, nullable=False),
    Index("ix_runs_tenant_last_at", "tenant", "last_at"),
)

rollouts = Table(
    "rollouts", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("tenant", String(TENANT_LENGTH), nullable=False),
    Column("run_id", String(NAME_LENGTH), nullable=False),
    Column("step", Integer),
    Column("source", String(NAME_LENGTH)),
    Column("group_id", String(NAME_LENGTH), nullable=False),
    Column("rollout_id", String(NAME_LENGTH), nullable=False),
    Column("recorded_at", Float, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("rewards", Document, nullable=False),
    Column("status", Document, nullable=False),
    Column("summary", Document),
    Column("completion", Text),
    Column("num_tokens", Integer),
    Column("zero_advantage", Boolean),
    Column("inputs", String(32)),
    Index("ix_rollouts_run_step", "tenant", "run_id", "step", "id"),
    Index("ix_rollouts_run_source", "tenant", "run_id", "source", "id"),
    Index("ix_rollouts_tenant_recorded", "tenant", "recorded_at"),
    Index("ix_rollouts_inputs", "tenant", "inputs"),
)

inputs = Table(
    "inputs", metadata,
    Column("tenant", String(TENANT_LENGTH), primary_key=True),
    Column("digest", String(32), primary_key=True),
    Column("document", Document, nullable=False),
)
"""What a group was scored from (:class:`~rewardd.service.records.models.GroupInputs`), for
replay: kept only beside rollouts recorded with their completions."""

batches = Table(
    "batches", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("tenant", String(TENANT_LENGTH), nullable=False),
    Column("run_id", String(NAME_LENGTH), nullable=False),
    Column("step", Integer),
    Column("recorded_at", Float, nullable=False),
    Column("stats", Document, nullable=False),
    Index("ix_batches_run_step", "tenant", "run_id", "step"),
    Index("ix_batches_tenant_recorded", "tenant", "recorded_at"),
)
"""One row per recorded batch: its :class:`~rewardd.service.stepstats.StepStats` (counts and
sums; a step's are the sum of its batches'), what the sentinel and the step charts read
instead of the rollouts."""

verdicts = Table(
    "verdicts", metadata,
    Column("rollout", BigInteger().with_variant(Integer, "sqlite"),
           ForeignKey("rollouts.id", ondelete="CASCADE"), primary_key=True),
    Column("component", String(NAME_LENGTH), primary_key=True),
    Column("reward", Float),
    Column("outcome", String(32), nullable=False),
    Index("ix_verdicts_component_outcome", "component", "outcome", "rollout"),
)
