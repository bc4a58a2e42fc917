"""The job runner: claim a job, build its context (`JobContext`: inputs, candidates and
their fingerprints, the measuring phase), then its phases (`workers.jobs.job_phases`): reuse
what is stored, measure what the search asks for on Ray, storing each result the moment it
exists, and plan; the plan is stored with the job's end.

From claim to end a `LeaseKeeper` thread renews the job's lease; every phase checks it, so a
cancel, a lost lease or SIGTERM stops the job within seconds. Store accesses wait out
database outages (`workers.jobs.retry`); stages are claimed across jobs
(`workers.jobs.stage_ledger`).
"""

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

import planner
import store
from schemas import JobStatus, Plan
from store.claims import release_claims
from store.counters import add_counts
from store.jobs import cancelled_expired_ids, reap_cancelled_expired, release_lease
from workers.cluster import (
    KILL_GRACE_S,
    CandidateRetry,
    GroupPool,
    Layout,
    PoolConfig,
    make_layout,
    virtual_devices_only,
)
from workers.jobs.count_loop import search_counts
from workers.jobs.failures import FailureFactory
from workers.jobs.heartbeat import JobCancelled, LeaseKeeper, WorkerShutdown
from workers.jobs.job_context import JobContext, fingerprint_candidates
from workers.jobs.job_inputs import JobFailed, JobInputs, ZooBuilder, ZooBuilders, load_checked
from workers.jobs.job_phases import plan_job, reuse_stored, search_stages
from workers.jobs.job_stats import JobOutcome, JobStats, ProgressCallback
from workers.jobs.phase import MeasuringPhase
from workers.jobs.retry import StoreRetry, is_transient
from workers.jobs.runner_metrics import RunnerCounters
from workers.jobs.stage_ledger import StageLedger

logger = logging.getLogger(__name__)

# The default bound on a wait for devices another runner holds: longer than a shape of a
# typical job takes on them (the holder gives its groups back between shapes).
DEVICE_WAIT_S = 600.0


@dataclass(frozen=True)
class RunnerConfig:
    """How a runner holds leases and sizes its actor pool."""

    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 3.0
    # How often the heartbeat thread looks for a cancel (a read), seconds.
    cancel_check_seconds: float = 1.0
    # How long the measuring loop waits for a result before it looks at its stop signals.
    poll_seconds: float = 0.5
    # Most measuring groups at once (default: as many as the Ray cluster's devices fit).
    num_workers: int | None = None
    # Every measuring process owns this many devices and measures every shape: the pool of
    # one shape, without packing or hosts (a baseline). Default: sized per shape.
    devices_per_worker: int | None = None
    use_gpus: bool = False
    kill_grace_s: float = KILL_GRACE_S
    # False measures every candidate on its own, as Alpa does (a baseline for benchmarks):
    # a candidate's fingerprint then also names its (start, end, submesh, config).
    reuse_stages: bool = True
    retry: CandidateRetry = field(default_factory=CandidateRetry)
    # Most seconds a job waits for devices another runner's job holds (said in its progress
    # after a few seconds); past it the stages of that group shape fail (runtime_error).
    device_wait_s: float = DEVICE_WAIT_S


class JobRunner:
    """Runs jobs from the store on a Ray pool. One job at a time per runner."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: RunnerConfig | None = None,
        *,
        build_zoo: ZooBuilder | None = None,
        on_progress: ProgressCallback | None = None,
        shutdown: threading.Event | None = None,
        build_zoo_symbolic: ZooBuilder | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = config or RunnerConfig()
        # zoo models as traced, and with a symbolic batch dimension (microbatch_search)
        self.zoo = ZooBuilders(build_zoo, build_zoo_symbolic)
        self.on_progress = on_progress
        self.phase: MeasuringPhase | None = None  # the current job's measuring phase
        self.counters = RunnerCounters()
        self.store = StoreRetry(sessions, counters=self.counters, shutdown=shutdown)
        self._worker_info: dict[str, Any] | None = None

    @property
    def pool(self) -> GroupPool | None:
        """The current job's pool of measuring groups, once started."""
        return None if self.phase is None else self.phase.pool

    @property
    def shutdown(self) -> threading.Event:
        """Set it (SIGTERM) to stop: the current job is handed back within seconds."""
        return self.store.shutdown

    def run_forever(self, stop: threading.Event, idle_sleep_s: float = 2.0) -> None:
        """Claim and run jobs until `stop` is set. Nothing leaves this loop but `stop`: a
        database outage is waited out, a bug is logged and the next job claimed."""
        self.store.shutdown = stop
        while not stop.is_set():
            try:
                outcome = self.run_next()
            except Exception:
                if not stop.is_set():
                    logger.exception("runner %s: job loop error", self.config.owner)
                outcome = None
            if outcome is None:
                self.reap_idle()
                stop.wait(idle_sleep_s)

    def reap_idle(self) -> list[str]:
        """What a runner does when idle: end cancelled jobs whose runner is gone and store
        its counters. Quiet during an outage (the next poll tries again)."""
        pending = self.counters.take()

        def reap(s: Session) -> list[str]:
            add_counts(s, counts=pending)
            if not cancelled_expired_ids(s):
                return []
            return reap_cancelled_expired(s)

        try:
            reaped = self.store.once("reap", reap)
        except Exception as err:
            self.counters.restore(pending)
            if not is_transient(err):
                logger.exception("runner %s: reaping failed", self.config.owner)
            return []
        for job_id in reaped:
            logger.info("job %s cancelled: its runner was gone", job_id)
        return reaped

    def run_next(self, job_id: str | None = None) -> JobOutcome | None:
        """Claim one job (queued, or with an expired lease) and run it to its end."""

        def claim(s: Session) -> tuple[str, int] | None:
            row = store.claim_job(
                s, owner=self.config.owner, lease_seconds=self.config.lease_seconds, job_id=job_id
            )
            return None if row is None else (row.id, row.attempts)

        claimed = self.store.patient("claim", claim)
        if claimed is None:
            return None
        claimed_id, attempts = claimed
        if attempts > 1:
            self.counters.add("job_takeovers")
        logger.info(
            "runner %s claimed job %s (attempt %d)", self.config.owner, claimed_id, attempts
        )
        return self._run(claimed_id)

    def _run(self, job_id: str) -> JobOutcome:
        started = time.monotonic()
        stats = JobStats()
        keeper = LeaseKeeper(
            self.store,
            job_id=job_id,
            owner=self.config.owner,
            lease_seconds=self.config.lease_seconds,
            heartbeat_seconds=self.config.heartbeat_seconds,
            cancel_check_seconds=self.config.cancel_check_seconds,
        )
        ledger = StageLedger(
            self.store,
            job_id=job_id,
            owner=self.config.owner,
            lease_seconds=self.config.lease_seconds,
        )
        status, plan, error = JobStatus.done, None, None
        try:
            with keeper:
                plan = self._profile_and_plan(job_id, stats, keeper, ledger)
        except WorkerShutdown:
            self._stop_pool(stats)
            ledger.abandon()
            return self._hand_back(job_id, stats, started)
        except JobCancelled as why:
            status, error = JobStatus.cancelled, str(why)
        except (planner.NoFeasiblePlan, JobFailed) as why:
            status, error = JobStatus.failed, str(why)
        except Exception as err:  # a bug or an infrastructure fault: end the job, say what
            logger.exception("job %s: unexpected error", job_id)
            status, error = JobStatus.failed, f"internal error: {type(err).__name__}: {err}"
        finally:
            self._stop_pool(stats)
        if status != JobStatus.done:
            ledger.abandon()
        stats.wall_seconds = time.monotonic() - started
        return self._end(job_id, status, plan, error, stats)

    def _stop_pool(self, stats: JobStats) -> None:
        if self.phase is not None:
            self.phase.stop(stats)
            self.phase = None

    def _hand_back(self, job_id: str, stats: JobStats, started: float) -> JobOutcome:
        """SIGTERM: the job's lease ends now (another runner takes it over at once), unless
        cancel was requested: then it ends as cancelled."""
        stats.wall_seconds = time.monotonic() - started

        def hand_back(s: Session) -> JobStatus:
            stats.progress = store.refresh_progress(s, job_id=job_id)
            if store.is_cancel_requested(s, job_id=job_id):
                store.finish_job(
                    s,
                    job_id=job_id,
                    owner=self.config.owner,
                    status=JobStatus.cancelled,
                    error="cancelled by request",
                )
                return JobStatus.cancelled
            release_lease(s, job_id=job_id, owner=self.config.owner)
            release_claims(s, owner=self.config.owner)
            row = store.get_job(s, job_id=job_id)
            return JobStatus(row.status) if row else JobStatus.failed

        try:
            status = self.store.once("hand back", hand_back)
        except Exception as err:
            logger.warning(
                "job %s: could not hand it back (its lease will expire): %s", job_id, err
            )
            status = JobStatus.profiling
        logger.info("job %s handed back (%s): the worker is shutting down", job_id, status.value)
        return JobOutcome(job_id, status, None, "the worker shut down", stats)

    def _end(
        self, job_id: str, status: JobStatus, plan: Plan | None, error: str | None, st: JobStats
    ) -> JobOutcome:
        pending = self.counters.take()  # stored with the job's end, not left for later

        def end(s: Session) -> JobStatus | None:
            add_counts(s, counts=pending)
            st.progress = store.refresh_progress(s, job_id=job_id)
            if status == JobStatus.cancelled and not store.is_cancel_requested(s, job_id=job_id):
                # Lease lost to another runner: the job is theirs now; do not touch it.
                row = store.get_job(s, job_id=job_id)
                return JobStatus(row.status) if row else JobStatus.failed
            store.finish_job(
                s, job_id=job_id, owner=self.config.owner, status=status, plan=plan, error=error
            )
            return None

        try:
            current = self.store.patient("end job", end)
        except BaseException:
            self.counters.restore(pending)
            raise
        if current is not None:
            logger.warning("job %s: %s", job_id, error)
            return JobOutcome(job_id, current, None, error, st)
        logger.info("job %s ended %s", job_id, status.value)
        return JobOutcome(job_id, status, plan, error, st)

    # --- the phases -----------------------------------------------------------------

    def _profile_and_plan(
        self, job_id: str, stats: JobStats, keeper: LeaseKeeper, ledger: StageLedger
    ) -> Plan:
        counts = load_checked(self.store, keeper, job_id, self.zoo)
        ledger.device_memory = counts[0].cluster.device_memory_bytes
        phase, layout = self._phase(job_id, counts, stats, keeper)
        contexts = {
            job.options.num_microbatches: self._context(job_id, job, phase, layout, keeper, ledger)
            for job in counts
        }
        if counts[0].micro_batch_size:  # the job searches the count of micro-batches
            return search_counts(contexts)
        (ctx,) = contexts.values()
        reused = reuse_stored(ctx)
        loop = search_stages(ctx, reused)
        return plan_job(ctx, loop)

    def _phase(
        self, job_id: str, counts: list[JobInputs], stats: JobStats, keeper: LeaseKeeper
    ) -> tuple[MeasuringPhase, Layout]:
        """The job's measuring phase and its pool's layout: the pool (started when a stage
        needs measuring) measures the stages of every count's spec."""
        first = counts[0]
        pool_config = self._pool_config([job.space for job in counts])
        layout = make_layout(pool_config)
        failures = FailureFactory({job.model_key: job.space for job in counts}, first.cluster)

        def start_pool() -> GroupPool:
            pool = GroupPool(
                pool_config,
                model_key=first.model_key,
                spec=first.spec,
                cluster=first.cluster,
                options=first.options,
                failure_result=failures.make,
                retry=self.config.retry,
                layout=layout,
                check=keeper.check,
                on_wait=phase.on_device_wait,
            )
            for job in counts[1:]:
                pool.add_model(job.model_key, job.spec, job.options)
            return pool

        phase = self.phase = MeasuringPhase(
            self.store,
            job_id=job_id,
            owner=self.config.owner,
            start_pool=start_pool,
            poll_seconds=self.config.poll_seconds,
            on_progress=self.on_progress,
            stats=stats,
        )
        if self._worker_info is None:  # first job of this runner: ask the actors once
            # stages are measured small first, on the largest submesh first (measure_order)
            largest = max(first.space.submeshes, key=lambda m: m.num_devices)
            self._worker_info = phase.ensure_pool().info(largest)
        return phase, layout

    def _context(
        self,
        job_id: str,
        job: JobInputs,
        phase: MeasuringPhase,
        layout: Layout,
        keeper: LeaseKeeper,
        ledger: StageLedger,
    ) -> JobContext:
        """The context of the job (of one of its counts): its inputs, measuring phase and
        candidates fingerprinted."""
        assert self._worker_info is not None
        candidates = fingerprint_candidates(
            job.spec,
            job.space,
            job.options,
            self._worker_info,
            keeper,
            self.config.reuse_stages,
            job.micro_batch_size,
        )
        return JobContext(
            job_id=job_id,
            owner=self.config.owner,
            model_id=job.model_id,
            spec=job.spec,
            cluster=job.cluster,
            options=job.options,
            space=job.space,
            candidates=candidates,
            store=self.store,
            keeper=keeper,
            ledger=ledger,
            stats=phase.stats,
            phase=phase,
            layout=layout,
            reuse_stages=self.config.reuse_stages,
            scaled=job.scaled,
            direct=job.direct,
            micro_batch_size=job.micro_batch_size,
            model_key=job.model_key,
        )

    def _pool_config(self, spaces: list[planner.CandidateSpace]) -> PoolConfig:
        """Packed groups, one shape at a time, on a Ray cluster whose devices are real
        resources; on the local Ray of virtual CPU devices, one shape per job (its largest
        submesh), which packing only slows down here (bench/RESULTS.md §7)."""
        one_shape = self.config.devices_per_worker
        if one_shape is None and not self.config.use_gpus and virtual_devices_only():
            one_shape = max(m.num_devices for space in spaces for m in space.submeshes)
        return PoolConfig(
            max_groups=self.config.num_workers,
            one_shape=one_shape,
            use_gpus=self.config.use_gpus,
            kill_grace_s=self.config.kill_grace_s,
            device_wait_s=self.config.device_wait_s,
        )
