"""A job's stages between "to measure" and "stored": claims across jobs, stages another
runner is measuring (waited for, not measured again), and results kept in memory until the
database takes them (an outage never loses a measurement)."""

import functools
import logging
from collections import deque
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

import store
from schemas import StageProfileResult
from store.claims import claim_stage, live_claims, release_claims
from store.profiles import TRANSIENT_STATUSES
from workers.jobs.retry import StoreRetry, is_transient

logger = logging.getLogger(__name__)

OURS, WAIT, STORED = "ours", "wait", "stored"


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
        self._ready: list[Settled] = []  # stored by others, recorded, not yet returned
        # The job's device memory, once its cluster is read: a stored `oom` found on
        # smaller devices does not answer it (`store.answers`).
        self.device_memory: int | None = None
        # a stage measured without the split backward -> the job's candidate fingerprint
        # (with the split) its result is recorded under as well (`JobContext.measure`)
        self.aliases: dict[str, str] = {}

    # --- claims -----------------------------------------------------------------------

    def claim(self, fingerprint: str) -> str | None:
        """`OURS`: ours to measure. `WAIT`: another runner has it (we wait for its result).
        `STORED`: its result was stored meanwhile (recorded; `settle_waiting` returns it).
        None: the store is unreachable now; try again later."""
        ready = len(self._ready)
        try:
            outcome = self.retry.once("stage claim", lambda s: self._claim(s, fingerprint, None))
        except Exception as err:
            del self._ready[ready:]  # rolled back: nothing was recorded
            if is_transient(err):
                return None
            raise
        if outcome == WAIT:
            self.waiting[fingerprint] = store.utcnow()
            self.retry.counters.add("stage_claims_waited")
        return outcome

    def _claim(self, s: Session, fingerprint: str, since: datetime | None) -> str:
        """Claim, then look for a result: the claim waits for a claimant's commit (its
        result and its claim's release are one transaction), so the look that follows sees
        that result; looking first could miss it and measure the stage twice."""
        if not claim_stage(
            s,
            fingerprint=fingerprint,
            owner=self.owner,
            job_id=self.job_id,
            lease_seconds=self.lease_seconds,
        ):
            return WAIT
        row = store.get_profile(s, fingerprint=fingerprint)
        if row is None:
            return OURS
        if row.status in TRANSIENT_STATUSES:
            # measured again, unless its claimant stored it while we waited: its answer then
            if since is None or row.created_at < since:
                return OURS
        elif not store.answers(row, self.device_memory):
            return OURS
        self._record(s, row, reused=True)
        release_claims(s, owner=self.owner, fingerprints=[fingerprint])
        store.refresh_progress(s, job_id=self.job_id)
        self._ready.append(Settled(fingerprint, store.profile_result(row)))
        return STORED

    def settle_waiting(self) -> tuple[list[Settled], list[str]]:
        """The stages stored by others since the last call are recorded for this job; those
        we waited for whose claim is gone without a result are claimed for us. Returns
        (stored ones, ones now ours to measure); nothing new when the store is unreachable."""
        ours: list[str] = []
        if self.waiting:
            try:
                ours = self.retry.once("waited stages", self._settle)
            except Exception as err:
                if not is_transient(err):
                    raise
        ready, self._ready = self._ready, []
        return ready, ours

    def _settle(self, s: Session) -> list[str]:
        wanted = list(self.waiting)
        claimed = live_claims(s, fingerprints=wanted, exclude_owner=self.owner)
        ours: list[str] = []
        ready = len(self._ready)
        try:
            for fp in wanted:
                if fp in claimed:
                    continue
                outcome = self._claim(s, fp, self.waiting[fp])
                if outcome == OURS:
                    ours.append(fp)
        except BaseException:
            del self._ready[ready:]  # the transaction is rolled back: nothing was recorded
            raise
        for fp in ours + [x.fingerprint for x in self._ready[ready:]]:
            self.waiting.pop(fp, None)
        return ours

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
                    self.retry.patient("result", functools.partial(self._save, result=result))
                else:
                    self.retry.once("result", functools.partial(self._save, result=result))
            except Exception as err:
                if is_transient(err) and not patient:
                    break
                raise
            self.unsaved.popleft()
            stored.append(result)
        return stored

    def _save(self, s: Session, result: StageProfileResult) -> None:
        row = store.save_profile(s, result=result)
        self._record(s, row, reused=False)
        release_claims(s, owner=self.owner, fingerprints=[result.fingerprint])
        store.refresh_progress(s, job_id=self.job_id)

    def _record(self, s: Session, row: store.StageProfileRow, *, reused: bool) -> None:
        """Record `row` for the job's candidates of its fingerprint (and of its alias)."""
        store.record_result(s, job_id=self.job_id, profile=row, reused=reused)
        alias = self.aliases.get(row.fingerprint)
        if alias is not None:
            store.record_result(
                s, job_id=self.job_id, profile=row, reused=reused, fingerprint=alias
            )

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
