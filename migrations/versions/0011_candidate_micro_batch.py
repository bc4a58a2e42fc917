"""candidate micro-batch: job_candidates.micro_batch_size, in the candidates' uniqueness

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 23:00:00.000000

A job that searches the count of micro-batches (`PlanOptions.microbatch_search`) has the
same candidate key `(start, end, submesh_id, config_id)` once per micro-batch size, each its
own stage: `micro_batch_size` names the size (0: the job plans one count, at its spec's own
size, as every existing row does) and the job's uniqueness includes it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KEY = ["job_id", "start", "end", "submesh_id", "config_id"]


def upgrade() -> None:
    with op.batch_alter_table("job_candidates", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("micro_batch_size", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.drop_constraint("uq_job_candidates_job_id", type_="unique")
        batch_op.create_unique_constraint(
            "uq_job_candidates_job_id", [*OLD_KEY, "micro_batch_size"]
        )


def downgrade() -> None:
    """Only while no job searched counts (two sizes of one key would collide)."""
    with op.batch_alter_table("job_candidates", schema=None) as batch_op:
        batch_op.drop_constraint("uq_job_candidates_job_id", type_="unique")
        batch_op.create_unique_constraint("uq_job_candidates_job_id", OLD_KEY)
        batch_op.drop_column("micro_batch_size")
