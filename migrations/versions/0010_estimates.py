"""estimates: jobs.estimated, jobs.phase, job_candidates.estimated_cost

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 19:00:00.000000

A job that estimates stages from layer profiles (`PlanOptions.search: estimate`) records per
candidate its estimate (`estimated_cost`, seconds) and, for stages it never measured, the
status `estimated`; `jobs.estimated` counts them and `jobs.phase` says what a running job is
doing. Existing rows estimated nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("estimated", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("phase", sa.String(length=64), nullable=True))
    with op.batch_alter_table("job_candidates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("estimated_cost", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_candidates", schema=None) as batch_op:
        batch_op.drop_column("estimated_cost")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("phase")
        batch_op.drop_column("estimated")
