"""What replay needs: each group's inputs (prompt, reference, reward components).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Document = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "inputs",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(32), primary_key=True),
        sa.Column("document", Document, nullable=False),
    )
    op.add_column("rollouts", sa.Column("inputs", sa.String(32)))
    op.create_index("ix_rollouts_inputs", "rollouts", ["tenant", "inputs"])


def downgrade() -> None:
    op.drop_index("ix_rollouts_inputs", "rollouts")
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("inputs")
    op.drop_table("inputs")
