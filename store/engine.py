"""Engines and sessions for Postgres or SQLite, chosen by URL."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from schemas.settings import env_name, env_settings

DATABASE_URL_ENV = env_name("database_url")
DEFAULT_DATABASE_URL = "sqlite:///stageprof.db"
SQLITE_BUSY_TIMEOUT_S = 60


def database_url() -> str:
    """`STAGEPROF_DATABASE_URL`, or a SQLite file `./stageprof.db` in the working directory.

    A bare `postgresql://` URL is given the psycopg 3 driver.
    """
    return normalize_url(env_settings().database_url or DEFAULT_DATABASE_URL)


def normalize_url(url: str) -> str:
    """Give a bare `postgresql://` (or `postgres://`) URL the psycopg 3 driver."""
    url = url.strip()
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str | None = None, **kwargs: Any) -> Engine:
    """An engine for `url` (default: `database_url()`), with SQLite set up for concurrent use."""
    url = url or database_url()
    if url.startswith("sqlite"):
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def lock_for_write(session: Session) -> None:
    """On SQLite, take the write lock at the start of the transaction (`BEGIN IMMEDIATE`,
    waiting up to the busy timeout). A deferred transaction that read and then found another
    writer's commit fails at once with "database is locked". No-op on Postgres."""
    if session.get_bind().dialect.name == "sqlite":
        session.connection().exec_driver_sql("BEGIN IMMEDIATE")


@contextmanager
def session_scope(factory: sessionmaker[Session], *, write: bool = True) -> Iterator[Session]:
    """A session that commits on success and rolls back on error; `write` takes the write
    lock first on SQLite (see `lock_for_write`)."""
    session = factory()
    try:
        if write:
            lock_for_write(session)
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def is_postgres(session_or_engine: Session | Engine) -> bool:
    bind = session_or_engine.get_bind() if isinstance(session_or_engine, Session) else None
    engine = bind if bind is not None else session_or_engine
    return engine.dialect.name == "postgresql"  # type: ignore[union-attr]
