"""layer programs travel as a pair: layer_programs.backward (NULL marks the old form)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 09:00:00.000000

Models stored before this revision carry one exported forward per layer, whose VJP re-ran
the forward; they cannot be migrated (the residuals are not in the export) and get a 409
asking to trace and upload them again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("layer_programs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("backward", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("layer_programs", schema=None) as batch_op:
        batch_op.drop_column("backward")
