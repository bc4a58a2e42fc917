"""Server fixtures: the app served by uvicorn over HTTP against each test database."""

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from server import Settings
from store import Base, make_sessionmaker
from tests.server.live import LiveServer
from tests.support.databases import RowCounts


@pytest.fixture(scope="session")
def live_server(db_url: str) -> Iterator[LiveServer]:
    """The app with default settings (no token: loopback writes) on the test database."""
    with LiveServer(Settings(database_url=db_url)) as srv:
        yield srv


@pytest.fixture
def db(engine: Engine) -> Iterator[sessionmaker[Session]]:
    """Committing sessions on the server's database; every table is emptied after the test."""
    factory = make_sessionmaker(engine)
    try:
        yield factory
    finally:
        with engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(delete(table))


@pytest.fixture
def api(live_server: LiveServer, db: sessionmaker[Session]) -> Iterator[httpx.Client]:
    """An HTTP client of the live server (tables emptied after the test)."""
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client


@pytest.fixture
def row_counts(engine: Engine) -> RowCounts:
    """Rows per table, to show that a refused request changed nothing."""

    def count() -> dict[str, int]:
        with engine.connect() as conn:
            return {
                t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for t in Base.metadata.sorted_tables
            }

    return count
