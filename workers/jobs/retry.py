"""Store access that waits out database outages: transient errors are retried with
exponential backoff (tenacity) until the database answers or the worker shuts down."""

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from store import session_scope
from workers.jobs.runner_metrics import RunnerCounters

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What a lost connection, a restarting server or a busy SQLite file says.
TRANSIENT_MESSAGES = (
    "connection refused",
    "could not connect",
    "server closed the connection",
    "connection is closed",
    "connection timeout",
    "terminating connection",
    "the database system is starting up",
    "the database system is shutting down",
    "database is locked",
    "database table is locked",
    "ssl syscall error",
    "consuming input failed",
)


class WorkerShutdown(Exception):
    """The worker is shutting down (SIGTERM): the job is handed back, not ended."""


def is_transient(err: BaseException) -> bool:
    """True for database errors that go away by themselves (outage, restart, lock)."""
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return True
    if isinstance(err, sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return True
    orig = err.orig if isinstance(err, sa_exc.DBAPIError) else err
    if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
        return True
    if isinstance(orig, ConnectionError):
        return True
    if isinstance(orig, sqlite3.OperationalError) or isinstance(err, sa_exc.OperationalError):
        text = str(err).lower()
        return any(m in text for m in TRANSIENT_MESSAGES)
    return False


class _stop_on_event(stop_base):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.event.is_set()


class StoreRetry:
    """Runs store transactions, retrying the whole transaction on transient errors.

    `patient` calls wait as long as `max_outage_s` (default: for ever) or until `shutdown`
    is set; `once` calls try a single time (callers that buffer and try again later)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        counters: RunnerCounters | None = None,
        shutdown: threading.Event | None = None,
        max_wait_s: float = 5.0,
        max_outage_s: float | None = None,
    ) -> None:
        self.sessions = sessions
        self.counters = counters or RunnerCounters()
        self.shutdown = shutdown or threading.Event()
        self.max_wait_s = max_wait_s
        self.max_outage_s = max_outage_s

    def _retrying(self, what: str) -> Retrying:
        stop: Any = _stop_on_event(self.shutdown)
        if self.max_outage_s is not None:
            stop = stop | stop_after_delay(self.max_outage_s)

        def before_sleep(state: RetryCallState) -> None:
            self.counters.add("db_retries")
            err = state.outcome.exception() if state.outcome else None
            logger.warning(
                "store %s failed (attempt %d), retrying: %s",
                what,
                state.attempt_number,
                str(err).splitlines()[0] if err else "",
            )

        return Retrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential_jitter(multiplier=0.1, max=self.max_wait_s, jitter=0.2),
            stop=stop,
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )

    def _sleep(self, seconds: float) -> None:
        """Wait out a backoff, cut short by `shutdown`."""
        self.shutdown.wait(seconds)

    def patient(self, what: str, fn: Callable[[Session], T], *, write: bool = True) -> T:
        """`fn(session)` in a committed transaction, retried until the database answers;
        `WorkerShutdown` when the worker shuts down while waiting."""
        try:
            for attempt in self._retrying(what):
                with attempt:
                    with session_scope(self.sessions, write=write) as s:
                        return fn(s)
        except Exception as err:
            if self.shutdown.is_set() and is_transient(err):
                raise WorkerShutdown(f"shut down waiting for the store ({what})") from err
            raise
        raise AssertionError("unreachable: tenacity reraises")

    def once(self, what: str, fn: Callable[[Session], T], *, write: bool = True) -> T:
        """`fn(session)` in a committed transaction, tried once; a transient error counts
        as a retry and is raised for the caller to try again later."""
        try:
            with session_scope(self.sessions, write=write) as s:
                return fn(s)
        except Exception as err:
            if is_transient(err):
                self.counters.add("db_retries")
            raise

    def best_effort(self, what: str, fn: Callable[[Session], object]) -> None:
        """`fn(session)` tried once; during an outage it is skipped (a later call says it
        again), any other error is raised."""
        try:
            self.once(what, fn)
        except Exception as err:
            if not is_transient(err):
                raise
