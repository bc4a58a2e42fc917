"""A job's search: prune (every stage that could be in a better plan) or exhaustive."""

import logging
from collections.abc import Iterable, Mapping

import planner
import store
from schemas import StageProfileResult
from workers.jobs.job_context import JobContext
from workers.jobs.stage_order import measure_order

logger = logging.getLogger(__name__)
Key = tuple[int, int, int, int]


class _PrunerSink:
    """A `planner.StagePruner` as the measuring phase's sink (one job, one count: the
    stage's fingerprint is not needed)."""

    def __init__(self, pruner: planner.StagePruner) -> None:
        self.pruner = pruner

    def add(self, fingerprint: str, keys: Iterable[Key], result: StageProfileResult) -> None:
        self.pruner.add(keys, result)

    def prunable(self, fingerprint: str, keys: Iterable[Key]) -> bool:
        return self.pruner.prunable(keys)


def measure_pruned(
    ctx: JobContext,
    known: Mapping[tuple[int, int, int, int], StageProfileResult],
    to_measure: list[str],
) -> None:
    """Measure the stages of `to_measure` (all of them with search: exhaustive, else those
    that could be in a better plan); remat variants after the as-written stages, and only
    where those lack room; the stages of `options.measure_stages` whatever the rest says."""
    spec, cluster, options, space = ctx.spec, ctx.cluster, ctx.options, ctx.space
    keys_by_fp = ctx.keys_by_fp
    asked = {k.as_tuple() for k in options.measure_stages}
    pruner = None
    if options.search_mode != "exhaustive":
        keep = planner.baseline_keys(spec.num_layers, space, cluster.num_devices)
        keep |= asked
        stage_pruner = planner.StagePruner(
            spec, cluster, options, space, options.prune_margin, keep=keep
        )
        for known_key, result in known.items():
            stage_pruner.add([known_key], result)
        pruner = _PrunerSink(stage_pruner)
        # Small stages first: they are cheap and bound the big ones, which may then
        # never need measuring. Within a size, larger submeshes first (as Alpa).
        to_measure.sort(key=lambda fp: measure_order(keys_by_fp[fp], space))
    # remat variants after the as-written stages, and only where those lack room
    variant = {fp for fp in to_measure if all(space.is_remat(k) for k in keys_by_fp[fp])}
    ctx.measure(ctx.by_group_shape([fp for fp in to_measure if fp not in variant]), pruner)
    if variant:
        job_id = ctx.job_id
        measured = ctx.store.patient(
            "results so far", lambda s: store.job_results(s, job_id=job_id)
        )

        def worth(fp: str) -> bool:
            return any(
                k.as_tuple() in asked
                or planner.remat_worth_measuring(
                    k.as_tuple(), space, measured, spec.num_layers, cluster, options
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
            ctx.skip(skipped)
        ctx.measure(ctx.by_group_shape(wanted), pruner)
