"""The measuring phase of a job: stages go to the actors as they free up, results are stored
as they come (or kept until the database is back), stages another runner measures are
waited for, and stages that cannot be in a better plan are skipped."""

import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Protocol

from sqlalchemy.orm import Session

import store
from schemas import StageKey, StageProfileResult, SubmeshShape
from workers.cluster import CandidateTask, GroupPool, GroupShape
from workers.jobs.heartbeat import LeaseKeeper
from workers.jobs.job_stats import JobStats, ProgressCallback
from workers.jobs.retry import StoreRetry, is_transient
from workers.jobs.stage_ledger import OURS, WAIT, StageLedger

logger = logging.getLogger(__name__)

Feed = Callable[[str, StageProfileResult], None]
Key = tuple[int, int, int, int]


class ResultSink(Protocol):
    """What the phase feeds results to and asks before measuring: a `planner.StagePruner`,
    or the estimate search (which prunes nothing itself); `fingerprint` is the stage's (the
    search of a job that searches counts routes it to its count's search)."""

    def add(self, fingerprint: str, keys: Iterable[Key], result: StageProfileResult) -> None: ...

    def prunable(self, fingerprint: str, keys: Iterable[Key]) -> bool: ...


class MeasuringPhase:
    """The measuring phase of one job. It owns the job's pool of measuring groups, started
    at the first stage that needs measuring (or by `ensure_pool`) and ended by `stop`."""

    def __init__(
        self,
        store: StoreRetry,
        *,
        job_id: str,
        owner: str,
        start_pool: Callable[[], GroupPool],
        poll_seconds: float,
        on_progress: ProgressCallback | None,
        stats: JobStats | None = None,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.owner = owner
        self.start_pool = start_pool
        self.poll_seconds = poll_seconds
        self.on_progress = on_progress
        self.pool: GroupPool | None = None
        self.stats = stats if stats is not None else JobStats()

    def on_device_wait(self, shape: GroupShape, waited: float | None) -> None:
        """The pool waits for devices another job holds (`waited` None), or got them after
        `waited` seconds: said in the job's progress."""
        stats = self.stats
        if waited is None:
            stats.waiting_for_devices = f"waiting for devices held by another job ({shape})"
            logger.warning("job %s: %s", self.job_id, stats.waiting_for_devices)
        else:
            stats.device_wait_seconds += waited
            if stats.waiting_for_devices is None:
                return
            stats.waiting_for_devices = None
            logger.info("job %s: got the devices for %s after %.1f s", self.job_id, shape, waited)
        self._store_waiting(stats.waiting_for_devices)
        if self.on_progress is not None:
            self.on_progress(self._job_row(), stats)

    def _store_waiting(self, waiting: str | None) -> None:
        """Best effort: the job row says what it waits for (an outage only delays it)."""
        job_id, owner = self.job_id, self.owner

        def put(s: Session) -> bool:
            return store.set_job_waiting(s, job_id=job_id, owner=owner, waiting=waiting)

        self.store.best_effort("waiting", put)

    def ensure_pool(self) -> GroupPool:
        """The phase's pool, started now if it is not yet."""
        if self.pool is None:
            self.pool = self.start_pool()
        return self.pool

    def stop(self, stats: JobStats) -> None:
        """Stop the pool's actors (if any started) and count them in `stats`."""
        if self.pool is not None:
            stats.actors_started = self.pool.actors_started
            stats.actors_replaced = self.pool.actors_replaced
            self.pool.shutdown()
            self.pool = None

    def run(
        self,
        fingerprints: list[str],
        keys_by_fp: dict[str, list[StageKey]],
        submeshes: Sequence[SubmeshShape],
        pruner: ResultSink | None,
        stats: JobStats,
        keeper: LeaseKeeper,
        ledger: StageLedger,
        keep_idle: bool = False,
        model_of: Mapping[str, str] | None = None,
        unsplit: Collection[str] = (),
        postpone: Callable[[str], bool] | None = None,
    ) -> None:
        """Submit stages as measuring groups free up (one group shape at a time: the pool
        accepts a stage when a group of its shape is free), skipping what cannot matter,
        and what another runner is measuring (its result is waited for).

        Actors start at the first stage that needs measuring: a warm re-plan starts none.
        During an outage measuring goes on with the stages already claimed; their results
        wait in `ledger` and are stored when the database is back. `keep_idle`: the caller
        has more stages to come soon (the estimate search's next round): groups with nothing
        to do are kept once the queue is empty instead of given back. `model_of`: the model
        key of each stage's spec in the pool (`GroupPool.add_model`), when not the pool's own.
        `unsplit`: stages measured without the split backward (`CandidateTask.unsplit`).
        `postpone`: asked of each stage as it comes up; True drops it from the queue,
        neither measured nor stored (the caller keeps it: `workers.jobs.count_loop`)."""

        def feed(fp: str, result: StageProfileResult) -> None:
            if pruner is not None:
                pruner.add(fp, (k.as_tuple() for k in keys_by_fp[fp]), result)

        queue = deque(fingerprints)
        while queue or ledger.waiting or ledger.unsaved or (self.pool and self.pool.busy):
            keeper.check()
            skipped: list[str] = []
            while queue and (
                self.pool is None
                or self.pool.accepts(submeshes[keys_by_fp[queue[0]][0].submesh_id])
            ):
                fp = queue[0]
                if postpone is not None and postpone(fp):
                    queue.popleft()
                    continue
                if pruner is not None and pruner.prunable(
                    fp, (k.as_tuple() for k in keys_by_fp[fp])
                ):
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
                key = keys_by_fp[fp][0]
                pool = self.ensure_pool()
                wanted = _same_shape(pool, queue, keys_by_fp, submeshes, key)
                model_key = "" if model_of is None else model_of.get(fp, "")
                task = CandidateTask(fp, key, submeshes[key.submesh_id], model_key, fp in unsplit)
                pool.submit(task, wanted)
            if self.pool is not None and (
                (not queue and not keep_idle)
                or (queue and not self.pool.accepts(submeshes[keys_by_fp[queue[0]][0].submesh_id]))
            ):
                self.pool.release_idle()  # nothing of their shape comes next: give them back
            if skipped:
                self._store_pruned(skipped, stats)
            settled, freed = ledger.settle_waiting()
            for item in settled:
                feed(item.fingerprint, item.result)
            queue.extendleft(reversed(freed))
            if self.pool is None or not self.pool.busy:
                if ledger.unsaved:
                    self._flush(ledger, stats, feed)
                if queue or ledger.waiting or ledger.unsaved:
                    keeper.sleep(self.poll_seconds)
                continue
            for result in self.pool.poll(self.poll_seconds):
                self._store_result(result, stats, ledger, feed)
            if ledger.unsaved:
                self._flush(ledger, stats, feed)

    def _store_result(
        self, result: StageProfileResult, stats: JobStats, ledger: StageLedger, feed: Feed
    ) -> None:
        """A measured result: stored now, or kept until the database is back."""
        ledger.keep(result)
        self._flush(ledger, stats, feed)

    def _flush(self, ledger: StageLedger, stats: JobStats, feed: Feed) -> None:
        began = time.perf_counter()
        stored = ledger.flush()
        stats.store_seconds += time.perf_counter() - began
        for result in stored:
            feed(result.fingerprint, result)
        if stored and self.on_progress is not None:
            self.on_progress(self._job_row(), stats)

    def _job_row(self) -> store.JobRow | None:
        job_id = self.job_id
        try:
            return self.store.once(
                "progress", lambda s: store.get_job(s, job_id=job_id), write=False
            )
        except Exception as err:
            if is_transient(err):
                return None
            raise

    def skip(self, fingerprints: list[str], stats: JobStats) -> None:
        """Stages not worth measuring (e.g. remat variants where memory is ample): stored
        as pruned."""
        self._store_pruned(fingerprints, stats)

    def _store_pruned(self, fingerprints: list[str], stats: JobStats) -> None:
        job_id = self.job_id

        def prune(s: Session) -> store.JobRow | None:
            store.mark_pruned(s, job_id=job_id, fingerprints=fingerprints)
            store.refresh_progress(s, job_id=job_id)
            return store.get_job(s, job_id=job_id)

        began = time.perf_counter()
        job = self.store.patient("pruned stages", prune)
        stats.store_seconds += time.perf_counter() - began
        if self.on_progress is not None:
            self.on_progress(job, stats)


def _same_shape(
    pool: GroupPool,
    queue: deque[str],
    keys_by_fp: dict[str, list[StageKey]],
    submeshes: Sequence[SubmeshShape],
    key: StageKey,
) -> int:
    """Groups of `key`'s shape the phase can use now: that stage and those of its shape
    next in `queue` (stages are queued shape by shape), at most as many as fit."""
    shape = pool.layout.shape_for(submeshes[key.submesh_id])
    fit = pool.layout.groups_that_fit(shape)
    n = 1
    for fp in queue:
        if n >= fit or pool.layout.shape_for(submeshes[keys_by_fp[fp][0].submesh_id]) != shape:
            break
        n += 1
    return n
