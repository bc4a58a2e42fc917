"""jobs say what they wait for: jobs.waiting

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 16:30:00.000000

`waiting` is what a running job waits for right now (devices another job holds on a shared
Ray cluster), or null. Existing rows wait for nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("waiting", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("waiting")
