"""The gate's rules, pure: a baseline plan, today's plan and today's measurements of the
baseline's stages in, one check per rule out, each with a one-line reason.

- memory: a stage of today's plan, or of the baseline's layout re-measured today, that no
  longer fits fails: under 1F1B Alpa's rule (`max_n_succ_stages` below the stages after
  it), under GPipe every micro-batch kept, under the other schedules the memory the
  planner predicts for its device group (`PlannedStage.schedule_memory`).
- iteration time: a slowdown beyond max(max_slowdown, the two plans' measured spreads added)
  fails; a move larger than the spread but within the tolerance is a note.
- FLOPs and peak memory per stage (deterministic: same program, same figure): growth beyond
  max_growth fails; any other move is a note.
- a changed layout or schedule is a note; a job without a plan is undecided (exit 2) unless
  a check that could still be made failed.
- only measurements decide: a baseline stage today's job did not measure (pruned, estimated
  only) is a note, and a stage of today's plan with estimated numbers is undecided.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from schemas import Plan, PlannedStage, StageProfileResult
from schemas.plan import percent, stage_layout


class Outcome(StrEnum):
    passed = "pass"
    note = "note"
    failed = "fail"
    undecided = "undecided"


class Figure(StrEnum):
    """What a check is about (JUnit classname suffix, Markdown grouping)."""

    plan = "plan"
    layout = "layout"
    memory = "memory"
    time = "iteration_time"
    flops = "flops"
    peak = "peak_memory"


FIGURE_NAMES = {Figure.flops: "FLOPs", Figure.peak: "peak memory"}
EXIT_PASS, EXIT_REGRESSION, EXIT_UNDECIDED = 0, 1, 2


@dataclass(frozen=True)
class Check:
    """One rule applied once: `reason` is one line naming the stage and the figure."""

    name: str
    figure: Figure
    outcome: Outcome
    reason: str
    stage: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "figure": self.figure.value,
            "outcome": self.outcome.value,
            "stage": self.stage,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Tolerances:
    """Fractions: 0.05 is 5%."""

    max_slowdown: float = 0.05
    max_growth: float = 0.02


@dataclass(frozen=True)
class Remeasured:
    """Today's measurement of one baseline stage (its range, submesh and config), or why
    there is none (`missing`: pruned, estimated only, pending, not a candidate of today's
    job). Never an estimate."""

    result: StageProfileResult | None = None
    missing: str | None = None


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]

    @property
    def exit_code(self) -> int:
        """1 when any check failed, else 2 when one could not be decided, else 0."""
        outcomes = {c.outcome for c in self.checks}
        if Outcome.failed in outcomes:
            return EXIT_REGRESSION
        if Outcome.undecided in outcomes:
            return EXIT_UNDECIDED
        return EXIT_PASS

    @property
    def label(self) -> str:
        return {EXIT_PASS: "pass", EXIT_REGRESSION: "fail", EXIT_UNDECIDED: "undecided"}[
            self.exit_code
        ]

    def counts(self) -> dict[str, int]:
        return {o.value: sum(c.outcome == o for c in self.checks) for o in Outcome}


def undecided(reason: str) -> Verdict:
    """A verdict that could not be reached at all (server down, baseline unreadable)."""
    return Verdict((Check("gate", Figure.plan, Outcome.undecided, reason),))


def human_bytes(n: float) -> str:
    """1.5 KiB, 12.0 MiB, 3.25 GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if abs(n) / size < 100 else f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"


def human_flops(n: float) -> str:
    """FLOPs with an SI prefix: 2.1 MFLOP, 3.4 GFLOP."""
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} FLOP"


def stage_label(stage: PlannedStage) -> str:
    """ "layers 0-1 on 1x2 as 2x1/data"."""
    return f"layers {stage.start}-{stage.end} on {stage.submesh} as {stage.config.label()}"


def schedule_label(plan: Plan) -> str:
    """ "1f1b", "interleaved (v=2)": plans stored before schedules were planned are 1f1b."""
    v = f" (v={plan.virtual_stages})" if plan.schedule_name == "interleaved" else ""
    return plan.schedule_name + v


def same_layout(a: Plan, b: Plan) -> bool:
    return stage_layout(a.stages) == stage_layout(b.stages)


def decide(
    baseline: Plan,
    today: Plan | None,
    remeasured: Sequence[Remeasured],
    tolerances: Tolerances,
    *,
    device_memory_bytes: int | None = None,
    job_error: str | None = None,
) -> Verdict:
    """Every check of today's run against the baseline.

    `remeasured[i]` is today's measurement of `baseline.stages[i]`; `today` is None when
    today's job ended without a plan (`job_error` says why).
    """
    if len(remeasured) != len(baseline.stages):
        raise ValueError("remeasured must have one entry per baseline stage")
    checks: list[Check] = []
    if today is None:
        checks.append(
            Check("plan", Figure.plan, Outcome.undecided, f"today's job has no plan: {job_error}")
        )
    else:
        checks.append(_layout_check(baseline, today))
        estimated = _estimated_checks(today)
        checks += estimated or _fit_checks(today, device_memory_bytes)
        if not estimated:
            checks.append(_time_check(baseline, today, tolerances))
    changed = today is None or not same_layout(baseline, today)
    if changed:
        checks += _baseline_fit_checks(baseline, remeasured)
    checks += _growth_checks(
        baseline, remeasured, tolerances, "baseline stage" if changed else "stage"
    )
    return Verdict(tuple(checks))


def _layout_check(baseline: Plan, today: Plan) -> Check:
    changes = []
    if baseline.num_layers != today.num_layers:
        changes.append(f"{baseline.num_layers} → {today.num_layers} layers")
    if baseline.num_devices != today.num_devices:
        changes.append(f"{baseline.num_devices} → {today.num_devices} devices")
    if baseline.num_microbatches != today.num_microbatches:
        changes.append(f"{baseline.num_microbatches} → {today.num_microbatches} micro-batches")
    if schedule_label(baseline) != schedule_label(today):
        changes.append(f"schedule {schedule_label(baseline)} → {schedule_label(today)}")
    if not same_layout(baseline, today):
        changes.append(f"stages {stage_layout(baseline.stages)} → {stage_layout(today.stages)}")
    if changes:
        return Check("layout", Figure.layout, Outcome.note, "layout changed: " + "; ".join(changes))
    return Check(
        "layout", Figure.layout, Outcome.passed, f"layout unchanged: {stage_layout(today.stages)}"
    )


def _estimated_checks(today: Plan) -> list[Check]:
    """Today's stages whose numbers are estimates (a job's plan is built from measured
    stages, so never expected): each undecided, and today's memory and time are not judged,
    so that a verdict never rests on an estimate."""
    return [
        Check(
            f"stage {i} measured",
            Figure.plan,
            Outcome.undecided,
            f"stage {i} ({stage_label(st)}) of today's plan was estimated, not measured: "
            "the gate does not judge estimates",
            stage=i,
        )
        for i, st in enumerate(today.stages)
        if not st.measured
    ]


def _memory_need(peak: int, params: int, stash: int, stashed: int, available: int | None) -> str:
    need = f"peak {human_bytes(peak)} + params {human_bytes(params)}"
    if stash:
        need += f" + {stashed} × stash {human_bytes(stash)}"
    total = human_bytes(peak + params + stashed * stash)
    of = f" of {human_bytes(available)}" if available else ""
    return f"{need} = {total}{of} per device"


def _fit_checks(today: Plan, device_memory_bytes: int | None) -> list[Check]:
    checks = []
    name = today.schedule_name
    for i, st in enumerate(today.stages):
        after = len(today.stages) - 1 - i
        kept = today.num_microbatches if name == "gpipe" else after + 1
        if name in ("1f1b", "gpipe") or st.schedule_memory is None:
            need = _memory_need(
                st.peak_memory, st.initial_var_size, st.intermediate_size, kept, device_memory_bytes
            )
            fits = st.max_n_succ_stages >= kept - 1
        else:
            of = f" of {human_bytes(device_memory_bytes)}" if device_memory_bytes else ""
            need = (
                f"{human_bytes(st.schedule_memory)}{of} per device of its device group, as "
                f"{schedule_label(today)} keeps its micro-batches"
            )
            fits = device_memory_bytes is None or st.schedule_memory <= device_memory_bytes
        verb = "fits" if fits else "no longer fits"
        checks.append(
            Check(
                f"stage {i} fits memory",
                Figure.memory,
                Outcome.passed if fits else Outcome.failed,
                f"stage {i} ({stage_label(st)}) {verb}: {need}",
                stage=i,
            )
        )
    return checks


def _baseline_fit_checks(baseline: Plan, remeasured: Sequence[Remeasured]) -> list[Check]:
    checks = []
    for i, (st, got) in enumerate(zip(baseline.stages, remeasured, strict=True)):
        name = f"baseline stage {i} fits memory"
        where = f"baseline stage {i} ({stage_label(st)})"
        after = len(baseline.stages) - 1 - i
        r = got.result
        if r is None:
            reason = f"{where} was not re-measured today ({got.missing}): its memory is unknown"
            checks.append(Check(name, Figure.memory, Outcome.note, reason, stage=i))
        elif r.status == "oom":
            why = f" ({r.error.splitlines()[0]})" if r.error else ""
            reason = f"{where} no longer fits: out of memory when measured today{why}"
            checks.append(Check(name, Figure.memory, Outcome.failed, reason, stage=i))
        elif not r.ok:
            reason = f"{where} could not be measured today: {r.status}: {r.error or ''}".rstrip()
            checks.append(Check(name, Figure.memory, Outcome.note, reason, stage=i))
        else:
            need = _memory_need(
                r.peak_memory,
                r.initial_var_size,
                r.intermediate_size,
                after + 1,
                r.available_memory,
            )
            fits = r.max_n_succ_stages >= after
            verb = "fits" if fits else "no longer fits"
            outcome = Outcome.passed if fits else Outcome.failed
            checks.append(Check(name, Figure.memory, outcome, f"{where} {verb}: {need}", stage=i))
    return checks


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _signed(fraction: float) -> str:
    return ("+" if fraction >= 0 else "-") + percent(abs(fraction))


def _time_check(baseline: Plan, today: Plan, tol: Tolerances) -> Check:
    before, after = baseline.predicted_iteration_time_s, today.predicted_iteration_time_s
    name = "iteration time"
    if before <= 0:
        return Check(
            name,
            Figure.time,
            Outcome.note,
            f"predicted iteration time {_ms(before)} → {_ms(after)}: the baseline's is 0, "
            "so no ratio",
        )
    change = after / before - 1
    spread = baseline.cost_spread + today.cost_spread
    allowed = max(tol.max_slowdown, spread)
    figures = f"predicted iteration time {_ms(before)} → {_ms(after)} ({_signed(change)})"
    if schedule_label(baseline) != schedule_label(today):
        figures += f" [{schedule_label(baseline)} → {schedule_label(today)}]"
    noise = f"measured spread {percent(spread)}"
    if change > allowed:
        reason = f"{figures}, beyond the {percent(tol.max_slowdown)} allowed and the {noise}"
        return Check(name, Figure.time, Outcome.failed, reason)
    if change > tol.max_slowdown:
        reason = f"{figures}: over {percent(tol.max_slowdown)} but within the {noise}"
        return Check(name, Figure.time, Outcome.note, reason)
    if abs(change) > spread:
        trend = "slower" if change > 0 else "faster"
        reason = f"{figures}: {trend} beyond the {noise}, within the tolerance"
        return Check(name, Figure.time, Outcome.note, reason)
    return Check(name, Figure.time, Outcome.passed, f"{figures}: within the {noise}")


def _growth_checks(
    baseline: Plan, remeasured: Sequence[Remeasured], tol: Tolerances, prefix: str
) -> list[Check]:
    """FLOPs and peak memory of each baseline stage, then and today; `prefix` names the
    stage ("baseline stage" when today's plan has other stages)."""
    checks = []
    for i, (st, got) in enumerate(zip(baseline.stages, remeasured, strict=True)):
        r = got.result
        if r is None or not r.ok:
            continue  # the memory check above says why
        name, where = f"{prefix} {i}", f"{prefix} {i} ({stage_label(st)})"
        figures = [
            (Figure.flops, "FLOPs per device", st.flops, r.flops, human_flops),
            (Figure.peak, "peak memory per device", st.peak_memory, r.peak_memory, human_bytes),
        ]
        for figure, what, before, after, fmt in figures:
            checks.append(
                _growth(
                    f"{name} {FIGURE_NAMES[figure]}",
                    i,
                    where,
                    figure,
                    what,
                    before,
                    after,
                    fmt,
                    tol,
                )
            )
    return checks


def _growth(
    name: str,
    i: int,
    where: str,
    figure: Figure,
    what: str,
    before: float,
    after: float,
    fmt: Callable[[float], str],
    tol: Tolerances,
) -> Check:
    if before <= 0:
        reason = (
            f"{where}: the baseline has no {what} (written by an older stageprof?); "
            f"today {fmt(after)}: refresh the baseline to compare it"
        )
        return Check(name, figure, Outcome.note, reason, stage=i)
    change = after / before - 1
    figures = f"{where}: {what} {fmt(before)} → {fmt(after)} ({_signed(change)})"
    if change > tol.max_growth:
        reason = f"{figures}, beyond the {percent(tol.max_growth)} allowed"
        return Check(name, figure, Outcome.failed, reason, stage=i)
    if change != 0:
        return Check(name, figure, Outcome.note, f"{figures}, within tolerance", stage=i)
    return Check(name, figure, Outcome.passed, f"{where}: {what} {fmt(after)}, unchanged", stage=i)
