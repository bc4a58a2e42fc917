"""The Postgres test database (its URL and reset) and a row counter's type."""

import os
from collections.abc import Callable

from store import make_engine

POSTGRES_URL_ENV = "STAGEPROF_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/stageprof_test"

# Rows per table (the `row_counts` fixture), to show that a refused request changed nothing.
RowCounts = Callable[[], dict[str, int]]


def postgres_url() -> str:
    """The Postgres test database: scripts/run_tests.sh makes one per run."""
    return os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)


def reset_postgres(url: str) -> None:
    """Drop everything in the test database's public schema."""
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()
