"""stage profiles keep their pipeline peak: stage_profiles.pipeline_peak_memory

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 02:20:00.000000

A stored stage is reused by jobs on devices of other sizes, and the profile table shows how
many stages may follow it on each row's own job's devices (Alpa's rule), from its forward /
backward peak (`StageProfileResult.pipeline_peak_memory`), its parameters and optimizer state
and its stash. Existing rows take the peak from their stored result: the largest
`peak_memory` of its forward and backward modules; null where the result has none (the row
then shows the figure it was stored with).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FILL = {
    "postgresql": "UPDATE stage_profiles SET pipeline_peak_memory = ("
    "SELECT MAX(CAST(m ->> 'peak_memory' AS BIGINT)) "
    "FROM json_array_elements(result -> 'module_profile_results') AS m "
    "WHERE m ->> 'module' IN ('forward', 'backward')) "
    "WHERE json_typeof(result -> 'module_profile_results') = 'array'",
    "sqlite": "UPDATE stage_profiles SET pipeline_peak_memory = ("
    "SELECT MAX(CAST(json_extract(m.value, '$.peak_memory') AS INTEGER)) "
    "FROM json_each(stage_profiles.result, '$.module_profile_results') AS m "
    "WHERE json_extract(m.value, '$.module') IN ('forward', 'backward')) "
    "WHERE json_type(result, '$.module_profile_results') = 'array'",
}


def upgrade() -> None:
    op.add_column("stage_profiles", sa.Column("pipeline_peak_memory", sa.BigInteger()))
    op.execute(_FILL[op.get_context().dialect.name])


def downgrade() -> None:
    # in place (SQLite >= 3.35 drops a column itself): a batch copy of the table would drop
    # it while job_candidates' rows still refer to it
    op.drop_column("stage_profiles", "pipeline_peak_memory")
