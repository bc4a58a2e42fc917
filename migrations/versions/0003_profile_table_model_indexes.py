"""profile table indexes: a model's table under every sort, the sort by start, rare statuses

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 05:40:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES: dict[str, list[str]] = {
    "ix_job_candidates_start": ["start", "id"],
    "ix_job_candidates_model_memory": ["model_id", "peak_memory", "id"],
    "ix_job_candidates_model_start": ["model_id", "start", "id"],
    "ix_job_candidates_model_recorded": ["model_id", "recorded_at", "id"],
    "ix_job_candidates_model_status": ["model_id", "status", "id"],
    "ix_job_candidates_status": ["status"],
}


def upgrade() -> None:
    with op.batch_alter_table("job_candidates", schema=None) as batch_op:
        for name, columns in INDEXES.items():
            batch_op.create_index(name, columns, unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_candidates", schema=None) as batch_op:
        for name in reversed(INDEXES):
            batch_op.drop_index(name)
