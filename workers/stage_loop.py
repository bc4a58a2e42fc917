"""The measuring phase of a job: stages go to the actors as they free up, results are stored
as they come (or kept until the database is back), stages another runner measures are
waited for, and stages that cannot be in a better plan are skipped."""

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

import planner
import store
from schemas import StageKey, StageProfileResult, SubmeshShape
from workers.heartbeat import LeaseKeeper
from workers.pool import MeasurePool, MeasureTask
from workers.retry import StoreRetry, is_transient
from workers.stage_ledger import OURS, WAIT, StageLedger

if TYPE_CHECKING:
    from workers.job_stats import JobStats, ProgressCallback
    from workers.runner import RunnerConfig

logger = logging.getLogger(__name__)

Feed = Callable[[str, StageProfileResult], None]


class MeasureLoop:
    """The measuring phase of `JobRunner` (its pool, config, store and progress callback)."""

    pool: MeasurePool | None
    config: "RunnerConfig"
    store: StoreRetry
    on_progress: "ProgressCallback | None"

    def _measure(
        self,
        job_id: str,
        fingerprints: list[str],
        keys_by_fp: dict[str, list[StageKey]],
        submeshes: Sequence[SubmeshShape],
        pruner: planner.StagePruner | None,
        stats: "JobStats",
        start_pool: Callable[[], MeasurePool],
        keeper: LeaseKeeper,
        ledger: StageLedger,
    ) -> None:
        """Submit stages as measuring groups free up (one group shape at a time: the pool
        accepts a stage when a group of its shape is free), skipping what cannot matter,
        and what another runner is measuring (its result is waited for).

        Actors start at the first stage that needs measuring: a warm re-plan starts none.
        During an outage measuring goes on with the stages already claimed; their results
        wait in `ledger` and are stored when the database is back."""

        def feed(fp: str, result: StageProfileResult) -> None:
            if pruner is not None:
                pruner.add((k.as_tuple() for k in keys_by_fp[fp]), result)

        queue = deque(fingerprints)
        while queue or ledger.waiting or ledger.unsaved or (self.pool and self.pool.busy):
            keeper.check()
            skipped: list[str] = []
            while queue and (
                self.pool is None
                or self.pool.accepts(submeshes[keys_by_fp[queue[0]][0].submesh_id])
            ):
                fp = queue[0]
                if pruner is not None and pruner.prunable(k.as_tuple() for k in keys_by_fp[fp]):
                    skipped.append(queue.popleft())
                    continue
                claim = ledger.claim(fp)
                if claim is None:  # the store is unreachable: measure nothing new for now
                    break
                queue.popleft()
                if claim == WAIT:
                    stats.waited += 1
                if claim != OURS:
                    continue
                if self.pool is None:
                    self.pool = start_pool()
                key = keys_by_fp[fp][0]
                self.pool.submit(MeasureTask(fp, key, submeshes[key.submesh_id]))
            if skipped:
                self._store_pruned(job_id, skipped, stats)
            settled, freed = ledger.settle_waiting()
            for item in settled:
                feed(item.fingerprint, item.result)
            queue.extendleft(reversed(freed))
            if self.pool is None or not self.pool.busy:
                if ledger.unsaved:
                    self._flush(job_id, ledger, stats, feed)
                if queue or ledger.waiting or ledger.unsaved:
                    keeper.sleep(self.config.poll_seconds)
                continue
            for result in self.pool.poll(self.config.poll_seconds):
                self._store_result(job_id, result, stats, ledger, feed)
            if ledger.unsaved:
                self._flush(job_id, ledger, stats, feed)

    def _store_result(
        self,
        job_id: str,
        result: StageProfileResult,
        stats: "JobStats",
        ledger: StageLedger,
        feed: Feed,
    ) -> None:
        """A measured result: stored now, or kept until the database is back."""
        ledger.keep(result)
        self._flush(job_id, ledger, stats, feed)

    def _flush(
        self,
        job_id: str,
        ledger: StageLedger,
        stats: "JobStats",
        feed: Feed,
    ) -> None:
        stored = ledger.flush()
        for result in stored:
            feed(result.fingerprint, result)
        if stored and self.on_progress is not None:
            self.on_progress(self._job_row(job_id), stats)

    def _job_row(self, job_id: str) -> store.JobRow | None:
        try:
            return self.store.once(
                "progress", lambda s: store.get_job(s, job_id=job_id), write=False
            )
        except Exception as err:
            if is_transient(err):
                return None
            raise

    def _store_pruned(self, job_id: str, fingerprints: list[str], stats: "JobStats") -> None:
        def prune(s: Session) -> store.JobRow | None:
            store.mark_pruned(s, job_id=job_id, fingerprints=fingerprints)
            store.refresh_progress(s, job_id=job_id)
            return store.get_job(s, job_id=job_id)

        job = self.store.patient("pruned stages", prune)
        if self.on_progress is not None:
            self.on_progress(job, stats)
