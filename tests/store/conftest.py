"""Fixtures of the store tests."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url

from store import make_engine
from tests.support.databases import postgres_url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database for a migration test: a SQLite file, or a Postgres schema of its
    own (dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migration.db'}"
        return
    schema = f"migration_{uuid.uuid4().hex[:12]}"
    admin = make_engine(postgres_url())
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    url = make_url(postgres_url()).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()
