"""A job's search: estimate (`PlanOptions.search`, the default): layer profiles first, then
estimate every stage and measure only where it decides the plan (`planner.verify`)."""

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

import planner
import store
from schemas import ClusterSpec, ModelSpec, Plan, PlanOptions, StageProfileResult
from workers.jobs.job_context import JobContext

logger = logging.getLogger(__name__)
Key = tuple[int, int, int, int]


class _Sink:
    """What the measuring phase feeds results to: the search (it prunes nothing itself:
    the search measures only stages it asked for)."""

    def __init__(self, search: planner.EstimateSearch) -> None:
        self.search = search

    def add(self, fingerprint: str, keys: Iterable[Key], result: StageProfileResult) -> None:
        self.search.add(keys, result)

    def prunable(self, fingerprint: str, keys: Iterable[Key]) -> bool:
        return False


@dataclass
class EstimateLoop:
    """Runs the estimate search of one job (or of one count of a job that searches counts:
    `workers.jobs.count_loop` drives its steps) on its measuring phase."""

    ctx: JobContext
    search: planner.EstimateSearch = field(init=False)

    def __post_init__(self) -> None:
        ctx = self.ctx
        self.search = planner.EstimateSearch(
            ctx.spec,
            ctx.cluster,
            ctx.options,
            ctx.space,
            ctx.scaled,
            split_on_demand=ctx.splits_on_demand,
        )
        self.estimated_stages = 0  # distinct stages stored as estimated (never measured)
        self.fp_of: dict[Key, str] = ctx.candidates.fp_of
        self.keys_by_fp = ctx.keys_by_fp
        self.pending: set[str] = set()  # stages not measured (nor asked for) yet
        self.asked: set[str] = set()  # stages measured up front whatever they estimate
        # the layer profiles measured up front (not those scaled until measured on demand)
        self.up_front = set(
            planner.layer_profile_keys(ctx.space, self.search.estimator.layer_classes, ctx.scaled)
        )
        # stages measured without the split backward (`JobContext.splits_on_demand`): a
        # round that needs their split measures them again, split
        self.unsplit: set[str] = set()
        # of those, the ones a round asked for again (`fresh`): their measurement without
        # the split stays recorded until the split one goes to an actor (`detach`)
        self.resplit: set[str] = set()

    @property
    def job_id(self) -> str:
        return self.ctx.job_id

    @property
    def spec(self) -> ModelSpec:
        return self.ctx.spec

    @property
    def cluster(self) -> ClusterSpec:
        return self.ctx.cluster

    @property
    def options(self) -> PlanOptions:
        return self.ctx.options

    @property
    def space(self) -> planner.CandidateSpace:
        return self.ctx.space

    def run(self, known: dict[Key, StageProfileResult], to_measure: list[str]) -> None:
        """Measure layer profiles, then the stages the rounds ask for; the stages never
        measured are stored as estimated, with their estimates."""
        keeper = self.ctx.keeper
        sink = _Sink(self.search)

        def measure(fps: list[str]) -> None:
            wanted = self.ctx.by_group_shape(fps)
            self.detach(wanted)
            if wanted:  # keep_idle: the next round comes within seconds
                self.ctx.measure(wanted, sink, keep_idle=True, unsplit=self.unsplit)

        for fps in self.prepare(known, to_measure):
            measure(fps)
        while True:
            keeper.check()
            self.say("estimates")
            keys = keeper.call("estimates", self.search.next_round)
            if not keys:
                break
            fresh = self.fresh(keys)
            if fresh is None:
                break
            self.say(f"verification round {self.search.rounds}")
            measure(fresh)
        self.finish()

    def prepare(
        self, known: dict[Key, StageProfileResult], to_measure: list[str]
    ) -> Iterator[list[str]]:
        """The steps before the rounds, each the stages to measure before the next step
        (the caller measures them, results fed to `search`, then resumes): layer profiles,
        remat variants where memory could bind, whole-model stages no smaller submesh
        scales to."""
        for key, result in known.items():
            self.search.add([key], result)
        self.unsplit = {self.fp_of[k] for k in known if self.search.needs_split(k)}
        self.pending = set(to_measure)
        by_user = self._with_keys(to_measure, {k.as_tuple() for k in self.options.measure_stages})
        asked = by_user | self._with_keys(to_measure, set(self.ctx.direct))
        self.asked = asked
        profiles = [fp for fp in to_measure if self._is_profile(fp) or fp in asked]
        plain = [fp for fp in profiles if not self._all_remat(fp)]
        self.say("layer profiles")
        yield self._unsplit(self._take(plain))
        variants = [fp for fp in profiles if self._all_remat(fp)]
        if variants:
            if self._memory_could_bind():
                yield self._unsplit(self._take(variants))
            else:  # every as-written stage has room: no variant can help (unless asked for)
                yield self._take([fp for fp in variants if fp in by_user])
                variant_fps = {fp for fp in self.pending if self._all_remat(fp)}
                logger.info(
                    "job %s: memory is ample, %d remat-variant stages not needed",
                    self.job_id,
                    len(variant_fps),
                )
                self.pending.difference_update(variant_fps)
                self.search.skip(k.as_tuple() for fp in variant_fps for k in self.keys_by_fp[fp])
                self.ctx.skip(sorted(variant_fps))
        point = self.search.point_table()
        done = self.search.measured
        unscalable = [k for k in self.ctx.scaled if k not in point.estimated and k not in done]
        if unscalable:  # no smaller submesh runs the whole model to scale from: measured
            yield self._take(list(dict.fromkeys(self.fp_of[k] for k in unscalable)))

    def fresh(self, keys: Sequence[Key]) -> list[str] | None:
        """The stages of a round's `keys` to measure now; None when the round asked for
        nothing new (stages measured already: a race with another job)."""
        fps = list(dict.fromkeys(self.fp_of[k] for k in keys))
        again = [fp for fp in fps if fp in self.unsplit]  # their split is wanted now
        self.unsplit.difference_update(again)
        self.resplit.update(again)
        taken = set(self._take(fps)) | set(again)
        fresh = [fp for fp in fps if fp in taken]
        if fresh:
            return fresh
        logger.warning(
            "job %s: round %d asked for nothing new (%s)",
            self.job_id,
            self.search.rounds,
            ", ".join(str(k) for k in keys[:8]),
        )
        return None

    def finish(self) -> None:
        """The search is over: store the estimates and the stages never measured."""
        logger.info("job %s: estimate search: %s", self.job_id, self.search.stopped)
        self._store_estimates(sorted(self.pending))

    def defer(self, fps: Iterable[str]) -> None:
        """Stages a step asked for that are estimated instead (their layer profiles from
        other micro-batch sizes): not measured now, so a round may still ask for them
        (then with the split backward)."""
        self.pending.update(fps)
        self.unsplit.difference_update(fps)

    def put_back(self, fps: Iterable[str]) -> None:
        """Stages a round took (`fresh`) but did not measure: pending again, so a later round
        may ask for them; else they are stored as estimated. One whose split the round
        wanted keeps its measurement without the split, as before the round (`detach`)."""
        for fp in fps:
            if fp in self.resplit:
                self.resplit.discard(fp)
                self.unsplit.add(fp)
            else:
                self.pending.add(fp)

    def detach(self, fps: Iterable[str]) -> None:
        """`fps` go to the actors now: the job's candidates of those a round wants split
        (`fresh`) lose their measurement without the split (recorded again once measured
        split)."""
        again = [fp for fp in fps if fp in self.resplit]
        if again:
            self.resplit.difference_update(again)
            self._forget(again)

    def _unsplit(self, fps: list[str]) -> list[str]:
        """`fps`, of which those not asked for by name are measured without the split
        backward where the job measures it on demand."""
        if self.ctx.splits_on_demand:
            self.unsplit.update(fp for fp in fps if fp not in self.asked)
        return fps

    def _forget(self, fps: list[str]) -> None:
        """The job's candidates of `fps` lose their measurement without the split (it is
        measured again with it, and recorded then)."""
        job_id = self.job_id

        def put(s: Session) -> None:
            store.forget_results(s, job_id=job_id, fingerprints=fps)
            store.refresh_progress(s, job_id=job_id)

        self.ctx.store.patient("split on demand", put)

    def _take(self, fps: Sequence[str]) -> list[str]:
        """The stages of `fps` not measured nor asked for yet, now asked for."""
        wanted = [fp for fp in fps if fp in self.pending]
        self.pending.difference_update(wanted)
        return wanted

    def plan(self) -> Plan:
        """The plan from the measured stages, annotated with the estimates (see
        `planner.EstimateSearch.plan`); distinct stages counted once."""
        plan = self.search.plan()
        summary = plan.search
        assert summary is not None
        measured = {self.fp_of[k] for k in self.search.measured if k in self.fp_of}
        profiles = {fp for fp in measured if self._is_profile(fp, up_front=False)}
        summary = summary.model_copy(
            update={
                "layer_profiles": len(profiles),
                "verified": len(measured - profiles),
                "estimated": self.estimated_stages,
            }
        )
        return plan.model_copy(update={"search": summary})

    def _with_keys(self, fps: list[str], keys: set[Key]) -> set[str]:
        """The fingerprints of `fps` that some candidate of `keys` has."""
        return {fp for fp in fps if any(k.as_tuple() in keys for k in self.keys_by_fp[fp])}

    def _is_profile(self, fp: str, up_front: bool = True) -> bool:
        """A layer profile (`planner.is_profiled`); `up_front`: one measured up front
        (`planner.layer_profile_keys`: not one scaled until it is measured on demand)."""
        keys = [k.as_tuple() for k in self.keys_by_fp[fp]]
        if up_front:
            return any(k in self.up_front for k in keys)
        classes = self.search.estimator.layer_classes
        return any(planner.is_profiled(k, classes) for k in keys)

    def _all_remat(self, fp: str) -> bool:
        """Whether every candidate of `fp` is a remat variant of an as-written candidate
        (a variant asked for alone, `--remat full`, is the stage itself)."""
        return all(
            planner.as_written_sibling(self.space, k.as_tuple()) is not None
            for k in self.keys_by_fp[fp]
        )

    def _memory_could_bind(self) -> bool:
        """Whether some as-written stage, measured or estimated, lacks the room a schedule
        considered needs (then remat variants may be in the best plan)."""
        table = self.search.point_table().table
        for k in self.space.keys:
            key = k.as_tuple()
            if self.space.is_remat(key):
                continue
            need = planner.room_needed(
                key, self.space, self.spec.num_layers, self.cluster.num_devices, self.options
            )
            if int(table.max_n_succ_stages[key]) < need:
                return True
        return False

    def _store_estimates(self, unmeasured: list[str]) -> None:
        """Each candidate's estimate (what it was when chosen, for the measured ones) and the
        never-measured stages as `estimated`."""
        by_fp: dict[str, float] = {}
        for key, cost in self.search.point_costs().items():
            by_fp.setdefault(self.fp_of[key], cost)
        for key, seconds in self.search.estimated_at_choice.items():
            by_fp[self.fp_of[key]] = seconds
        job_id = self.job_id
        never = [fp for fp in unmeasured if fp in by_fp]
        self.estimated_stages = len(never)
        skipped = [fp for fp in unmeasured if fp not in by_fp]

        def put(s: Session) -> store.JobRow | None:
            store.record_estimates(s, job_id=job_id, estimates=by_fp)
            store.mark_estimated(s, job_id=job_id, fingerprints=never)
            store.mark_pruned(s, job_id=job_id, fingerprints=skipped)
            store.refresh_progress(s, job_id=job_id)
            return store.get_job(s, job_id=job_id)

        job = self.ctx.store.patient("estimates", put)
        if self.ctx.phase.on_progress is not None:
            self.ctx.phase.on_progress(job, self.ctx.stats)

    def say(self, phase: str) -> None:
        """Best effort: the job row says which phase it is in."""
        job_id, owner = self.ctx.job_id, self.ctx.owner

        def put(s: Session) -> bool:
            return store.set_job_phase(s, job_id=job_id, owner=owner, phase=phase)

        self.ctx.store.best_effort("phase", put)
