"""A job's stages between "to measure" and "stored": claims across jobs, stages another
runner is measuring (waited for, not measured again), and results kept in memory until the
database takes them (an outage never loses a measurement)."""

import logging
from collections import deque
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

import store
from schemas import StageProfileResult
from store.claims import claim_stage, live_claims, release_claims
from store.profiles import TRANSIENT_STATUSES
from workers.retry import StoreRetry, is_transient

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """A waited-for stage whose result another runner stored."""

    fingerprint: str
    result: StageProfileResult


class StageLedger:
    """Claims, waits and unsaved results of one job on one runner."""

    def __init__(self, retry: StoreRetry, *, job_id: str, owner: str, lease_seconds: float) -> None:
        self.retry = retry
        self.job_id = job_id
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.waiting: dict[str, datetime] = {}  # fingerprint -> when we started waiting
        self.unsaved: deque[StageProfileResult] = deque()

    # --- claims -----------------------------------------------------------------------

    def claim(self, fingerprint: str) -> bool | None:
        """True: ours to measure. False: another runner has it (we wait for its result).
        None: the store is unreachable now; try again later."""
        try:
            ours = self.retry.once(
                "stage claim",
                lambda s: claim_stage(
                    s,
                    fingerprint=fingerprint,
                    owner=self.owner,
                    job_id=self.job_id,
                    lease_seconds=self.lease_seconds,
                ),
            )
        except Exception as err:
            if is_transient(err):
                return None
            raise
        if not ours:
            self.waiting[fingerprint] = store.utcnow()
            self.retry.counters.add("stage_claims_waited")
        return ours

    def settle_waiting(self) -> tuple[list[Settled], list[str]]:
        """Look at the stages we wait for: those stored by their claimant are recorded for
        this job; those whose claim is gone without a result are claimed for us. Returns
        (stored ones, ones now ours to measure); nothing when the store is unreachable."""
        if not self.waiting:
            return [], []
        try:
            return self.retry.once("waited stages", self._settle)
        except Exception as err:
            if is_transient(err):
                return [], []
            raise

    def _settle(self, s: Session) -> tuple[list[Settled], list[str]]:
        wanted = list(self.waiting)
        claimed = live_claims(s, fingerprints=wanted, exclude_owner=self.owner)
        free = [fp for fp in wanted if fp not in claimed]
        settled: list[Settled] = []
        ours: list[str] = []
        for fp in free:
            row = store.get_profile(s, fingerprint=fp)
            # A transient failure stored before we waited is not the claimant's answer.
            stale = row is not None and (
                row.status in TRANSIENT_STATUSES and row.created_at < self.waiting[fp]
            )
            if row is not None and not stale:
                store.record_result(s, job_id=self.job_id, profile=row, reused=True)
                settled.append(Settled(fp, store.profile_result(row)))
            elif claim_stage(
                s,
                fingerprint=fp,
                owner=self.owner,
                job_id=self.job_id,
                lease_seconds=self.lease_seconds,
            ):
                ours.append(fp)
        if settled:
            store.refresh_progress(s, job_id=self.job_id)
        for fp in [x.fingerprint for x in settled] + ours:
            self.waiting.pop(fp, None)
        return settled, ours

    # --- results ----------------------------------------------------------------------

    def keep(self, result: StageProfileResult) -> None:
        """A measured result, to be stored by the next `flush`."""
        self.unsaved.append(result)

    def flush(self, *, patient: bool = False) -> list[StageProfileResult]:
        """Store the unsaved results, oldest first, each with its claim released, in one
        transaction each; stops at the first outage unless `patient`. The ones stored."""
        stored: list[StageProfileResult] = []
        while self.unsaved:
            result = self.unsaved[0]
            try:
                if patient:
                    self.retry.patient("result", lambda s, r=result: self._save(s, r))
                else:
                    self.retry.once("result", lambda s, r=result: self._save(s, r))
            except Exception as err:
                if is_transient(err) and not patient:
                    break
                raise
            self.unsaved.popleft()
            stored.append(result)
        return stored

    def _save(self, s: Session, result: StageProfileResult) -> None:
        row = store.save_profile(s, result=result)
        store.record_result(s, job_id=self.job_id, profile=row, reused=False)
        release_claims(s, owner=self.owner, fingerprints=[result.fingerprint])
        store.refresh_progress(s, job_id=self.job_id)

    def abandon(self) -> None:
        """The job stops here: keep what was measured (profiles are shared by fingerprint)
        and give the claims back, if the store answers now; claims expire otherwise."""
        try:

            def save_all(s: Session) -> None:
                for result in self.unsaved:
                    store.save_profile(s, result=result)
                release_claims(s, owner=self.owner)

            self.retry.once("abandon", save_all)
            self.unsaved.clear()
        except Exception as err:
            logger.warning("job %s: could not store its last results: %s", self.job_id, err)
