"""`stageprof gate`: plan a model (on a server or embedded) and compare the plan with a
committed baseline plan; the exit code is the CI verdict. The rules are in cli/gate/."""

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.commands.trainer_output import print_trainer, trainer_json
from cli.commands.zoo_args import load_model, one_line, parse_overrides
from cli.gate.baseline import BaselineError, read_baseline, write_baseline
from cli.gate.recost import measure_baseline
from cli.gate.reports import GateResult, junit_xml, markdown
from cli.gate.source import (
    GateError,
    TodayRun,
    describe_model,
    load_entry,
    load_spec_file,
    model_source,
)
from cli.gate.verdict import Check, Figure, Outcome, Tolerances, Verdict, decide
from schemas import ClusterSpec, ModelSpec, Plan, PlanOptions, PlanRequest, ZooRef
from schemas.plan import stage_layout

if TYPE_CHECKING:
    from rich.console import Console

EPILOG = """\
exit codes:
  0  pass: every check passed (notes, e.g. a changed layout, do not fail the gate)
  1  regression: a stage no longer fits device memory, the predicted iteration time rose
     beyond --max-slowdown and the measured spread, or a stage's FLOPs or peak memory
     grew beyond --max-growth
  2  could not decide: bad arguments, an unreadable baseline, the server unreachable or
     refusing the request, today's job failed or timed out (one line on stderr says which)

The baseline is a plan JSON: written by `stageprof gate --write-baseline FILE` (or
`stageprof plan --json > FILE`), committed, and refreshed on purpose when a change is meant
to alter the plan. Today's job is asked to measure the baseline's stages (whatever its
search decides), and the verdict rests on those measurements, never on an estimate.
"""


class _NoHelpParser(argparse.ArgumentParser):
    """A parser without -h, usable as a parent of one that has it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(add_help=False, **kwargs)


def _plan_parser() -> argparse.ArgumentParser:
    """`stageprof plan`'s own parser (built apart, without -h): the gate takes every flag of
    it as a parent, so the two commands cannot drift apart."""
    from cli.commands import plan

    sub = argparse.ArgumentParser(add_help=False).add_subparsers(parser_class=_NoHelpParser)
    plan.register(sub)
    return sub.choices["plan"]


def fraction(text: str) -> float:
    """ "5%" → 0.05, "0.05" → 0.05 (argparse type)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a percentage like 5% or a fraction like 0.05, got {text!r}"
        ) from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite value of at least 0%, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "gate",
        parents=[_plan_parser()],
        help="plan a model and compare with a baseline plan (CI exit codes 0/1/2)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--entry", metavar="MODULE:FUNCTION", help="a function returning a traced ModelSpec"
    )
    parser.add_argument("--baseline", type=Path, help="the committed baseline plan JSON")
    parser.add_argument(
        "--write-baseline", type=Path, metavar="FILE", help="write today's plan as a baseline"
    )
    parser.add_argument(
        "--max-slowdown",
        type=fraction,
        default=0.05,
        help="fail when the predicted iteration time rises more than this and more than the "
        "measured spread (default 5%%)",
    )
    parser.add_argument(
        "--max-growth",
        type=fraction,
        default=0.02,
        help="fail when a stage's FLOPs or peak memory grow more than this (default 2%%)",
    )
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write a JUnit XML report")
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="FILE",
        help="write a Markdown summary (also appended to $GITHUB_STEP_SUMMARY when set)",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="let today's job run its search (PlanOptions.search, estimate by default: "
        "faster) instead of measuring every candidate; it still measures the baseline's "
        "stages. Default: measure every candidate",
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=3600.0,
        help="seconds to wait for today's job on --server (default 3600)",
    )
    # A gate names its model: no default zoo model (plan's is gpt).
    parser.set_defaults(func=run, zoo=None)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from cli.gate.verdict import undecided

    console = Console(stderr=args.json, highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)
    started = time.monotonic()
    try:
        result = _gate(args, console)
    except GateError as err:
        print(f"stageprof gate: {err}", file=sys.stderr)
        result = GateResult(
            verdict=undecided(str(err)), subject=_subject(args), properties=_properties(args)
        )
    else:
        _print_checks(console, result)
    result = dataclasses.replace(result, wall_seconds=time.monotonic() - started)
    _write_reports(args, result)
    if args.json:
        _print_json(result)
    return result.verdict.exit_code


def _subject(args: argparse.Namespace) -> str:
    where = args.server or "embedded"
    cluster = f"{args.hosts}x{args.devices_per_host} {args.device_kind}"
    return f"{describe_model(args)} on {cluster} ({where})"


def _properties(args: argparse.Namespace) -> dict[str, str]:
    return {
        "server": args.server or "embedded",
        "baseline": str(args.baseline or ""),
        "max_slowdown": f"{args.max_slowdown:g}",
        "max_growth": f"{args.max_growth:g}",
    }


def _gate(args: argparse.Namespace, console: "Console") -> GateResult:
    """Read the baseline, run today's job, decide; GateError when it cannot."""
    source = model_source(args)
    if args.baseline is None and args.write_baseline is None:
        raise GateError("give --baseline FILE to compare with, or --write-baseline FILE")
    cluster, options = _request_parts(args)
    baseline = None
    if args.baseline is not None:
        try:
            baseline = read_baseline(args.baseline)
        except BaselineError as err:
            raise GateError(str(err)) from err
    today = _run_today(args, source, cluster, options, baseline, console)
    if baseline is not None:
        verdict = decide(
            baseline,
            today.plan,
            today.remeasured,
            Tolerances(max_slowdown=args.max_slowdown, max_growth=args.max_growth),
            device_memory_bytes=cluster.device_memory_bytes,
            job_error=today.error,
        )
    elif today.plan is None:
        raise GateError(str(today.error))
    else:
        reason = f"wrote {args.write_baseline}: {stage_layout(today.plan.stages)}"
        verdict = Verdict((Check("baseline written", Figure.plan, Outcome.passed, reason),))
    if args.write_baseline is not None and today.plan is not None:
        written_by = {"model": _subject(args), "argv": sys.argv[1:]}
        write_baseline(args.write_baseline, today.plan, job_id=today.job_id, source=written_by)
    return GateResult(
        verdict=verdict,
        baseline=baseline,
        today=today.plan,
        remeasured=today.remeasured,
        job_id=today.job_id,
        subject=_subject(args),
        properties=_properties(args),
        stats=today.stats,
    )


def _request_parts(args: argparse.Namespace) -> tuple[ClusterSpec, PlanOptions]:
    from pydantic import ValidationError

    from cli.commands.plan import _request_parts as plan_request_parts

    try:
        cluster, options = plan_request_parts(args)
        options = options.model_copy(update={"prune": args.prune})
        if args.zoo is not None:
            parse_overrides(args.overrides)
    except (ValidationError, ValueError) as err:
        raise GateError(one_line(err)) from err
    return cluster, options


def _run_today(
    args: argparse.Namespace,
    source: str,
    cluster: ClusterSpec,
    options: PlanOptions,
    baseline: Plan | None,
    console: "Console",
) -> TodayRun:
    """Today's job, asked to measure the baseline's stages (`recost.measure_baseline`)."""
    stages = baseline.stages if baseline is not None else []

    def say(line: str) -> None:
        console.print(f"stageprof gate: {line}", markup=False, soft_wrap=True)

    def load_spec() -> ModelSpec:
        if source == "entry":
            return load_entry(args.entry)
        if source == "model":
            return load_spec_file(args.model)
        try:
            return load_model(args)
        except (ValueError, TypeError, KeyError) as err:
            raise GateError(f"zoo model {args.zoo!r}: {one_line(err)}") from err

    if not args.server:
        from cli.gate.local import run_local

        return run_local(args, cluster, options, load_spec, stages, say=say)
    from cli.gate.remote import run_remote

    if source == "zoo":  # built by the runner, which ignores the keys past its layers
        zoo = ZooRef(name=args.zoo, config=parse_overrides(args.overrides))
        asked = measure_baseline(options, stages)
        request = PlanRequest(zoo=zoo, cluster=cluster, options=asked)
    else:
        spec = load_spec()
        asked = measure_baseline(options, stages, spec.num_layers)
        request = PlanRequest(model=spec, cluster=cluster, options=asked)
    return run_remote(
        args.server,
        args.token,
        request,
        stages,
        wait_timeout_s=args.wait_timeout,
        say=say,
        idempotency_key=args.idempotency_key,
        new=args.new,
    )


def _write_reports(args: argparse.Namespace, result: GateResult) -> None:
    if args.junit is not None:
        args.junit.parent.mkdir(parents=True, exist_ok=True)
        args.junit.write_text(junit_xml(result), encoding="utf-8")
    text = markdown(result)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as out:
            out.write(text)


STYLES = {"pass": "green", "note": "yellow", "fail": "bold red", "undecided": "magenta"}


def _print_checks(console: "Console", result: GateResult) -> None:
    from rich.text import Text

    for check in result.verdict.checks:
        line = Text(f"{check.outcome.value.upper():9}", style=STYLES[check.outcome.value])
        line.append(f" {check.name}: {check.reason}")
        console.print(line, soft_wrap=True)
    v = result.verdict
    console.print(Text(f"stageprof gate: {v.label} (exit {v.exit_code})", style=STYLES[v.label]))
    if result.today is not None:
        print_trainer(console, result.today)  # the --for target's settings, if any


def _print_json(result: GateResult) -> None:
    """The `--json` line: verdict, exit code, checks, today's plan (usable as a baseline)."""
    obj = {
        "verdict": result.verdict.label,
        "exit_code": result.verdict.exit_code,
        "job_id": result.job_id,
        "checks": [c.as_dict() for c in result.verdict.checks],
        "plan": result.today.model_dump(mode="json") if result.today is not None else None,
        "stats": result.stats,
    } | (trainer_json(result.today) if result.today is not None else {})
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
