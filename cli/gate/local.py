"""Today's job embedded (no `--server`): the store at `--database-url` (default
STAGEPROF_DATABASE_URL or ./stageprof.db), a local Ray, JAX on virtual CPU devices; the same
runner `stageprof plan` uses."""

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from cli.gate.recost import measure_baseline, remeasure
from cli.gate.source import GateError, TodayRun
from schemas import ClusterSpec, ModelSpec, PlannedStage, PlanOptions, StageProfileResult


class StoreProfiles:
    """The job's profile table read from the store (see recost.ProfileSource)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def candidates(self, job_id: str, stage: PlannedStage) -> list[dict[str, Any]]:
        from store import session_scope
        from store.queries import MAX_PAGE_SIZE, ProfileFilter, ProfileSort, profile_page

        filters = ProfileFilter(
            job_id=job_id,
            start_min=stage.start,
            end_max=stage.end,
            submesh_id=stage.submesh_id,
            config_id=stage.config_id,
        )
        with session_scope(self.sessions, write=False) as s:
            page = profile_page(s, filters=filters, sort=ProfileSort("start"), limit=MAX_PAGE_SIZE)
        return page.rows

    def result(self, fingerprint: str) -> StageProfileResult | None:
        from store import get_profile, profile_result, session_scope

        with session_scope(self.sessions, write=False) as s:
            row = get_profile(s, fingerprint=fingerprint)
            return profile_result(row) if row is not None else None


def run_local(
    args: argparse.Namespace,
    cluster: ClusterSpec,
    options: PlanOptions,
    load_spec: Callable[[], ModelSpec],
    baseline_stages: Sequence[PlannedStage],
    *,
    say: Callable[[str], None],
) -> TodayRun:
    """Plan today's model in this process, its job asked to measure `baseline_stages`;
    `load_spec` runs after Ray has started (it may import jax, which Ray's forked processes
    must not inherit)."""
    from cli.commands.plan import queue_embedded_job
    from cli.commands.worker import runner_config
    from workers.cluster.ray_env import connect_ray
    from workers.jobs.runner import JobRunner

    connect_ray()
    spec = load_spec()
    options = measure_baseline(options, baseline_stages, spec.num_layers)
    try:
        options.check_micro_batch(spec.micro_batch_size)
    except ValueError as err:
        raise GateError(str(err)) from err
    try:
        sessions, job_id = queue_embedded_job(args.database_url, spec, cluster, options)
    except SQLAlchemyError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GateError(f"cannot use the store: {first}") from err
    say(f"planning {spec.name} ({spec.num_layers} layers) embedded; job {job_id}")
    outcome = JobRunner(sessions, runner_config(args)).run_next(job_id)
    if outcome is None:
        raise GateError(f"job {job_id} was taken by another runner")
    if args.report:
        from cli.commands.plan_output import write_report

        write_report(args.report, sessions, job_id)
    error = None if outcome.plan is not None else f"job {job_id} {outcome.status}: {outcome.error}"
    return TodayRun(
        job_id=job_id,
        plan=outcome.plan,
        error=error,
        stats=outcome.stats.as_dict(),
        remeasured=remeasure(
            StoreProfiles(sessions),
            job_id,
            baseline_stages,
            device_memory_bytes=cluster.device_memory_bytes,
        ),
    )
