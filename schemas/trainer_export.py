"""A stored plan in the forms trainers take: stageprof's JSON, Alpa's `ManualStageOption`,
MaxText's settings, JaxPP's stage marks and schedule. The CLI and the API render with these
functions, so both give the same text.

Names checked against the trainers' sources: MaxText's keys and constraints in
`src/MaxText/configs/types.py` (AI-Hypercomputer/maxtext @ 1007fc2a); JaxPP's schedule
classes in `src/jaxpp/schedules.py` (NVIDIA/jaxpp @ 01dfbd9c), `pipeline_enter_stage` and the
classes re-exported by `src/jaxpp/api.py`.
"""

import json
from typing import Any, Literal

from schemas.plan import MaxTextPlan, Plan

ExportFormat = Literal["json", "alpa", "maxtext", "jaxpp"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("json", "alpa", "maxtext", "jaxpp")


class ExportUnavailable(ValueError):
    """The plan has no form in the asked format (the API answers 409)."""


def maxtext_yaml(mt: MaxTextPlan) -> str:
    """The settings as lines of a MaxText YAML config."""
    lines = ["# stageprof: the best plan MaxText can run"]
    lines += [f"{k}: {v}" for k, v in mt.settings.items()]
    if "remat_policy" not in mt.settings:
        lines.append("# remat_policy: as your model config sets it (stageprof measured it so)")
    return "\n".join(lines) + "\n"


def maxtext_overrides(mt: MaxTextPlan) -> str:
    """The settings as `key=value` command-line overrides."""
    return " ".join(f"{k}={v}" for k, v in mt.settings.items())


def maxtext_gap(mt: MaxTextPlan) -> str:
    """e.g. "MaxText's best: 18.2 ms; unrestricted best: 16.9 ms, 7.7% faster, not
    expressible because ..."."""
    if not mt.feasible or mt.predicted_iteration_time_s is None:
        return f"no MaxText plan: {mt.reason}"
    ours, best = mt.predicted_iteration_time_s, mt.unrestricted_time_s
    head = f"MaxText's best: {ours * 1e3:.4g} ms"
    if best is None:
        return head
    head += f"; unrestricted best: {best * 1e3:.4g} ms"
    if best < ours:
        why = "; ".join(mt.not_expressible) or "of the uniform stages"
        return f"{head}, {(ours / best - 1) * 100:.1f}% faster, not expressible because {why}"
    return (
        f"{head}: MaxText's is predicted {(best / ours - 1) * 100:.1f}% faster, as it runs "
        "the outside layers data parallel on all devices (costed at ideal scaling)"
    )


def maxtext_export(plan: Plan) -> dict[str, Any]:
    """The MaxText form; `ExportUnavailable` for a plan not made for MaxText or without one."""
    mt = plan.maxtext
    if plan.target != "maxtext" or mt is None:
        raise ExportUnavailable(
            "this plan was not made for MaxText; plan again with `stageprof plan --for maxtext` "
            "(options.target = 'maxtext')"
        )
    if not mt.feasible:
        raise ExportUnavailable(f"MaxText cannot run this model's plan: {mt.reason}")
    return {
        "settings": mt.settings,
        "yaml": maxtext_yaml(mt),
        "overrides": maxtext_overrides(mt),
        "schedule": mt.schedule,
        "predicted_iteration_time_s": mt.predicted_iteration_time_s,
        "unrestricted_time_s": mt.unrestricted_time_s,
        "not_expressible": mt.not_expressible,
        "summary": maxtext_gap(mt),
    }


def jaxpp_schedule(plan: Plan) -> tuple[str, dict[str, int], str | None]:
    """JaxPP's schedule class, its arguments, and a note where the plan needs care."""
    name, stages = plan.schedule_name, len(plan.stages)
    if name == "interleaved":
        note = None
        if plan.num_microbatches % stages:
            note = (
                f"JaxPP's Interleaved1F1B needs the micro-batches to be a multiple of its "
                f"num_stages ({stages}); this plan has {plan.num_microbatches}"
            )
        return "Interleaved1F1B", {"num_stages": stages, "mpmd_dim": plan.num_device_groups}, note
    cls = {"1f1b": "Std1F1B", "gpipe": "GPipe", "zb-h1": "ZeroBubble"}[name]
    note = None
    if name == "zb-h1" and plan.num_microbatches < stages:
        note = "JaxPP's ZeroBubble needs at least as many micro-batches as stages"
    return cls, {"num_stages": stages}, note


def jaxpp_export(plan: Plan) -> dict[str, Any]:
    """Stage marks (one per `pipeline_enter_stage` call, naming the layer it follows; the
    last closes the last stage), the schedule, the micro-batches, each stage's placement."""
    cls, args, note = jaxpp_schedule(plan)
    marks = [
        {"after_layer": s.layer_names[-1], "stage": i, "device_group": _group(plan, i)}
        for i, s in enumerate(plan.stages)
    ]
    stages = [
        {
            "stage": i,
            "first_layer": s.layer_names[0],
            "last_layer": s.layer_names[-1],
            "device_group": _group(plan, i),
            "submesh": list(s.submesh.as_tuple()),
            "logical_mesh": list(s.config.logical_mesh),
            "strategy": s.config.strategy,
            "mesh_axes": s.config.axis_sizes,
        }
        for i, s in enumerate(plan.stages)
    ]
    out: dict[str, Any] = {
        "stage_marks": marks,
        "schedule": {"class": cls, "args": args},
        "num_microbatches": plan.num_microbatches,
        "stages": stages,
        "snippet": jaxpp_snippet(plan, cls, args),
    }
    if note:
        out["note"] = note
    return out


def _group(plan: Plan, i: int) -> int:
    group = plan.stages[i].device_group
    return i % plan.num_device_groups if group is None else group


def jaxpp_snippet(plan: Plan, cls: str, args: dict[str, int]) -> str:
    """A short annotated Python snippet to paste next to the model."""
    call = ", ".join(f"{k}={v}" for k, v in args.items())
    lines = [
        "# stageprof plan for JaxPP "
        f"({plan.schedule_name}, predicted {plan.predicted_iteration_time_s * 1e3:.4g} ms)",
        f"from jaxpp.api import {cls}, pipeline_enter_stage  # newer JaxPP: mark_stage_end",
        "",
        f"schedule = {cls}({call})",
        f"num_microbatches = {plan.num_microbatches}",
        "",
        "# In the model's forward, after each layer named below:",
    ]
    for i, s in enumerate(plan.stages):
        lines.append(
            f"#   after {s.layer_names[-1]!r}: x = pipeline_enter_stage(x)  "
            f"# stage {i} ({s.layer_names[0]}..{s.layer_names[-1]}) on device group "
            f"{_group(plan, i)}: {s.submesh.hosts}x{s.submesh.devices_per_host} devices, "
            f"mesh {s.config.label()}"
        )
    return "\n".join(lines) + "\n"


def export_plan(plan: Plan, fmt: str) -> str:
    """The plan as text in `fmt`; `ExportUnavailable` when it has no such form,
    ValueError for an unknown format."""
    if fmt == "json":
        return plan.model_dump_json(indent=2) + "\n"
    if fmt == "alpa":
        if plan.manual_stage_option is None and plan.outside:
            raise ExportUnavailable(
                "Alpa's ManualStageOption has no form for this plan (it runs "
                + ", ".join(s.layer_names[0] for s in plan.outside)
                + " on every device outside the pipeline); plan with --no-outside-layers"
            )
        if plan.manual_stage_option is None:
            raise ExportUnavailable(
                "Alpa's ManualStageOption has no form for this plan (an interleaved plan's "
                "chunks share devices); plan with another --schedule"
            )
        return plan.manual_stage_option.model_dump_json(indent=2) + "\n"
    if fmt == "maxtext":
        return json.dumps(maxtext_export(plan), indent=2) + "\n"
    if fmt == "jaxpp":
        if plan.outside:
            raise ExportUnavailable(
                "JaxPP pipelines every layer, and this plan runs "
                + ", ".join(s.layer_names[0] for s in plan.outside)
                + " outside the pipeline; plan again with --for jaxpp"
            )
        return json.dumps(jaxpp_export(plan), indent=2) + "\n"
    raise ValueError(f"format: unknown {fmt!r}; use one of {', '.join(EXPORT_FORMATS)}")
