"""stage profiles say who measured them: stage_profiles.measured_by

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 10:00:00.000000

`measured_by` lists the processes that ran the stage, one `<node>:<pid>` per host of its
submesh (`StageProfileResult.measured_by`), for the profile table and its CSV. Existing rows
take it from their stored result where it has one, and an empty list otherwise.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The stored result's own measured_by when it is a JSON array, else an empty one.
_FILL = {
    "postgresql": "UPDATE stage_profiles SET measured_by = CASE "
    "WHEN json_typeof(result -> 'measured_by') = 'array' THEN result -> 'measured_by' "
    "ELSE CAST('[]' AS JSON) END",
    "sqlite": "UPDATE stage_profiles SET measured_by = CASE "
    "WHEN json_type(result, '$.measured_by') = 'array' "
    "THEN json_extract(result, '$.measured_by') ELSE '[]' END",
}


def upgrade() -> None:
    with op.batch_alter_table("stage_profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("measured_by", sa.JSON(), nullable=True))
    op.execute(_FILL[op.get_context().dialect.name])
    with op.batch_alter_table("stage_profiles", schema=None) as batch_op:
        batch_op.alter_column("measured_by", existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("stage_profiles", schema=None) as batch_op:
        batch_op.drop_column("measured_by")
