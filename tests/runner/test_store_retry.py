"""Store access waits out a database outage (a cut TCP proxy in front of the real Postgres)
and tells transient errors from real ones."""

import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from store import make_engine, make_sessionmaker
from tests.runner.tcp_proxy import TcpProxy
from tests.support.databases import postgres_url
from workers.jobs.retry import StoreRetry, WorkerShutdown, is_transient

pytestmark = pytest.mark.postgres

OUTAGE_S = 2.0


@pytest.fixture
def proxied() -> Iterator[tuple[TcpProxy, sessionmaker[Session]]]:
    url = make_url(postgres_url())
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        engine = make_engine(url.set(host="127.0.0.1", port=proxy.port).render_as_string(False))
        yield proxy, make_sessionmaker(engine)
        engine.dispose()


def _select_one(s: Session) -> int:
    return int(s.execute(text("SELECT 1")).scalar_one())


def test_patient_access_waits_out_an_outage(
    proxied: tuple[TcpProxy, sessionmaker[Session]],
) -> None:
    proxy, sessions = proxied
    retry = StoreRetry(sessions, max_wait_s=0.5)
    assert retry.patient("warm-up", _select_one) == 1
    proxy.cut()
    with pytest.raises(sa_exc.OperationalError) as err:
        retry.once("during the outage", _select_one)
    assert is_transient(err.value)
    threading.Timer(OUTAGE_S, proxy.restore).start()
    began = time.monotonic()
    assert retry.patient("across the outage", _select_one) == 1
    assert time.monotonic() - began >= OUTAGE_S * 0.8
    assert retry.counters.totals["db_retries"] >= 2


def test_shutdown_ends_the_wait(proxied: tuple[TcpProxy, sessionmaker[Session]]) -> None:
    proxy, sessions = proxied
    retry = StoreRetry(sessions, max_wait_s=0.5)
    proxy.cut()
    threading.Timer(0.5, retry.shutdown.set).start()
    began = time.monotonic()
    with pytest.raises(WorkerShutdown):
        retry.patient("until shutdown", _select_one)
    assert time.monotonic() - began < 3


def test_real_errors_are_not_retried(proxied: tuple[TcpProxy, sessionmaker[Session]]) -> None:
    _, sessions = proxied
    retry = StoreRetry(sessions)
    with pytest.raises(sa_exc.ProgrammingError) as err:
        retry.patient("bad sql", lambda s: s.execute(text("SELECT * FROM no_such_table")))
    assert not is_transient(err.value)
    assert retry.counters.totals["db_retries"] == 0


def test_sqlite_lock_is_transient_and_a_missing_table_is_not() -> None:
    locked = sa_exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    missing = sa_exc.OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: x"))
    assert is_transient(locked) and not is_transient(missing)
    assert is_transient(ConnectionRefusedError("connection refused"))
    assert not is_transient(ValueError("connection refused"))
