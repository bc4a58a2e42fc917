"""The phases of one job after it is loaded, each a function of the job's context: reuse what
the store holds, search (measure what the search asks for), plan. The plan is stored with
the job's end (`JobRunner`)."""

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

import planner
import store
from schemas import JobStatus, Plan, StageProfileResult
from workers.jobs.estimate_loop import EstimateLoop
from workers.jobs.heartbeat import JobCancelled
from workers.jobs.job_context import JobContext
from workers.jobs.job_inputs import JobFailed
from workers.jobs.prune_loop import measure_pruned

# A job's measured candidates by key tuple (store.job_results).
Results = Mapping[tuple[int, int, int, int], StageProfileResult]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reused:
    """What the store held for a job: its results so far, and the stages still to measure."""

    known: Results
    to_measure: list[str]
    reused: int


def reuse_stored(ctx: JobContext) -> Reused:
    """Add the job's candidates to the store and take every stored measurement they can
    reuse (with the backward split where the job needs none: a superset of the one needed;
    without it where the job measures the split on demand: `JobContext.splits_on_demand`)."""
    job_id, model_id, candidates = ctx.job_id, ctx.model_id, ctx.candidates
    size = ctx.micro_batch_size
    # the stored twin a candidate may take instead: measured with the split where the job
    # needs none, without it where the job measures the split on demand
    twin_of: Callable[[str], str] | None = None
    if ctx.splits_on_demand:
        twin_of = ctx.unsplit_twin
    elif ctx.reuse_stages and not ctx.options.measures_split_backward:
        twin_of = candidates.split_twin
    memory = ctx.cluster.device_memory_bytes

    def reuse(s: Session) -> Reused:
        store.add_candidates(s, job_id=job_id, model_id=model_id, candidates=candidates.rows)
        pending = store.pending_fingerprints(s, job_id=job_id, micro_batch_size=size)
        stored = store.reusable_profiles(s, fingerprints=pending, device_memory=memory)
        for row in stored.values():
            store.record_result(s, job_id=job_id, profile=row, reused=True)
        if twin_of is not None:
            twins = {twin_of(fp): fp for fp in pending if fp not in stored}
            found = store.reusable_profiles(s, fingerprints=twins, device_memory=memory)
            for twin, row in found.items():
                stored[twins[twin]] = row
                store.record_result(
                    s, job_id=job_id, profile=row, reused=True, fingerprint=twins[twin]
                )
        store.refresh_progress(s, job_id=job_id)
        return Reused(
            store.job_results(s, job_id=job_id, micro_batch_size=size),
            [fp for fp in pending if fp not in stored],
            len(stored),
        )

    reused = ctx.store.patient("reuse stored stages", reuse)
    ctx.keeper.check()
    logger.info(
        "job %s%s: %d candidates, %d distinct, %d reused, %d to measure",
        job_id,
        f" (micro-batch {size})" if size else "",
        len(candidates.rows),
        candidates.distinct,
        reused.reused,
        len(reused.to_measure),
    )
    return reused


def search_stages(ctx: JobContext, reused: Reused) -> EstimateLoop | None:
    """Measure what the job's search asks for: the estimate search (returned: it plans),
    else the pruning or exhaustive one (None: the plan is made from the stored results)."""
    if ctx.options.search_mode == "estimate":
        loop = EstimateLoop(ctx)
        loop.run(dict(reused.known), reused.to_measure)
        return loop
    measure_pruned(ctx, reused.known, reused.to_measure)
    return None


class SearchPlanner(Protocol):
    """A search that plans from what it measured (`EstimateLoop`, `CountsLoop`)."""

    def plan(self) -> Plan: ...


def plan_job(
    ctx: JobContext, loop: SearchPlanner | None, sizes: Sequence[int] | None = None
) -> Plan:
    """Move the job to planning and plan it from its results (the search's own plan when
    it ran); `JobFailed` when every candidate (of every micro-batch size in `sizes`, default
    the context's) failed."""
    job_id, owner = ctx.job_id, ctx.owner
    at_sizes = list(sizes) if sizes is not None else [ctx.micro_batch_size]

    def to_planning(s: Session) -> list[Results] | None:
        if not store.set_job_status(s, job_id=job_id, owner=owner, status=JobStatus.planning):
            return None
        return [store.job_results(s, job_id=job_id, micro_batch_size=n) for n in at_sizes]

    by_size = ctx.store.patient("start planning", to_planning)
    if by_size is None:
        ctx.keeper.check()
        raise JobCancelled("lost the job's lease before planning")
    everything = [r for results in by_size for r in results.values()]
    failures = Counter(r.status.value for r in everything if not r.ok)
    if everything and not any(r.ok for r in everything):
        summary = ", ".join(f"{n} {status}" for status, n in failures.most_common())
        raise JobFailed(f"every candidate failed ({summary}); nothing to plan with")
    if loop is not None:
        return ctx.keeper.call("dp", loop.plan)
    return ctx.keeper.call(
        "dp", planner.build_plan, ctx.spec, ctx.cluster, ctx.options, ctx.space, by_size[0]
    )
