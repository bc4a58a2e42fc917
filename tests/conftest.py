"""Shared fixtures: a migrated database per backend (SQLite and the real Postgres).

Every test process gets 8 virtual CPU devices, set here, before any test module can import
jax and start its backend (a module-level spec export would otherwise fix it at 1 device for
the whole session, whatever tests/workers/conftest.py asks later).

Every test process also gets a persistent compilation cache of its own, an empty temp dir
removed when the session ends, so no test reads or fills the user's (~/.cache/stageprof/xla)
and no result depends on what an earlier session compiled."""

import atexit
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session, sessionmaker

from migrations import upgrade
from store import Base, make_engine, make_sessionmaker
from tests.support.databases import postgres_url, reset_postgres
from tests.support.xla_flags import with_fast_compile

# (store, migrations and sqlalchemy above do not import jax)
NUM_DEVICES = 8
_flags = os.environ.get("XLA_FLAGS", "")
_count = re.search(r"xla_force_host_platform_device_count=(\d+)", _flags)
if _count is None:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count={NUM_DEVICES}"
elif int(_count.group(1)) < NUM_DEVICES:
    os.environ["XLA_FLAGS"] = re.sub(r"device_count=\d+", f"device_count={NUM_DEVICES}", _flags)
os.environ["XLA_FLAGS"] = with_fast_compile(os.environ["XLA_FLAGS"])  # tests.support.xla_flags
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_compile_cache = tempfile.mkdtemp(prefix="stageprof-test-xla-")
os.environ["STAGEPROF_COMPILE_CACHE_DIR"] = _compile_cache
atexit.register(shutil.rmtree, _compile_cache, ignore_errors=True)


@pytest.fixture(
    scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database migrated to head: a SQLite file, or the Postgres test database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'stageprof.db'}"
    else:
        url = postgres_url()
        reset_postgres(url)
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """A session inside an outer transaction that is rolled back after the test."""
    conn = engine.connect()
    outer = conn.begin()
    sess = Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
    try:
        yield sess
    finally:
        sess.close()
        outer.rollback()
        conn.close()


@pytest.fixture
def committing(engine: Engine) -> Iterator[sessionmaker[Session]]:
    """A session factory whose commits are real (for concurrency); tables emptied after."""
    factory = make_sessionmaker(engine)
    try:
        yield factory
    finally:
        with engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(delete(table))


@pytest.fixture
def db_file(tmp_path: Path) -> str:
    """A SQLite file migrated to head, this test's own (the runner and multi-host tests)."""
    url = f"sqlite:///{tmp_path / 'runner.db'}"
    upgrade(url)
    return url


@pytest.fixture
def sessions(db_file: str) -> Iterator[sessionmaker[Session]]:
    """Committing sessions on `db_file`."""
    engine = make_engine(db_file)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def pg_sessions() -> Iterator[sessionmaker[Session]]:
    """Committing sessions on the real Postgres test database, emptied after the test."""
    url = postgres_url()
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(delete(table))
    engine.dispose()
