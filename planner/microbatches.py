"""The number of micro-batches as a plan dimension, at a fixed global batch.

Each count B of `PlanOptions.microbatch_counts` runs micro-batches of global batch / B; its
stages are measured (or estimated from layer profiles) at that size, so its table, its
candidate space (a config's data-parallel size must divide the micro-batch size) and every
schedule's memory rule (the stash one micro-batch keeps, at that size) are its own. Each
count is planned as a fixed-count job plans it, and the simulator judges between them: the
answer is the fastest count's plan in simulated time, the others shown beside it
(`Plan.microbatch_options`).

`MicrobatchSearch` runs one estimate search (`planner.verify`) per count, round by round; a
count whose optimistic best (its estimates at the band's low end, with the provable bounds)
is slower than a plan of measured stages another count already has stops asking for
measurements: it cannot answer. In each round, a count whose optimistic best is further than
the band above the lowest asking count's waits (`deferred`): its stages are asked for only
once the counts ahead of it leave it a chance, so a count far behind is not measured in the
first round, before any count has a measured plan, only to be stopped in the second.

The counts calibrate one another: what longer stages cost beyond their layers (the length
law) and how far the estimates missed (the band) are learned at every count's size, and a
count with no longer stage measured yet uses the others' (`StageEstimator.peers`). Estimates
miss most at the sizes least like the others (one sample a micro-batch: the per-call
overheads), and the count whose estimates are the most optimistic would look best. So a
count not yet `self_calibrated` asks for one stage first, the costliest longer stage of its
best plan, beside the other counts' (`_narrow`): each is then judged on its own length law.

Of the counts asking in a round, the one with the lowest optimistic best (the lead) is
verified whole; the others are challengers: most lose, and the stage that decides a
pipeline's time can show it. A challenger asks for at most `CHALLENGE_STAGES` stages a
round, its best plan's of the highest estimates first, and is judged again (against the
lead's plan once that is measured) before it asks for more.
"""

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.errors import NoFeasiblePlan
from planner.table import Key, build_cost_table
from planner.verify import EstimateSearch
from schemas import MicrobatchOption, Plan, StageProfileResult
from schemas.plan import stage_layout

logger = logging.getLogger(__name__)

# stages a challenger (a count asking beside a lower one) asks for per round
CHALLENGE_STAGES = 2

# A count's plan, or why it has none.
CountPlan = Plan | str


def choose_count(plans: Mapping[int, CountPlan], global_batch: int) -> Plan:
    """The fastest plan in simulated time over the counts (ties: fewer micro-batches, each
    keeping more per stage but scheduling fewer ops), annotated with its micro-batch size and
    every count's best beside it. Raises `NoFeasiblePlan` when no count has a plan."""
    feasible = {b: p for b, p in plans.items() if isinstance(p, Plan)}
    if not feasible:
        why = "; ".join(f"{b} micro-batches: {p}" for b, p in sorted(plans.items()))
        raise NoFeasiblePlan(f"no count of micro-batches has a plan ({why})")
    chosen = min(
        feasible, key=lambda b: (float(f"{feasible[b].predicted_iteration_time_s:.12g}"), b)
    )
    options = []
    for b, plan in sorted(plans.items()):
        size = global_batch // b
        if isinstance(plan, str):
            options.append(
                MicrobatchOption(
                    num_microbatches=b, micro_batch_size=size, feasible=False, reason=plan
                )
            )
            continue
        options.append(
            MicrobatchOption(
                num_microbatches=b,
                micro_batch_size=size,
                feasible=True,
                predicted_iteration_time_s=plan.predicted_iteration_time_s,
                schedule=plan.schedule_name,
                layout=stage_layout(plan.stages),
                chosen=b == chosen,
            )
        )
    best = feasible[chosen]
    return best.model_copy(
        update={"micro_batch_size": global_batch // chosen, "microbatch_options": options}
    )


def _lowest(times: Mapping[int, float]) -> tuple[int, float] | None:
    """The count of the lowest finite time of `times` with it (ties: fewer micro-batches)."""
    finite = {b: t for b, t in times.items() if math.isfinite(t)}
    if not finite:
        return None
    best = min(finite, key=lambda b: (finite[b], b))
    return best, finite[best]


@dataclass
class MicrobatchSearch:
    """The estimate search of every count (see the module doc): `searches[B]` plans B
    micro-batches on its own space and measurements at its micro-batch size."""

    searches: dict[int, EstimateSearch]
    global_batch: int
    live: set[int] = field(init=False)
    # simulated time of a plan of measured stages only, per count that found one
    measured_best: dict[int, float] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    # counts that waited in the last round: their optimistic best, far above the lowest count's
    deferred: set[int] = field(default_factory=set)
    # counts that asked for part of their stages in the last round (`_narrow`)
    narrowed: set[int] = field(default_factory=set)
    # counts whose stages left in this round wait (`held_back`)
    held: set[int] = field(default_factory=set)
    rounds: int = 0
    # `beaten`'s figures: each count's (measurements they rest on, seconds)
    _optimistic: dict[int, tuple[int, float]] = field(default_factory=dict, repr=False)
    _measured: dict[int, tuple[int, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for b, search in self.searches.items():
            if search.options.num_microbatches != b:
                raise ValueError(f"the search of {b} micro-batches plans {search.options}")
        self.live = set(self.searches)
        for b, search in self.searches.items():
            search.estimator.peers = [s.estimator for c, s in self.searches.items() if c != b]

    def self_calibrated(self, count: int) -> bool:
        """Whether `count` has a longer stage measured at its own size (see the module doc)."""
        return bool(self.searches[count].estimator.length_samples())

    def add(self, count: int, keys: list[Key], result: StageProfileResult) -> None:
        """A result measured at count `count`'s micro-batch size."""
        self.searches[count].add(keys, result)

    def next_round(self) -> dict[int, list[Key]]:
        """The stages each count wants measured next; empty when every count is done."""
        self.rounds += 1
        self.held = set()
        wanted: dict[int, list[Key]] = {}
        for b in sorted(self.live):
            search = self.searches[b]
            keys = search.next_round()
            if keys:
                wanted[b] = keys
                continue
            self.live.discard(b)
            if search.stopped == "the best plan is measured" and search.best_time is not None:
                self.measured_best[b] = search.best_time
        bound = min(self.measured_best.values(), default=math.inf)
        for b in list(wanted):
            lower = self.searches[b].best_time
            if lower is not None and lower > bound:
                winner = min(self.measured_best, key=lambda c: self.measured_best[c])
                why = (
                    f"its best on estimates ({lower:.6g} s) is slower than the measured plan "
                    f"of {winner} micro-batches ({bound:.6g} s)"
                )
                logger.info("%d micro-batches: stopped: %s", b, why)
                self.dropped[b] = why
                self.live.discard(b)
                del wanted[b]
        self._defer(wanted)
        self._narrow(wanted)
        return wanted

    def measure_order(self, wanted: Mapping[int, list[Key]]) -> list[int]:
        """The counts of a round in the order their stages are measured: first those asking
        for their whole best plan, the fewest stages from a measured plan first (a measured
        plan is what stops the others: `beaten`), then the narrowed ones; the lowest
        optimistic best first among equals."""
        return sorted(
            wanted,
            key=lambda b: (
                b in self.narrowed,
                len(self.searches[b].best_unmeasured),
                math.inf if (t := self.searches[b].best_time) is None else t,
                b,
            ),
        )

    def not_now(self, count: int) -> bool:
        """Whether the stages `count` has left in this round are not measured now: it is
        `beaten` (stopped) or `held_back` (asked again next round if it still could be best)."""
        return self.beaten(count) or self.held_back(count)

    def held_back(self, count: int) -> bool:
        """Whether `count` waits for the rest of this round: `_defer`'s rule judged as the
        round's results come in (its optimistic best, on its estimates now, more than the
        band above the lowest of the other live counts'). Only delays, as `_defer` does."""
        if count in self.held:
            return True
        if count not in self.live:
            return False
        found = _lowest({c: self._optimistic_best(c) for c in self.live if c != count})
        if found is None:
            return False
        lead, low = found
        lower = self._optimistic_best(count)
        if not lower > low * (1.0 + self.searches[lead].band()):
            return False
        logger.info(
            "%d micro-batches: waits for the rest of the round: its best on estimates (%.6g s) "
            "is more than the band above that of %d micro-batches (%.6g s)",
            count,
            lower,
            lead,
            low,
        )
        self.held.add(count)
        return True

    def beaten(self, count: int) -> bool:
        """Whether `count` cannot answer on what is measured by now: `next_round`'s stop rule
        (its optimistic best, on its estimates now, slower than a plan of measured stages of
        another count), judged as a round's results come in, so that the rest of its round
        is not measured. A count beaten is stopped (`dropped`)."""
        if count in self.dropped:
            return True
        if count not in self.live:
            return False
        found = _lowest({c: self._measured_best(c) for c in self.searches if c != count})
        if found is None:
            return False
        winner, bound = found
        lower = self._optimistic_best(count)
        if not lower > bound:
            return False
        why = (
            f"its best on estimates ({lower:.6g} s) is slower than the measured plan of "
            f"{winner} micro-batches ({bound:.6g} s)"
        )
        logger.info("%d micro-batches: stopped in the round: %s", count, why)
        self.dropped[count] = why
        self.live.discard(count)
        return True

    def _optimistic_best(self, count: int) -> float:
        """`count`'s optimistic best on its estimates now (a count's estimates lean on the
        other counts' measurements: recomputed when any count's grow)."""
        seen = sum(len(s.measured) for s in self.searches.values())
        cached = self._optimistic.get(count)
        if cached is None or cached[0] != seen:
            search = self.searches[count]
            ranked = search.proposals(search.optimistic_table(search.point_table()))
            cached = (seen, ranked[0][1].time if ranked else math.inf)
            self._optimistic[count] = cached
        return cached[1]

    def _measured_best(self, count: int) -> float:
        """The simulated time of `count`'s fastest plan of measured stages (inf: none)."""
        search = self.searches[count]
        cached = self._measured.get(count)
        if cached is None or cached[0] != len(search.measured):
            table = build_cost_table(
                search.spec,
                search.cluster,
                search.space,
                search.measured,
                search.options.include_communication,
            )
            times = [p.time for _, p in search.proposals(table) if math.isfinite(p.time)]
            cached = (len(search.measured), min(times, default=math.inf))
            self._measured[count] = cached
        return cached[1]

    def _narrow(self, wanted: dict[int, list[Key]]) -> None:
        """Of each count's stages in `wanted` keep: one, where it is not `self_calibrated`;
        `CHALLENGE_STAGES`, where it is a challenger (another count asking has a lower
        optimistic best); all, for the lead, and for a count asking alone with no measured
        plan to be judged against. Its best plan's stages first, longer stages first, the
        highest estimates first; the rest are asked for again next round if it still could
        be best."""
        self.narrowed = set()
        if len(wanted) < 2 and not self.measured_best:
            return
        known = self._optimistic_bests(wanted)
        calibrated = {b for b in wanted if self.self_calibrated(b)}
        ready = [b for b in known if b in calibrated]
        lead = min(ready, key=lambda b: (known[b], b)) if ready else None
        for b, keys in wanted.items():
            if b == lead:
                continue
            keep = CHALLENGE_STAGES if b in calibrated else 1
            if len(keys) <= keep:
                continue
            search = self.searches[b]
            best, chosen = set(search.best_unmeasured), search.estimated_at_choice
            ranked = sorted(
                keys, key=lambda k: (k not in best, k[1] - k[0] < 2, -chosen.get(k, math.inf))
            )
            logger.info(
                "%d micro-batches: %s: %d of its %d stages first",
                b,
                "a challenger" if keep == CHALLENGE_STAGES else "to calibrate",
                keep,
                len(keys),
            )
            wanted[b] = ranked[:keep]
            self.narrowed.add(b)

    def _optimistic_bests(self, wanted: Mapping[int, list[Key]]) -> dict[int, float]:
        """The optimistic best (`EstimateSearch.best_time`) of each count in `wanted` that
        has one."""
        return {b: t for b in wanted if (t := self.searches[b].best_time) is not None}

    def _defer(self, wanted: dict[int, list[Key]]) -> None:
        """Hold back from `wanted` the counts whose optimistic best is above the lowest
        count's by more than that count's band; their searches take this round back (they
        measured nothing) and ask again next round, judged against the plans measured by
        then. Only delays: a held-back count is never stopped here."""
        self.deferred = set()
        known = self._optimistic_bests(wanted)
        if len(known) < 2:
            return
        lead = min(known, key=lambda b: (known[b], b))
        limit = known[lead] * (1.0 + self.searches[lead].band())
        for b, low in known.items():
            if b == lead or low <= limit:
                continue
            logger.info(
                "%d micro-batches: waits: its best on estimates (%.6g s) is more than the "
                "band above that of %d micro-batches (%.6g s)",
                b,
                low,
                lead,
                known[lead],
            )
            self.deferred.add(b)
            self.searches[b].rounds -= 1
            del wanted[b]

    def plans(self) -> dict[int, CountPlan]:
        """Each count's plan (see `EstimateSearch.plan`), or why it has none."""
        out: dict[int, CountPlan] = {}
        for b, search in sorted(self.searches.items()):
            try:
                out[b] = search.plan()
            except NoFeasiblePlan as e:
                out[b] = self.why_no_plan(b, e)
        return out

    def why_no_plan(self, count: int, err: NoFeasiblePlan) -> str:
        """Why `count` has no plan of measured stages: stopped early (`dropped`), or `err`."""
        why = self.dropped.get(count)
        return f"not measured further: {why}" if why else str(err)

    def plan(self) -> Plan:
        """The fastest count's plan (`choose_count`)."""
        return choose_count(self.plans(), self.global_batch)
