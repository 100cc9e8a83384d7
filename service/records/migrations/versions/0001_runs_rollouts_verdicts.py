"""The first record: runs, rollouts and their verdicts.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Document = sa.JSON().with_variant(JSONB(), "postgresql")
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.String(256), primary_key=True),
        sa.Column("first_at", sa.Float(), nullable=False),
        sa.Column("last_at", sa.Float(), nullable=False),
        sa.Column("last_step", sa.Integer()),
        sa.Column("rollouts", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_runs_tenant_last_at", "runs", ["tenant", "last_at"])
    op.create_table(
        "rollouts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("step", sa.Integer()),
        sa.Column("source", sa.String(256)),
        sa.Column("group_id", sa.String(256), nullable=False),
        sa.Column("rollout_id", sa.String(256), nullable=False),
        sa.Column("recorded_at", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("rewards", Document, nullable=False),
        sa.Column("status", Document, nullable=False),
        sa.Column("summary", Document),
        sa.Column("completion", sa.Text()),
        sa.Column("num_tokens", sa.Integer()),
        sa.Column("zero_advantage", sa.Boolean()),
    )
    op.create_index("ix_rollouts_run_step", "rollouts", ["tenant", "run_id", "step", "id"])
    op.create_index("ix_rollouts_run_source", "rollouts", ["tenant", "run_id", "source", "id"])
    op.create_index("ix_rollouts_tenant_recorded", "rollouts", ["tenant", "recorded_at"])
    op.create_table(
        "verdicts",
        sa.Column("rollout", Id, sa.ForeignKey("rollouts.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("component", sa.String(256), primary_key=True),
        sa.Column("reward", sa.Float()),
        sa.Column("outcome", sa.String(32), nullable=False),
    )
    op.create_index("ix_verdicts_component_outcome", "verdicts",
                    ["component", "outcome", "rollout"])


def downgrade() -> None:
    op.drop_table("verdicts")
    op.drop_table("rollouts")
    op.drop_table("runs")
