"""A job that searches the count of micro-batches (`PlanOptions.microbatch_search`): every
count's estimate search in one job, on one measuring pool.

Each count B has its own context (the spec stated at micro-batch global batch / B, the
options at B, its candidate space and stage fingerprints, its candidates stored at its
micro-batch size) and its own `EstimateLoop`. `CountsLoop` runs their steps side by side:
the layer profiles of every count together, then rounds of `planner.MicrobatchSearch`, which
stops a count whose optimistic best is slower than a plan of measured stages another count
has; each step's stages of every count go to the pool together (tasks name their count's
spec: `GroupPool.add_model`), a round's in `MicrobatchSearch.measure_order`, each count
judged again as the round's results come in (`MicrobatchSearch.not_now`). The plan is the
fastest count's (`choose_count`), every count's best beside it.

A layer profile is measured only at the smallest and the largest micro-batch size that has
its submesh and config; at the sizes between, it is interpolated from the nearest measured
sizes (`planner.batch_profiles`) and given to that count's search as an estimate
(`EstimateSearch.add_prior`): measured only when a plan that could be best rests on it.
"""

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence

from planner.batch_profiles import Ident, ident_index, inside, interpolated_profile, stage_ident
from planner.errors import NoFeasiblePlan
from planner.layer_profiles import is_layer_profile
from planner.microbatches import CountPlan, MicrobatchSearch, choose_count
from schemas import Plan, StageKey, StageProfileResult
from workers.jobs.estimate_loop import EstimateLoop
from workers.jobs.job_context import JobContext
from workers.jobs.job_phases import Reused, plan_job, reuse_stored
from workers.jobs.stage_order import by_group_shape

logger = logging.getLogger(__name__)
Key = tuple[int, int, int, int]


class _CountsSink:
    """Feeds each result to the search of the count whose stage it is."""

    def __init__(self, loops: Mapping[int, EstimateLoop], count_of: Mapping[str, int]) -> None:
        self.loops = loops
        self.count_of = count_of

    def add(self, fingerprint: str, keys: Iterable[Key], result: StageProfileResult) -> None:
        self.loops[self.count_of[fingerprint]].search.add(keys, result)

    def prunable(self, fingerprint: str, keys: Iterable[Key]) -> bool:
        return False


class CountsLoop:
    """The estimate searches of a job's counts (`contexts`, by count), run together."""

    def __init__(self, contexts: Mapping[int, JobContext]) -> None:
        first = contexts[min(contexts)]
        for b, ctx in contexts.items():
            if ctx.space.submeshes != first.space.submeshes:
                raise ValueError(f"{b} micro-batches: the submeshes differ from the others'")
        self.ctx = first  # what every count shares: store, keeper, phase, ledger, layout
        self.loops = {b: EstimateLoop(ctx) for b, ctx in sorted(contexts.items())}
        batch = first.options.global_batch(first.spec.micro_batch_size)
        self.search = MicrobatchSearch({b: x.search for b, x in self.loops.items()}, batch)
        self.keys_by_fp: dict[str, list[StageKey]] = {}
        self.count_of: dict[str, int] = {}
        self.model_of: dict[str, str] = {}
        for b, ctx in contexts.items():
            for fp, keys in ctx.keys_by_fp.items():
                if fp in self.count_of:  # stages of different sizes are different stages
                    raise ValueError(f"stage {fp[:12]} is one of {b} and {self.count_of[fp]}")
                self.keys_by_fp[fp] = keys
                self.count_of[fp] = b
                self.model_of[fp] = ctx.model_key
        self._sink = _CountsSink(self.loops, self.count_of)

    @property
    def sizes(self) -> list[int]:
        """The micro-batch size of each count, as its candidates are stored."""
        return [x.ctx.micro_batch_size for x in self.loops.values()]

    def run(self, reused: Mapping[int, Reused]) -> None:
        """Every count's steps before the rounds, step by step together (of the layer
        profiles, those between two sizes interpolated: `_between`); then the rounds of
        `MicrobatchSearch` until no count asks for more; then each count's estimates."""
        keeper = self.ctx.keeper
        steps: list[Iterator[list[str]]] = [
            loop.prepare(dict(reused[b].known), reused[b].to_measure)
            for b, loop in self.loops.items()
        ]
        profiles = {b: next(step) for b, step in zip(self.loops, steps, strict=True)}
        between = self._between(profiles)
        self._measure([fp for b, fps in profiles.items() for fp in fps if fp not in between[b]])
        self._measure(self._interpolate(between))
        while steps:
            wanted: list[str] = []
            alive = []
            for step in steps:
                fps = next(step, None)
                if fps is not None:
                    wanted.extend(fps)
                    alive.append(step)
            self._measure(wanted)
            steps = alive
        while True:
            keeper.check()
            self.loops[min(self.loops)].say("estimates")
            asked = keeper.call("estimates", self.search.next_round)
            if not asked:
                break
            wanted = []
            for b in self.search.measure_order(asked):
                fresh = self.loops[b].fresh(asked[b])
                if fresh is None:  # measured already by another job: this count is done
                    self.search.live.discard(b)
                    continue
                wanted.extend(fresh)
            if not wanted:
                break
            self.loops[min(self.loops)].say(f"verification round {self.search.rounds}")
            self._measure(wanted, judged=True)
        for b, why in self.search.dropped.items():
            logger.info("job %s: %d micro-batches stopped early: %s", self.ctx.job_id, b, why)
        for loop in self.loops.values():
            loop.finish()

    def _between(self, profiles: Mapping[int, list[str]]) -> dict[int, set[str]]:
        """The layer profiles of each count (`profiles`: its first step) at a size strictly
        between two sizes that have the stage (`planner.batch_profiles.inside`): those are
        interpolated, not measured."""
        holders: dict[Ident, set[int]] = {}
        for loop in self.loops.values():
            for ident in ident_index(loop.space):
                holders.setdefault(ident, set()).add(loop.ctx.micro_batch_size)
        out: dict[int, set[str]] = {}
        for b, fps in profiles.items():
            loop = self.loops[b]
            size = loop.ctx.micro_batch_size
            out[b] = {
                fp
                for fp in fps
                if fp not in loop.asked
                and all(
                    inside(size, holders[stage_ident(loop.space, k.as_tuple())])
                    for k in self.keys_by_fp[fp]
                )
            }
        return out

    def _interpolate(self, between: Mapping[int, set[str]]) -> list[str]:
        """Give each count's search its interpolated layer profiles (`between`) as estimates;
        the stages that cannot be (a measurement at an end failed), to measure."""
        measured: dict[int, dict[Ident, StageProfileResult]] = {}
        for loop in self.loops.values():
            at_size = measured.setdefault(loop.ctx.micro_batch_size, {})
            for key, result in loop.search.measured.items():
                if is_layer_profile(key):
                    at_size[stage_ident(loop.space, key)] = result
        missing: list[str] = []
        for b, fps in between.items():
            loop = self.loops[b]
            size = loop.ctx.micro_batch_size
            given = 0
            for fp in sorted(fps):
                keys = [k.as_tuple() for k in self.keys_by_fp[fp]]
                made = [
                    interpolated_profile(stage_ident(loop.space, k), size, measured, fp)
                    for k in keys
                ]
                if any(r is None for r in made):
                    missing.append(fp)
                    continue
                for key, prior in zip(keys, made, strict=True):
                    assert prior is not None
                    loop.search.add_prior([key], prior)
                loop.defer([fp])
                given += 1
            if fps:
                logger.info(
                    "job %s: %d micro-batches: %d layer profiles interpolated from other "
                    "sizes, %d measured",
                    self.ctx.job_id,
                    b,
                    given,
                    len(fps) - given,
                )
        return missing

    def plans(self) -> dict[int, CountPlan]:
        """Each count's plan (`EstimateLoop.plan`), or why it has none."""
        out: dict[int, CountPlan] = {}
        for b, loop in self.loops.items():
            try:
                out[b] = loop.plan()
            except NoFeasiblePlan as err:
                out[b] = self.search.why_no_plan(b, err)
        return out

    def plan(self) -> Plan:
        """The fastest count's plan, every count's best beside it (`choose_count`)."""
        return choose_count(self.plans(), self.search.global_batch)

    def _measure(self, fps: Sequence[str], judged: bool = False) -> None:
        """Measure `fps` (of every count) on the job's pool; the stages a count's loop
        measures without the split backward (`EstimateLoop.unsplit`) as their twins.
        `judged` (a round's stages): each count is judged again before each of its stages
        goes to an actor, and its stages the round's results so far leave no use for now
        (`MicrobatchSearch.not_now`) are put back unmeasured (`EstimateLoop.put_back`); a
        stage measured again with its split loses its record without it only as it goes to
        an actor (`EstimateLoop.detach`)."""
        ctx = self.ctx
        wanted = by_group_shape(list(fps), self.keys_by_fp, ctx.space, ctx.layout)
        if not wanted:
            return
        twins: dict[str, str] = {}
        for b, loop in self.loops.items():
            mine = [fp for fp in wanted if self.count_of[fp] == b]
            twins.update(loop.ctx.unsplit_routes(mine, loop.unsplit))
        for fp, twin in twins.items():
            self.keys_by_fp[twin] = self.keys_by_fp[fp]
            self.count_of[twin] = self.count_of[fp]
            self.model_of[twin] = self.model_of[fp]
        original = {twin: fp for fp, twin in twins.items()}
        if not judged:  # every stage goes to an actor: none waits for `postpone`
            for loop in self.loops.values():
                loop.detach(wanted)

        def postpone(fp: str) -> bool:
            count = self.count_of[fp]
            if not self.search.not_now(count):
                self.loops[count].detach([original.get(fp, fp)])
                return False
            self.loops[count].put_back([original.get(fp, fp)])
            return True

        ctx.phase.run(
            [twins.get(fp, fp) for fp in wanted],
            self.keys_by_fp,
            ctx.space.submeshes,
            self._sink,
            ctx.stats,
            ctx.keeper,
            ctx.ledger,
            keep_idle=True,  # the next step comes within seconds
            model_of=self.model_of,
            unsplit=set(twins.values()),
            postpone=postpone if judged else None,
        )


def search_counts(contexts: Mapping[int, JobContext]) -> Plan:
    """Reuse what the store holds for each count, search every count together, plan."""
    reused = {b: reuse_stored(ctx) for b, ctx in contexts.items()}
    loop = CountsLoop(contexts)
    loop.run(reused)
    return plan_job(loop.ctx, loop, loop.sizes)
