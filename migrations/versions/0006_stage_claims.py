"""stage claims (one runner measures a stage fingerprint at a time) and service counters

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 13:45:00.000000

`stage_claims` holds a lease per stage fingerprint being measured; `service_counters` holds
the counters runners and API processes share (`/metrics`). Both start empty.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.base import UTCDateTime

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stage_claims",
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("fingerprint", name=op.f("pk_stage_claims")),
    )
    op.create_index(op.f("ix_stage_claims_owner"), "stage_claims", ["owner"], unique=False)
    op.create_table(
        "service_counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_service_counters")),
    )


def downgrade() -> None:
    op.drop_table("service_counters")
    op.drop_index(op.f("ix_stage_claims_owner"), table_name="stage_claims")
    op.drop_table("stage_claims")
