"""The job runner: claim a job, enumerate its candidates, reuse what is stored, measure the
rest on Ray, store each result the moment it exists, then plan."""

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

import planner
import store
from schemas import (
    ClusterSpec,
    JobStatus,
    ModelSpec,
    Plan,
    PlanOptions,
    ProfileStatus,
    StageKey,
    StageProfileResult,
)
from workers.pool import KILL_GRACE_S, MeasurePool, MeasureTask, PoolConfig, RetryPolicy

logger = logging.getLogger(__name__)

ZooBuilder = Callable[[str, dict[str, Any]], ModelSpec]


@dataclass(frozen=True)
class RunnerConfig:
    """How a runner holds leases and sizes its actor pool."""

    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 3.0
    poll_seconds: float = 1.0
    num_workers: int | None = None
    devices_per_worker: int | None = None
    use_gpus: bool = False
    kill_grace_s: float = KILL_GRACE_S
    # False measures every candidate on its own, as Alpa does (a baseline for benchmarks):
    # a candidate's fingerprint then also names its (start, end, submesh, config).
    reuse_stages: bool = True
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass
class JobStats:
    """What a job cost: the `stats` of `stageprof plan --json`."""

    candidates: int = 0
    distinct_stages: int = 0
    measured: int = 0
    reused: int = 0
    pruned: int = 0
    failed: int = 0
    wall_seconds: float = 0.0
    actors_started: int = 0
    actors_replaced: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


@dataclass
class JobOutcome:
    job_id: str
    status: JobStatus
    plan: Plan | None
    error: str | None
    stats: JobStats


class JobCancelled(Exception):
    """The job was cancelled, or its lease was lost to another runner."""


ProgressCallback = Callable[[store.JobRow | None, JobStats], None]


class JobRunner:
    """Runs jobs from the store on a Ray pool. One job at a time per runner."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: RunnerConfig | None = None,
        *,
        build_zoo: ZooBuilder | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = config or RunnerConfig()
        self.build_zoo = build_zoo
        self.on_progress = on_progress
        self.pool: MeasurePool | None = None
        self._worker_info: dict[str, Any] | None = None

    def run_forever(self, stop: threading.Event, idle_sleep_s: float = 2.0) -> None:
        """Claim and run jobs until `stop` is set."""
        while not stop.is_set():
            if self.run_next() is None:
                stop.wait(idle_sleep_s)

    def run_next(self, job_id: str | None = None) -> JobOutcome | None:
        """Claim one job (queued, or with an expired lease) and run it to its end."""
        with store.session_scope(self.sessions) as s:
            row = store.claim_job(
                s, owner=self.config.owner, lease_seconds=self.config.lease_seconds, job_id=job_id
            )
            if row is None:
                return None
            claimed_id = row.id
        logger.info("runner %s claimed job %s", self.config.owner, claimed_id)
        return self._run(claimed_id)

    def _run(self, job_id: str) -> JobOutcome:
        started = time.monotonic()
        stats = JobStats()
        try:
            plan = self._profile_and_plan(job_id, stats)
        except JobCancelled as why:
            stats.wall_seconds = time.monotonic() - started
            return self._end(job_id, JobStatus.cancelled, None, str(why), stats)
        except planner.NoFeasiblePlan as why:
            stats.wall_seconds = time.monotonic() - started
            return self._end(job_id, JobStatus.failed, None, str(why), stats)
        except JobFailed as why:
            stats.wall_seconds = time.monotonic() - started
            return self._end(job_id, JobStatus.failed, None, str(why), stats)
        except Exception as err:  # a bug or an infrastructure fault: end the job, say what
            logger.exception("job %s: unexpected error", job_id)
            stats.wall_seconds = time.monotonic() - started
            message = f"internal error: {type(err).__name__}: {err}"
            return self._end(job_id, JobStatus.failed, None, message, stats)
        finally:
            if self.pool is not None:
                stats.actors_started = self.pool.config.num_workers + self.pool.actors_replaced
                stats.actors_replaced = self.pool.actors_replaced
                self.pool.shutdown()
                self.pool = None
        stats.wall_seconds = time.monotonic() - started
        return self._end(job_id, JobStatus.done, plan, None, stats)

    def _end(
        self, job_id: str, status: JobStatus, plan: Plan | None, error: str | None, st: JobStats
    ) -> JobOutcome:
        with store.session_scope(self.sessions) as s:
            if status == JobStatus.cancelled and not store.is_cancel_requested(s, job_id=job_id):
                # Lease lost to another runner: the job is theirs now; do not touch it.
                logger.warning("job %s: %s", job_id, error)
                row = store.get_job(s, job_id=job_id)
                current = JobStatus(row.status) if row else JobStatus.failed
                return JobOutcome(job_id, current, None, error, st)
            store.finish_job(
                s, job_id=job_id, owner=self.config.owner, status=status, plan=plan, error=error
            )
        logger.info("job %s ended %s", job_id, status.value)
        return JobOutcome(job_id, status, plan, error, st)

    # --- the phases -----------------------------------------------------------------

    def _load(self, job_id: str) -> tuple[str, ModelSpec, ClusterSpec, PlanOptions]:
        with store.session_scope(self.sessions) as s:
            row = store.get_job(s, job_id=job_id)
            assert row is not None
            cluster = ClusterSpec.model_validate(row.cluster)
            options = PlanOptions.model_validate(row.options)
            if row.model_id is not None:
                try:
                    spec = store.get_model_spec(s, model_id=row.model_id)
                except store.OldModelForm as err:
                    raise JobFailed(str(err)) from err
                if spec is None:
                    raise JobFailed(f"model {row.model_id} is not stored")
                return row.model_id, spec, cluster, options
            zoo_name, zoo_config = row.zoo_name or "", dict(row.zoo_config or {})
        if self.build_zoo is None:
            raise JobFailed("this runner cannot build zoo models")
        try:
            spec = self.build_zoo(zoo_name, zoo_config)
        except (ValueError, TypeError, KeyError) as err:
            raise JobFailed(f"zoo model {zoo_name!r}: {err}") from err
        with store.session_scope(self.sessions) as s:
            model, _ = store.put_model(s, spec=spec)
            store.set_job_model(s, job_id=job_id, model_id=model.id)
            return model.id, spec, cluster, options

    def _profile_and_plan(self, job_id: str, stats: JobStats) -> Plan:
        from workers.compose import check_programs
        from workers.fingerprint import stage_fingerprint

        model_id, spec, cluster, options = self._load(job_id)
        try:
            options.check_micro_batch(spec.micro_batch_size)
        except ValueError as err:
            raise JobFailed(f"options.global_batch_size: {err}") from err
        problems = check_programs(spec)
        if problems:
            raise JobFailed("the model's programs do not match its spec: " + "; ".join(problems))

        space = planner.enumerate_candidates(spec, cluster, options)
        pool_config = self._pool_config(cluster, space)

        def start_pool() -> MeasurePool:
            return MeasurePool(
                pool_config,
                model_key=model_id,
                spec=spec,
                cluster=cluster,
                options=options,
                failure_result=_FailureFactory(space, cluster).make,
                retry=self.config.retry,
            )

        if self._worker_info is None:  # first job of this runner: ask the actors once
            self.pool = start_pool()
            self._worker_info = self.pool.info()
        device_kind = str(self._worker_info["device_kind"])
        jax_version = str(self._worker_info["jax_version"])

        candidates = []
        for key in space.keys:
            submesh, config = space.resolve(key)
            fp = stage_fingerprint(
                spec, key.start, key.end, submesh, config, device_kind, jax_version, options
            )
            if not self.config.reuse_stages:
                fp = hashlib.sha256(f"{fp}/{key.as_tuple()}".encode()).hexdigest()
            candidates.append(store.CandidateIn(key, fp, submesh.num_devices, config.strategy))
        stats.candidates = len(candidates)
        stats.distinct_stages = len({c.fingerprint for c in candidates})

        keys_by_fp: dict[str, list[StageKey]] = {}
        for c in candidates:
            keys_by_fp.setdefault(c.fingerprint, []).append(c.key)

        with store.session_scope(self.sessions) as s:
            store.add_candidates(s, job_id=job_id, model_id=model_id, candidates=candidates)
            pending = store.pending_fingerprints(s, job_id=job_id)
            stored = store.reusable_profiles(s, fingerprints=pending)
            for row in stored.values():
                store.record_result(s, job_id=job_id, profile=row, reused=True)
            store.refresh_progress(s, job_id=job_id)
            known = store.job_results(s, job_id=job_id)
        stats.reused = len(stored)
        to_measure = [fp for fp in pending if fp not in stored]
        logger.info(
            "job %s: %d candidates, %d distinct, %d reused, %d to measure",
            job_id,
            stats.candidates,
            stats.distinct_stages,
            stats.reused,
            len(to_measure),
        )
        pruner = None
        if options.prune:
            keep = planner.baseline_keys(spec.num_layers, space, cluster.num_devices)
            pruner = planner.StagePruner(
                spec, cluster, options, space, options.prune_margin, keep=keep
            )
            for key, result in known.items():
                pruner.add([key], result)
            # Small stages first: they are cheap and bound the big ones, which may then
            # never need measuring. Within a size, larger submeshes first (as Alpa).
            to_measure.sort(key=lambda fp: _measure_order(keys_by_fp[fp], space))
        self._measure(job_id, to_measure, keys_by_fp, pruner, stats, start_pool)

        with store.session_scope(self.sessions) as s:
            if not store.set_job_status(
                s, job_id=job_id, owner=self.config.owner, status=JobStatus.planning
            ):
                raise JobCancelled("lost the job's lease before planning")
            results = store.job_results(s, job_id=job_id)
        failures = Counter(r.status.value for r in results.values() if not r.ok)
        stats.failed = sum(1 for r in results.values() if not r.ok)
        if results and not any(r.ok for r in results.values()):
            summary = ", ".join(f"{n} {status}" for status, n in failures.most_common())
            raise JobFailed(f"every candidate failed ({summary}); nothing to plan with")
        return planner.build_plan(spec, cluster, options, space, results)

    def _pool_config(self, cluster: ClusterSpec, space: Any) -> PoolConfig:
        largest = max(m.num_devices for m in space.submeshes)
        devices = self.config.devices_per_worker or largest
        workers = self.config.num_workers or max(1, min(2, os.cpu_count() or 1))
        return PoolConfig(
            num_workers=workers,
            devices_per_worker=devices,
            use_gpus=self.config.use_gpus,
            kill_grace_s=self.config.kill_grace_s,
        )

    def _measure(
        self,
        job_id: str,
        fingerprints: list[str],
        keys_by_fp: dict[str, list[StageKey]],
        pruner: planner.StagePruner | None,
        stats: JobStats,
        start_pool: Callable[[], MeasurePool],
    ) -> None:
        """Submit stages as actors free up (a bounded queue), skipping what cannot matter.

        Actors start at the first stage that needs measuring: a warm re-plan starts none."""
        queue = deque(fingerprints)
        last_beat = time.monotonic()
        while queue or (self.pool is not None and self.pool.busy):
            skipped: list[str] = []
            while queue and (
                self.pool is None or self.pool.in_flight < self.pool.config.num_workers
            ):
                fp = queue.popleft()
                if pruner is not None and pruner.prunable(k.as_tuple() for k in keys_by_fp[fp]):
                    skipped.append(fp)
                    continue
                if self.pool is None:
                    self.pool = start_pool()
                self.pool.submit(MeasureTask(fingerprint=fp, key=keys_by_fp[fp][0]))
            if skipped:
                self._store_pruned(job_id, skipped, stats)
            if self.pool is None:
                continue
            for result in self.pool.poll(self.config.poll_seconds):
                self._store_result(job_id, result, stats)
                if pruner is not None:
                    pruner.add((k.as_tuple() for k in keys_by_fp[result.fingerprint]), result)
            if time.monotonic() - last_beat >= self.config.heartbeat_seconds:
                self._heartbeat(job_id)
                last_beat = time.monotonic()
        self._heartbeat(job_id)

    def _store_result(self, job_id: str, result: StageProfileResult, stats: JobStats) -> None:
        with store.session_scope(self.sessions) as s:
            row = store.save_profile(s, result=result)
            store.record_result(s, job_id=job_id, profile=row, reused=False)
            store.refresh_progress(s, job_id=job_id)
            job = store.get_job(s, job_id=job_id)
        stats.measured += 1
        if self.on_progress is not None:
            self.on_progress(job, stats)

    def _store_pruned(self, job_id: str, fingerprints: list[str], stats: JobStats) -> None:
        with store.session_scope(self.sessions) as s:
            store.mark_pruned(s, job_id=job_id, fingerprints=fingerprints)
            store.refresh_progress(s, job_id=job_id)
            job = store.get_job(s, job_id=job_id)
        stats.pruned += len(fingerprints)
        if self.on_progress is not None:
            self.on_progress(job, stats)

    def _heartbeat(self, job_id: str) -> None:
        with store.session_scope(self.sessions) as s:
            alive = store.renew_lease(
                s, job_id=job_id, owner=self.config.owner, lease_seconds=self.config.lease_seconds
            )
            cancelled = store.is_cancel_requested(s, job_id=job_id)
        if alive:
            return
        if self.pool is not None:
            self.pool.stop_all()
        raise JobCancelled("cancelled by request" if cancelled else "lost the job's lease")


def _measure_order(keys: list[StageKey], space: Any) -> tuple[int, int]:
    """Fewest layers first, then most devices."""
    key = keys[0]
    return (key.end - key.start, -space.submeshes[key.submesh_id].num_devices)


class JobFailed(Exception):
    """The job cannot produce a plan; the message says why."""


class _FailureFactory:
    """Makes the result of a candidate that produced none (timeout, lost worker)."""

    def __init__(self, space: Any, cluster: ClusterSpec) -> None:
        self.space = space
        self.cluster = cluster

    def make(self, task: MeasureTask, status: ProfileStatus, error: str) -> StageProfileResult:
        submesh, config = self.space.resolve(task.key)
        return StageProfileResult(
            status=status,
            error=error,
            fingerprint=task.fingerprint,
            key=task.key,
            submesh=submesh,
            config=config,
            num_layers=task.key.end - task.key.start + 1,
            available_memory=self.cluster.device_memory_bytes,
        )
