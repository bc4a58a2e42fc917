"""A job's search: prune (every stage that could be in a better plan) or exhaustive."""

import logging
from collections.abc import Mapping

import planner
import store
from schemas import ClusterSpec, ModelSpec, PlanOptions, StageKey, StageProfileResult
from workers.cluster import Layout
from workers.jobs.heartbeat import LeaseKeeper
from workers.jobs.job_stats import JobStats
from workers.jobs.phase import MeasuringPhase
from workers.jobs.retry import StoreRetry
from workers.jobs.stage_ledger import StageLedger
from workers.jobs.stage_order import by_group_shape, measure_order

logger = logging.getLogger(__name__)


def measure_pruned(
    retry: StoreRetry,
    job_id: str,
    spec: ModelSpec,
    cluster: ClusterSpec,
    options: PlanOptions,
    space: planner.CandidateSpace,
    layout: Layout,
    phase: MeasuringPhase,
    keys_by_fp: dict[str, list[StageKey]],
    known: Mapping[tuple[int, int, int, int], StageProfileResult],
    to_measure: list[str],
    stats: JobStats,
    keeper: LeaseKeeper,
    ledger: StageLedger,
) -> None:
    """Measure the stages of `to_measure` (all of them with search: exhaustive, else those
    that could be in a better plan); remat variants after the as-written stages, and only
    where those lack room; the stages of `options.measure_stages` whatever the rest says."""
    asked = {k.as_tuple() for k in options.measure_stages}
    pruner = None
    if options.search_mode != "exhaustive":
        keep = planner.baseline_keys(spec.num_layers, space, cluster.num_devices)
        keep |= asked
        pruner = planner.StagePruner(spec, cluster, options, space, options.prune_margin, keep=keep)
        for known_key, result in known.items():
            pruner.add([known_key], result)
        # Small stages first: they are cheap and bound the big ones, which may then
        # never need measuring. Within a size, larger submeshes first (as Alpa).
        to_measure.sort(key=lambda fp: measure_order(keys_by_fp[fp], space))
    # remat variants after the as-written stages, and only where those lack room
    variant = {fp for fp in to_measure if all(space.is_remat(k) for k in keys_by_fp[fp])}
    plain = by_group_shape(
        [fp for fp in to_measure if fp not in variant], keys_by_fp, space, layout
    )
    phase.run(plain, keys_by_fp, space.submeshes, pruner, stats, keeper, ledger)
    if variant:
        measured = retry.patient("results so far", lambda s: store.job_results(s, job_id=job_id))

        def worth(fp: str) -> bool:
            return any(
                k.as_tuple() in asked
                or planner.remat_worth_measuring(
                    k.as_tuple(), space, measured, spec.num_layers, cluster.num_devices, options
                )
                for k in keys_by_fp[fp]
            )

        wanted = [fp for fp in to_measure if fp in variant and worth(fp)]
        skipped = [fp for fp in to_measure if fp in variant and fp not in set(wanted)]
        logger.info(
            "job %s: %d remat-variant stages to measure, %d not needed",
            job_id,
            len(wanted),
            len(skipped),
        )
        if skipped:
            phase.skip(skipped, stats)
        wanted = by_group_shape(wanted, keys_by_fp, space, layout)
        phase.run(wanted, keys_by_fp, space.submeshes, pruner, stats, keeper, ledger)
