"""job progress: one set of counts, in distinct stages (candidates counted apart)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 14:10:00.000000

`jobs.total` (candidates) becomes `jobs.candidates` and `jobs.cached` (candidates reused)
becomes `jobs.reused`, now counted in distinct stages like `measured`, `failed` and `pruned`;
`done` is their sum. Every job's counts are recomputed from its candidates.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STAGES = "SELECT COUNT(DISTINCT c.fingerprint) FROM job_candidates c WHERE c.job_id = jobs.id"
_RECOUNT = f"""
UPDATE jobs SET
  candidates = (SELECT COUNT(*) FROM job_candidates c WHERE c.job_id = jobs.id),
  distinct_stages = ({_STAGES}),
  measured = ({_STAGES} AND c.profile_id IS NOT NULL AND c.reused = :no AND c.status = 'ok'),
  reused = ({_STAGES} AND c.profile_id IS NOT NULL AND c.reused = :yes AND c.status = 'ok'),
  failed = ({_STAGES} AND c.profile_id IS NOT NULL AND c.status <> 'ok'),
  pruned = ({_STAGES} AND c.status = 'pruned')
"""


def _recount() -> None:
    op.get_bind().execute(sa.text(_RECOUNT), {"yes": True, "no": False})
    op.execute("UPDATE jobs SET done = measured + reused + failed + pruned")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("total", new_column_name="candidates")
        batch.alter_column("cached", new_column_name="reused")
    _recount()


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("candidates", new_column_name="total")
        batch.alter_column("reused", new_column_name="cached")
