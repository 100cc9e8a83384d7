"""Per-batch step statistics (the sentinel's and the inspector's input).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Document = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("step", sa.Integer),
        sa.Column("recorded_at", sa.Float, nullable=False),
        sa.Column("stats", Document, nullable=False),
    )
    op.create_index("ix_batches_run_step", "batches", ["tenant", "run_id", "step"])
    op.create_index("ix_batches_tenant_recorded", "batches", ["tenant", "recorded_at"])


def downgrade() -> None:
    op.drop_index("ix_batches_tenant_recorded", "batches")
    op.drop_index("ix_batches_run_step", "batches")
    op.drop_table("batches")
