"""idempotent submission: jobs.idempotency_key (unique) and jobs.request_hash

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 13:30:00.000000

`idempotency_key` is the client's `Idempotency-Key` header (NULL when none was sent);
`request_hash` is the server's hash of the canonical request, used to hand back an equal
job that is still queued or running. Jobs stored before this revision have both NULL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_jobs_idempotency_key"), ["idempotency_key"], unique=True
        )
        batch_op.create_index(batch_op.f("ix_jobs_request_hash"), ["request_hash"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_request_hash"))
        batch_op.drop_index(batch_op.f("ix_jobs_idempotency_key"))
        batch_op.drop_column("request_hash")
        batch_op.drop_column("idempotency_key")
