"""Plan on estimates, measure where it decides, stop when the best plan is measured.

Round after round (`EstimateSearch.next_round`): every unmeasured stage is assumed at its
optimistic bound, the larger of `(1 - band) x` its estimate and the provable lower bound of
its measured sub-ranges (`planner.prune`); each schedule's search runs on that table. When
the fastest plan found consists of measured stages only, no plan with an unmeasured stage
can beat it by more than the band: the search stops. Otherwise the unmeasured stages of that
plan (and of the plans within the band of it) are what to measure next.

The band is learned in the job: the relative errors |estimate - measured| / measured of the
measured longer stages, each estimated from every other measurement (held out); the band is
their upper quartile (a prior until three are known), never under `MIN_BAND`. The error the
job reports is the honest one: each stage's estimate when it was chosen, against its
measurement.
"""

import logging
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from planner.candidates import CandidateSpace
from planner.estimate import StageEstimator, is_layer_profile, relative_error, scaled
from planner.plan import AUTO_ORDER, build_plan, config_ranks
from planner.prune import range_lower_bounds
from planner.search import Proposal, search_schedule
from planner.table import Key, build_cost_table
from schemas import (
    ClusterSpec,
    ModelSpec,
    Plan,
    PlannedStage,
    PlanOptions,
    SearchSummary,
    StageProfileResult,
)

logger = logging.getLogger(__name__)

PRIOR_BAND = 0.15  # the band before three stages were measured after being estimated
MIN_BAND = 0.03
MAX_ROUNDS = 24
NEW_PER_ROUND = 6  # most stages of plans within the band beside the best one's, per round


@dataclass
class EstimateSearch:
    """The estimate-then-measure search of one job (see the module doc)."""

    spec: ModelSpec
    cluster: ClusterSpec
    options: PlanOptions
    space: CandidateSpace
    estimator: StageEstimator = field(init=False)
    # the point estimate of forward + backward a stage had when it was chosen for measuring
    estimated_at_choice: dict[Key, float] = field(default_factory=dict)
    rounds: int = 0
    stopped: str = ""

    def __post_init__(self) -> None:
        classes: dict[str, int] = {}
        layer_classes = [classes.setdefault(x.fingerprint, len(classes)) for x in self.spec.layers]
        self.estimator = StageEstimator(self.space, self.cluster.device_memory_bytes, layer_classes)

    @property
    def measured(self) -> dict[Key, StageProfileResult]:
        return self.estimator.results

    def add(self, keys: Iterable[Key], result: StageProfileResult) -> None:
        """A measured result for every candidate key that shares its fingerprint."""
        for key in keys:
            self.estimator.add(key, result)

    def errors(self) -> list[float]:
        """Relative errors of the stages measured after being estimated (ok ones)."""
        out = []
        for key, est in self.estimated_at_choice.items():
            result = self.measured.get(key)
            if result is not None and result.ok:
                out.append(relative_error(est, result.compute_cost))
        return [e for e in out if math.isfinite(e)]

    def band(self) -> float:
        """How far below its estimate an unmeasured stage may be: the upper quartile of the
        held-out errors of the measured longer stages (each estimated from all the others),
        the prior until three are known, never under MIN_BAND."""
        errors = self.estimator.held_out_errors()
        if len(errors) < 3:
            return max(PRIOR_BAND, max(errors, default=0.0))
        return max(MIN_BAND, float(np.quantile(errors, 0.75)))

    def estimates(self, keys: Iterable[Key] | None = None) -> dict[Key, StageProfileResult]:
        """Point estimates of every unmeasured candidate that can be estimated."""
        wanted = [k.as_tuple() for k in self.space.keys] if keys is None else list(keys)
        return self.estimator.estimate_all(wanted)

    def optimistic(self) -> dict[Key, StageProfileResult]:
        """Measured results and, for the rest, each estimate at its optimistic bound."""
        estimates = self.estimates()
        measured = self.measured
        table = build_cost_table(self.spec, self.cluster, self.space, measured)
        known = np.where(np.isfinite(table.compute_cost), table.compute_cost, 0.0)
        bounds = range_lower_bounds(known)
        factor = 1.0 - self.band()
        out: dict[Key, StageProfileResult] = dict(measured)
        for key, est in estimates.items():
            t = est.compute_cost
            f = max(factor, float(bounds[key]) / t) if t > 0 else factor
            out[key] = scaled(est, f)
        return out

    def proposals(self, results: Mapping[Key, StageProfileResult]) -> list[Proposal]:
        """Every schedule's proposals on these results, fastest first."""
        table = build_cost_table(
            self.spec, self.cluster, self.space, results, self.options.include_communication
        )
        ranks = config_ranks(self.space)
        names = AUTO_ORDER if self.options.schedule == "auto" else (self.options.schedule,)
        found: list[Proposal] = []
        for name in names:
            search = search_schedule(
                name,
                table,
                self.space,
                self.cluster.num_devices,
                self.options.num_microbatches,
                ranks,
                self.options.virtual_stages,
            )
            found.extend(search.ranked)
        return sorted(found, key=lambda p: p.time)

    def next_round(self) -> list[Key]:
        """The stages to measure next; empty when the search is done (see the module doc)."""
        if self.rounds >= MAX_ROUNDS:
            self.stopped = f"stopped after {MAX_ROUNDS} rounds"
            return []
        self.rounds += 1
        ranked = self.proposals(self.optimistic())
        if not ranked:
            self.stopped = "no plan is feasible on the estimates"
            return []
        best = ranked[0]
        wanted = self._unmeasured(best.keys)
        if not wanted:
            self.stopped = "the best plan is measured"
            self.rounds -= 1  # this round measured nothing
            return []
        limit = best.time * (1.0 + self.band())
        for other in ranked[1:]:
            if other.time > limit or len(wanted) >= len(best.keys) + NEW_PER_ROUND:
                break
            wanted += [k for k in self._unmeasured(other.keys) if k not in wanted]
        point = self.estimates(wanted)
        for key in wanted:
            if key in point:
                self.estimated_at_choice[key] = point[key].compute_cost
        logger.info(
            "round %d: best %.6g s (%d of %d stages unmeasured), measuring %d, band %.3f",
            self.rounds,
            best.time,
            len(self._unmeasured(best.keys)),
            len(best.keys),
            len(wanted),
            self.band(),
        )
        return wanted

    def _unmeasured(self, keys: Iterable[Key]) -> list[Key]:
        return [k for k in keys if k not in self.measured]

    def plan(self) -> Plan:
        """The plan: the fastest of measured stages; baselines and runner-up may hold
        estimated stages (marked). Annotated with each stage's estimate and the summary."""
        measured = {k: r for k, r in self.measured.items()}
        point = self.estimates()
        plan = build_plan(self.spec, self.cluster, self.options, self.space, {**measured, **point})
        if any(_key(st) not in measured for st in plan.stages):
            logger.info("the best plan on the estimates holds an unmeasured stage: measured only")
            plan = build_plan(self.spec, self.cluster, self.options, self.space, measured)
        return self._annotate(plan, point)

    def _annotate(self, plan: Plan, point: Mapping[Key, StageProfileResult]) -> Plan:
        def mark(stages: list[PlannedStage]) -> list[PlannedStage]:
            out = []
            for st in stages:
                key = _key(st)
                est = self.estimated_at_choice.get(key)
                if key in point:
                    est = point[key].compute_cost
                out.append(
                    st.model_copy(
                        update={"measured": key in self.measured, "estimated_cost_s": est}
                    )
                )
            return out

        runner_up = plan.runner_up
        if runner_up is not None:
            runner_up = runner_up.model_copy(update={"stages": mark(runner_up.stages)})
        baselines = [b.model_copy(update={"stages": mark(b.stages)}) for b in plan.baselines]
        return plan.model_copy(
            update={
                "stages": mark(plan.stages),
                "runner_up": runner_up,
                "baselines": baselines,
                "search": self.summary(point),
            }
        )

    def summary(self, point: Mapping[Key, StageProfileResult] | None = None) -> SearchSummary:
        """What the search measured and how good its estimates were (distinct stages are
        counted once per submesh and config and range)."""
        point = self.estimates() if point is None else point
        errors = self.errors()
        measured = [k for k, r in self.measured.items()]
        return SearchSummary(
            mode="estimate",
            layer_profiles=sum(1 for k in measured if is_layer_profile(k)),
            verified=sum(1 for k in measured if not is_layer_profile(k)),
            estimated=len(point),
            rounds=self.rounds,
            estimate_error_median=statistics.median(errors) if errors else None,
            estimate_error_max=max(errors) if errors else None,
            error_band=self.band(),
            compared=len(errors),
        )


def _key(stage: PlannedStage) -> Key:
    return (stage.start, stage.end, stage.submesh_id, stage.config_id)
