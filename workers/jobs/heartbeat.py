"""A job's lease kept alive by a background thread from claim to end, and the checks that
let every phase of a job stop within a second or two of a cancel, a lost lease or SIGTERM."""

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from store import is_cancel_requested, renew_lease
from store.claims import renew_claims
from store.counters import add_counts
from workers.jobs.retry import StoreRetry, WorkerShutdown, is_transient

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How often a phase looks at its stop signals, seconds.
CHECK_INTERVAL_S = 0.1


class JobCancelled(Exception):
    """The job was cancelled, or its lease was lost to another runner."""


class LeaseKeeper:
    """Renews a job's lease (and its runner's stage claims) every `heartbeat_seconds` and
    looks for a cancel every `cancel_check_seconds`, in a thread, until closed.

    Database errors never stop it: it tries again on the next tick. It flags `lost` only
    when the store answers that the lease is gone (cancelled, taken over, ended)."""

    def __init__(
        self,
        store: StoreRetry,
        *,
        job_id: str,
        owner: str,
        lease_seconds: float,
        heartbeat_seconds: float,
        cancel_check_seconds: float = 1.0,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.cancel_check_seconds = min(cancel_check_seconds, heartbeat_seconds)
        self.lost = threading.Event()
        self.reason = ""
        self.renewals = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{job_id}", daemon=True)
        self._outage_logged = False

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._thread.join(timeout=10.0)

    @property
    def shutdown(self) -> threading.Event:
        return self.store.shutdown

    # --- the thread -----------------------------------------------------------------

    def _loop(self) -> None:
        next_renewal = time.monotonic() + self.heartbeat_seconds
        while not self._closed.wait(self.cancel_check_seconds):
            renew = time.monotonic() >= next_renewal
            try:
                alive, cancelled = self._beat(renew)
            except Exception as err:
                if not is_transient(err):
                    logger.exception("job %s: heartbeat failed", self.job_id)
                elif not self._outage_logged:
                    logger.warning("job %s: heartbeat cannot reach the store: %s", self.job_id, err)
                    self._outage_logged = True
                continue
            self._outage_logged = False
            if renew:
                next_renewal = time.monotonic() + self.heartbeat_seconds
                self.renewals += 1
            if cancelled or not alive:
                self.reason = "cancelled by request" if cancelled else "lost the job's lease"
                self.store.counters.add("leases_lost")
                self.lost.set()
                return

    def _beat(self, renew: bool) -> tuple[bool, bool]:
        pending = self.store.counters.take() if renew else {}

        def beat(s: Session) -> tuple[bool, bool]:
            alive = True
            if renew:
                alive = renew_lease(
                    s, job_id=self.job_id, owner=self.owner, lease_seconds=self.lease_seconds
                )
                renew_claims(s, owner=self.owner, lease_seconds=self.lease_seconds)
                add_counts(s, counts=pending)
            return alive, is_cancel_requested(s, job_id=self.job_id)

        try:
            return self.store.once("heartbeat", beat, write=renew)
        except BaseException:
            self.store.counters.restore(pending)
            raise

    # --- what the job's phases call -------------------------------------------------

    def check(self) -> None:
        """Raise `WorkerShutdown` or `JobCancelled` when the job must stop now."""
        if self.shutdown.is_set():
            raise WorkerShutdown("the worker is shutting down")
        if self.lost.is_set():
            raise JobCancelled(self.reason)

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, checking the stop signals all along."""
        deadline = time.monotonic() + seconds
        while True:
            self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.lost.wait(min(left, CHECK_INTERVAL_S))

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a helper thread, abandoned (it finishes on its own, its result
        dropped) when the job must stop: for pure work that has no stop checks of its own
        (candidate enumeration, the DP, tracing a zoo model)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as err:
                box["error"] = err
            finally:
                done.set()

        thread = threading.Thread(target=work, name=f"{what}-{self.job_id}", daemon=True)
        thread.start()
        while not done.wait(CHECK_INTERVAL_S):
            try:
                self.check()
            except (JobCancelled, WorkerShutdown):
                logger.info("job %s: %s abandoned", self.job_id, what)
                raise
        if "error" in box:
            raise box["error"]
        return box["value"]
