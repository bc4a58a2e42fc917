"""Migrations and the ORM metadata agree: autogenerate finds nothing to do."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect

from store import Base


def test_migrations_match_metadata(engine: Engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn)
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_head_revision_applied(engine: Engine) -> None:
    tables = set(inspect(engine).get_table_names())
    assert {"models", "jobs", "stage_profiles", "job_candidates", "alembic_version"} <= tables
