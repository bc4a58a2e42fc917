"""Plan on estimates, measure where it decides, stop when the best plan is measured.

Round after round (`EstimateSearch.next_round`): every unmeasured stage is assumed at its
optimistic bound, the larger of `(1 - band) x` its estimate and the provable lower bound of
its measured sub-ranges (`planner.prune`); each schedule's search runs on that table. When
the fastest plan found consists of measured stages only, no plan with an unmeasured stage
can beat it by more than the band: the search stops. Otherwise the unmeasured stages of that
plan (and of the plans within the band of it) are what to measure next.

The band is learned in the job: the relative errors |estimate - measured| / measured of the
measured longer stages, each estimated from every other measurement (held out); the band is
their upper quartile (with the other counts' while fewer than three are known, in a job that
searches counts of micro-batches; a prior until three are known), never under `MIN_BAND`.
The error the job reports is the honest one: each stage's estimate when it was chosen,
against its measurement.
"""

import dataclasses
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.candidates import CandidateSpace
from planner.estimate import StageEstimator, relative_error
from planner.estimate_table import EstimatedTable, estimated_table
from planner.layer_profiles import REFERENCE, on_demand_profiles
from planner.outside import search_with_outside
from planner.plan import AUTO_ORDER, build_plan, config_ranks
from planner.prune import range_lower_bounds
from planner.search import Proposal
from planner.split_estimate import is_split, split_ratios, with_split_estimates
from planner.table import CostTable, Key, build_cost_table
from planner.trainers import maxtext_search, maxtext_space
from planner.verify_report import annotated, stage_key
from schemas import (
    ClusterSpec,
    ModelSpec,
    Plan,
    PlanOptions,
    StageProfileResult,
)

logger = logging.getLogger(__name__)

PRIOR_BAND = 0.15  # the band before three stages were measured after being estimated
MIN_BAND = 0.03
MAX_ROUNDS = 24
NEW_PER_ROUND = 2  # most stages of plans within the band beside the best one's, per round


@dataclass
class EstimateSearch:
    """The estimate-then-measure search of one job (see the module doc)."""

    spec: ModelSpec
    cluster: ClusterSpec
    options: PlanOptions
    space: CandidateSpace
    # stages on every device estimated by scaling: the whole model (planner.with_layer_profiles)
    # and the layers outside the pipeline (planner.outside)
    scaled: frozenset[Key] = frozenset()
    estimator: StageEstimator = field(init=False)
    # the point estimate of forward + backward a stage had when it was chosen for measuring
    estimated_at_choice: dict[Key, float] = field(default_factory=dict)
    rounds: int = 0
    stopped: str = ""
    # the simulated time of the last round's best plan on the optimistic table (a plan of
    # measured stages when the search stopped on one); None: no round found a plan
    best_time: float | None = None
    # the stages of that plan not measured (or measured without the split it needs)
    best_unmeasured: list[Key] = field(default_factory=list)
    # stages the job decided not to measure (e.g. remat variants where memory is ample):
    # neither estimated nor planned with
    skipped: set[Key] = field(default_factory=set)
    # |prior - measured| / measured of forward + backward of each layer profile measured
    # after being estimated at other micro-batch sizes (`add_prior`)
    prior_errors: dict[Key, float] = field(default_factory=dict)
    # stages may be measured without the backward split (`schedule: auto`): their split, and
    # every estimated stage's, is estimated (`planner.split_estimate`), and measured when a
    # zero-bubble plan that could be best rests on it
    split_on_demand: bool = False
    # stages measured without the split, then with it (`split_on_demand`)
    split_later: set[Key] = field(default_factory=set)

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
            if self.needs_split(key) and is_split(result):
                self.split_later.add(key)
            prior = self.estimator.priors.get(key)
            if prior is not None and result.ok:
                error = relative_error(prior.compute_cost, result.compute_cost)
                if math.isfinite(error):
                    self.prior_errors[key] = error
            self.estimator.add(key, result)

    def add_prior(self, keys: Iterable[Key], result: StageProfileResult) -> None:
        """A layer profile estimated elsewhere (at other micro-batch sizes:
        `planner.batch_profiles`) for every key of its fingerprint: planned with as an
        estimate, measured where a plan that could be best rests on it."""
        for key in keys:
            if key not in self.measured:
                self.estimator.add(key, result, prior=True)

    def needs_split(self, key: Key) -> bool:
        """A stage measured without the split that a zero-bubble plan would need it of."""
        result = self.measured.get(key)
        return self.split_on_demand and result is not None and result.ok and not is_split(result)

    def errors(self) -> list[float]:
        """Relative errors of the stages measured after being estimated (ok ones)."""
        out = []
        for key, est in self.estimated_at_choice.items():
            if key in self.scaled:  # scaled, not estimated from layer profiles
                continue
            result = self.measured.get(key)
            if result is not None and result.ok:
                out.append(relative_error(est, result.compute_cost))
        return [e for e in out if math.isfinite(e)]

    def band(self) -> float:
        """How far below its estimate an unmeasured stage may be: the upper quartile of the
        held-out errors of the measured longer stages (each estimated from all the others),
        never under MIN_BAND; until three are known, of those with the other counts' (the
        estimator's `peer_errors`: the same estimates at other micro-batch sizes) and at
        least its own worst, and while fewer than three are known in all, the prior or its
        own worst; at least the upper quartile of the `prior_errors` once three are known."""
        errors = self.estimator.held_out_errors()
        if len(errors) < 3:
            pooled = errors + self.estimator.peer_errors()
            if len(pooled) < 3:
                band = max(PRIOR_BAND, max(errors, default=0.0))
            else:
                quartile = float(np.quantile(pooled, 0.75))
                band = max(MIN_BAND, quartile, max(errors, default=0.0))
        else:
            band = max(MIN_BAND, float(np.quantile(errors, 0.75)))
        priors = list(self.prior_errors.values())
        if len(priors) >= 3:  # layer profiles from other sizes, measured: their own error
            band = max(band, float(np.quantile(priors, 0.75)))
        return band

    def skip(self, keys: Iterable[Key]) -> None:
        """Stages the job will not measure: never estimated, so never asked for."""
        self.skipped.update(keys)

    def candidates(self) -> set[Key]:
        return {k.as_tuple() for k in self.space.keys} - self.skipped

    def point_table(self) -> EstimatedTable:
        """Measured results and every other candidate's estimate, as a cost table."""
        measured = build_cost_table(
            self.spec, self.cluster, self.space, self.measured, self.options.include_communication
        )
        point = estimated_table(
            self.estimator,
            measured,
            self.candidates(),
            self.spec.num_layers,
            frozenset(self.scaled - self.skipped),
        )
        if not self.split_on_demand:
            return point
        unsplit = {k for k in self.measured if self.needs_split(k)} | set(point.estimated)
        table = with_split_estimates(point.table, unsplit, split_ratios(self.measured.values()))
        return dataclasses.replace(point, table=table, split_estimated=frozenset(unsplit))

    def point_costs(self, point: EstimatedTable | None = None) -> dict[Key, float]:
        """forward + backward of every estimated (unmeasured) candidate."""
        point = self.point_table() if point is None else point
        total = point.table.forward + point.table.backward
        return {k: float(total[k]) for k in point.estimated}

    def optimistic_table(self, point: EstimatedTable) -> CostTable:
        """Each estimated stage's times at its optimistic bound: the larger of (1 - band) x
        its estimate and the largest measured time of a sub-range (provable); a measured
        stage's estimated split (`split_on_demand`) at (1 - band) x its estimate."""
        table = point.table
        band = self.band()
        measured_cost = np.where(np.isfinite(table.compute_cost), table.compute_cost, 0.0)
        mask = np.zeros(table.forward.shape, dtype=bool)
        for key in point.estimated:
            mask[key] = True
        measured_cost = np.where(mask, 0.0, measured_cost)
        bounds = range_lower_bounds(measured_cost)
        est = np.where(mask, table.compute_cost, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.maximum(1.0 - band, np.where(est > 0, bounds / est, 0.0))
        factor = np.where(mask, np.minimum(factor, 1.0e6), 1.0)
        split_factor = factor.copy()
        for key in point.split_estimated - point.estimated:  # measured, its split estimated
            split_factor[key] = 1.0 - band
        return dataclasses.replace(
            table,
            forward=table.forward * factor,
            backward=table.backward * factor,
            input_grad=table.input_grad * split_factor,
            weight_grad=table.weight_grad * split_factor,
        )

    def proposals(self, table: CostTable) -> list[tuple[str, Proposal]]:
        """Every schedule's proposals on this table with the schedule's name, fastest first."""
        ranks = config_ranks(self.space)
        names = AUTO_ORDER if self.options.schedule == "auto" else (self.options.schedule,)
        found: list[tuple[str, Proposal]] = []
        for name in names:
            search = search_with_outside(
                name,
                self.spec,
                table,
                self.space,
                self.cluster.num_devices,
                self.options.num_microbatches,
                ranks,
                self.options.virtual_stages,
                self.options.allows_outside,
            )
            found.extend((name, p) for p in search.ranked)
        return sorted(found, key=lambda t: t[1].time)

    def next_round(self) -> list[Key]:
        """The stages to measure next; empty when the search is done (see the module doc).
        With `target: maxtext` the best MaxText plan (`planner.trainers.maxtext_space`) is
        verified the same way, beside the unrestricted one."""
        if self.rounds >= MAX_ROUNDS:
            self.stopped = f"stopped after {MAX_ROUNDS} rounds"
            return []
        self.rounds += 1
        own_pairs = self._pairs_without_reference()
        if own_pairs:
            logger.info(
                "round %d: %d pairs the reference failed, measured", self.rounds, len(own_pairs)
            )
            return own_pairs
        point = self.point_table()
        optimistic = self.optimistic_table(point)
        ranked = self.proposals(optimistic)
        restricted = self._maxtext_ranked(optimistic)
        if not ranked and not restricted:
            self.stopped = "no plan is feasible on the estimates"
            return []
        self.best_time = ranked[0][1].time if ranked else None
        plans = [
            (p.time, [*p.keys, *p.outside], p.keys if name == "zb-h1" else []) for name, p in ranked
        ]
        self.best_unmeasured = self._unmeasured(*plans[0][1:]) if plans else []
        wanted = self._to_verify(plans)
        wanted += [
            k for k in self._to_verify([(t, ks, []) for t, ks in restricted]) if k not in wanted
        ]
        if not wanted:
            self.stopped = "the best plan is measured"
            if self.options.target == "maxtext":
                self.stopped = "the best plan and the best MaxText plan are measured"
            self.rounds -= 1  # this round measured nothing
            return []
        costs = self.point_costs(point)
        for key in wanted:
            if key in costs:
                self.estimated_at_choice[key] = costs[key]
        logger.info(
            "round %d: best %.6g s, MaxText's %.6g s, measuring %d, band %.3f",
            self.rounds,
            ranked[0][1].time if ranked else math.inf,
            restricted[0][0] if restricted else math.inf,
            len(wanted),
            self.band(),
        )
        return wanted

    def _pairs_without_reference(self) -> list[Key]:
        """The unmeasured adjacent pairs of every submesh and config at a boundary whose
        pair failed on the `REFERENCE` (two layers that do not fit one device): with no
        boundary to borrow, each measures its own, as every pair was before."""
        failed = {
            k[0]
            for k, r in self.measured.items()
            if k[2:] == REFERENCE and k[1] == k[0] + 1 and not r.ok
        }
        classes = self.estimator.layer_classes
        return sorted(
            k
            for k in self.candidates()
            if k[0] in failed
            and k[1] == k[0] + 1
            and classes[k[0]] != classes[k[1]]
            and k not in self.measured
        )

    def _to_verify(self, ranked: Sequence[tuple[float, list[Key], list[Key]]]) -> list[Key]:
        """The unmeasured stages of the fastest plan of `ranked` (time, stages, the stages
        whose split it needs; fastest first) and, while it has any, of the plans within the
        band of it (a few more)."""
        if not ranked:
            return []
        best_time, best_keys, best_split = ranked[0]
        wanted = self._unmeasured(best_keys, best_split)
        if not wanted:
            return []
        limit = best_time * (1.0 + self.band())
        cap = len(wanted) + NEW_PER_ROUND
        for time, keys, split in ranked[1:]:
            if time > limit or len(wanted) >= cap:
                break
            wanted += [k for k in self._unmeasured(keys, split) if k not in wanted]
        return wanted

    def _maxtext_ranked(self, table: CostTable) -> list[tuple[float, list[Key]]]:
        """The MaxText plans of `table` (target maxtext only), fastest first: their time and
        the stages it rests on (chunks and the outside layers' one-layer stages)."""
        if self.options.target != "maxtext":
            return []
        found = maxtext_space(
            self.spec, self.cluster, self.space, table, self.options.num_microbatches
        )
        return [(c.time, found.keys_of(c)) for c in found.ranked]

    def _unmeasured(self, keys: Iterable[Key], split: Iterable[Key] = ()) -> list[Key]:
        """The stages of `keys` not measured, and those of `split` measured without the
        split (`needs_split`); for a scaled whole-model stage with layers to measure on
        demand (`on_demand_profiles`), those of its layers not measured instead."""
        needs = {k for k in split if self.needs_split(k)}
        out: list[Key] = []
        for key in keys:
            if key in self.measured and key not in needs:
                continue
            first = [k for k in on_demand_profiles(key, self.scaled) if k not in self.measured]
            out += [k for k in first or [key] if k not in out]
        return out

    def plan(self) -> Plan:
        """The plan: the fastest of measured stages; baselines and runner-up may hold
        estimated stages (marked). Annotated with each stage's estimate and the summary.
        The MaxText plan (target maxtext) is made of measured stages too."""
        point = self.point_table()
        plan = build_plan(self.spec, self.cluster, self.options, self.space, {}, table=point.table)
        unsplit = plan.schedule_name == "zb-h1" and any(
            self.needs_split(stage_key(st)) for st in plan.stages
        )
        stages = [*plan.stages, *plan.outside]
        if unsplit or any(stage_key(st) not in self.measured for st in stages):
            logger.info("the best plan on the estimates holds an unmeasured stage: measured only")
            plan = build_plan(self.spec, self.cluster, self.options, self.space, self.measured)
        elif self.options.target == "maxtext" and self._unmeasured(
            next(iter(self._maxtext_ranked(point.table)), (0.0, []))[1]
        ):
            logger.info("the best MaxText plan on the estimates holds an unmeasured stage")
            measured = build_cost_table(
                self.spec,
                self.cluster,
                self.space,
                self.measured,
                self.options.include_communication,
            )
            maxtext = maxtext_search(
                self.spec,
                self.cluster,
                self.space,
                measured,
                self.options.num_microbatches,
                plan.stages,
                plan.predicted_iteration_time_s,
                plan.schedule_name,
            )
            plan = plan.model_copy(update={"maxtext": maxtext})
        return annotated(self, plan, self.point_costs(point))
