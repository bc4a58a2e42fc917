"""Plans for trainers: the best plan MaxText can run beside the best unrestricted plan.

The 16-block GPT (zoo `gpt`, traced for real: embedding, 16 blocks sharing one fingerprint,
head) on 1 x 4 and 2 x 4 devices, B = 8 micro-batches, data-parallel and megatron configs.
Its stage times are SYNTHETIC, not measured (measuring every candidate of both clusters on
this shared 2-core machine takes tens of minutes): a stage's forward is its layers' traced
FLOPs at 20 GFLOP/s per device, divided over its devices with 10% lost per extra device
(data) or 15% (megatron), plus 0.3 ms per layer and 0.5 ms per stage; backward twice the
forward (B and W one forward each); memory never binds. Each cluster is planned once with
`schedule: auto`, `target: maxtext`; the plan's unrestricted time and the MaxText search's
time are both simulated by the same schedule models.

Usage: python bench/trainer_plans.py [--micro-batches 8]
The last line printed is one JSON object with every figure.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402  (bench/common.py)

RATE = 20e9  # FLOP/s per device
LOSS = {"data": 0.10, "megatron": 0.15, "fsdp": 0.12}
PER_LAYER_S, PER_STAGE_S = 0.3e-3, 0.5e-3


def stage_result(spec: Any, key: Any, submesh: Any, config: Any) -> Any:
    """A synthetic measured stage (see the module docstring)."""
    from schemas import ModuleKind, ModuleProfileResult, ProfileStatus, StageProfileResult

    layers = spec.layers[key.start : key.end + 1]
    n = submesh.num_devices
    flops = sum(layer.flops for layer in layers)
    slow = 1 + LOSS[config.strategy] * (n - 1)
    forward = flops / (RATE * n) * slow + PER_LAYER_S * len(layers) + PER_STAGE_S

    def module(kind: Any, seconds: float) -> Any:
        return ModuleProfileResult(
            module=kind,
            compute_cost=seconds,
            peak_memory=1000,
            temp_buffer_size=0,
            invar_names=(),
            outvar_names=(),
            invar_sizes=(),
            outvar_sizes=(),
            donated_invars=(),
            available_memory=2**34,
        )

    kinds = [
        (ModuleKind.forward, forward),
        (ModuleKind.backward, 2 * forward),
        (ModuleKind.backward_input, forward),
        (ModuleKind.backward_weight, forward),
    ]
    return StageProfileResult(
        status=ProfileStatus.ok,
        fingerprint=f"synthetic-{key.start}-{key.end}-{submesh}-{config.label()}",
        submesh=submesh,
        config=config,
        num_layers=len(layers),
        module_profile_results=tuple(module(k, t) for k, t in kinds),
        available_memory=2**34,
        initial_var_size=10,
        intermediate_size=20,
        weight_stash_size=5,
        max_n_succ_stages=4096,
    )


def plan_case(spec: Any, hosts: int, per_host: int, micro: int) -> dict[str, Any]:
    from planner import build_plan, enumerate_candidates
    from schemas import ClusterSpec, PlanOptions
    from schemas.trainer_export import maxtext_gap

    cluster = ClusterSpec(num_hosts=hosts, devices_per_host=per_host)
    options = PlanOptions(
        num_microbatches=micro, strategies=["data", "megatron"], schedule="auto", target="maxtext"
    )
    space = enumerate_candidates(spec, cluster, options)
    results = {k.as_tuple(): stage_result(spec, k, *space.resolve(k)) for k in space.keys}
    plan = build_plan(spec, cluster, options, space, results)
    mt = plan.maxtext
    assert mt is not None
    return {
        "cluster": f"{hosts}x{per_host}",
        "candidates": len(space.keys),
        "unrestricted_s": plan.predicted_iteration_time_s,
        "unrestricted_schedule": plan.schedule_name,
        "unrestricted_v": plan.virtual_stages,
        "unrestricted_layout": [
            (s.start, s.end, f"{s.submesh.hosts}x{s.submesh.devices_per_host}") for s in plan.stages
        ],
        "maxtext_s": mt.predicted_iteration_time_s,
        "maxtext_pipeline_s": mt.pipeline_time_s,
        "maxtext_outside_s": mt.outside_time_s,
        "maxtext_schedule": mt.schedule,
        "maxtext_settings": mt.settings,
        "summary": maxtext_gap(mt),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args(argv)
    common.setup_logging(False)
    console = common.console()
    from client import zoo

    spec = zoo.build("gpt", num_layers=args.layers, **common.GPT_WIDTHS)
    rows = [plan_case(spec, h, d, args.micro_batches) for h, d in ((1, 4), (2, 4))]
    console.print(
        f"{args.layers}-block GPT, B = {args.micro_batches}, synthetic stage times (see --help)"
    )
    for r in rows:
        ms = r["maxtext_s"]
        console.print(
            f"  {r['cluster']}: unrestricted ({r['unrestricted_schedule']}, "
            f"v={r['unrestricted_v']}) {r['unrestricted_s'] * 1e3:.2f} ms | MaxText "
            f"({r['maxtext_schedule']}) {'-' if ms is None else f'{ms * 1e3:.2f} ms'} "
            f"(pipeline {(r['maxtext_pipeline_s'] or 0) * 1e3:.2f} + outside "
            f"{(r['maxtext_outside_s'] or 0) * 1e3:.2f})",
            highlight=False,
        )
        console.print(f"    {r['summary']}", highlight=False)
        console.print(f"    {r['maxtext_settings']}", highlight=False)
    common.emit_json({"cases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
