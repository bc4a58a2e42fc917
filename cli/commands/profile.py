"""`stageprof profile`: measure one stage candidate in this process and print the result.

For looking at one stage closely: layers start..end on a submesh, a logical mesh and a
strategy. On the CPU the process gets enough virtual devices (XLA_FLAGS) before jax loads;
it uses the persistent compilation cache as the measuring actors do
(STAGEPROF_COMPILE_CACHE_DIR).
Exit code: 0 when the candidate measured ok, 1 when it failed (the result still prints),
2 for bad arguments.
"""

import argparse
import os
import re
import sys
from collections.abc import MutableMapping

from cli.commands.measure_args import (
    add_device_memory_argument,
    add_measurement_arguments,
    field_argument,
    measurement_options,
)
from cli.commands.plan_output import succ_text
from cli.commands.zoo_args import (
    add_model_arguments,
    load_model,
    one_line,
    parse_overrides,
)
from schemas import (
    ClusterSpec,
    ModuleProfileResult,
    PlanOptions,
    ShardingConfig,
    StageProfileResult,
    SubmeshShape,
)

GIB = 2**30
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
STRATEGIES = ("data", "megatron", "fsdp")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "profile",
        help="measure one stage candidate and print it",
        description="Measure layers START..END on one submesh and sharding config, in this "
        "process (virtual CPU devices, or the GPUs it sees).",
    )
    add_model_arguments(parser, default_zoo=None)
    parser.add_argument("--start", type=int, required=True, help="first layer")
    parser.add_argument("--end", type=int, required=True, help="last layer (inclusive)")
    parser.add_argument("--submesh", required=True, help="physical submesh HxD, e.g. 1x2")
    parser.add_argument(
        "--logical-mesh", required=True, help="logical mesh DPxTP, e.g. 2x1 (DP*TP = H*D)"
    )
    parser.add_argument("--strategy", required=True, choices=STRATEGIES)
    parser.add_argument("--hosts", type=int, help="hosts in the cluster (default: the submesh's)")
    parser.add_argument(
        "--devices-per-host", type=int, help="devices per host (default: the submesh's)"
    )
    add_device_memory_argument(parser)
    add_measurement_arguments(parser)
    field_argument(parser, "--timeout", PlanOptions, "candidate_timeout_s")
    parser.add_argument("--json", action="store_true", help="print the StageProfileResult JSON")
    parser.set_defaults(func=run)


def parse_pair(text: str, what: str) -> tuple[int, int]:
    """`"2x4"` → `(2, 4)`; ValueError naming `what` otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m:
        raise ValueError(f"{what} must look like AxB (e.g. 1x2), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def ensure_cpu_devices(n: int, environ: MutableMapping[str, str] = os.environ) -> None:
    """Ask XLA for `n` virtual CPU devices unless XLA_FLAGS already sets a count. Only has
    an effect before jax is imported; it changes nothing on GPUs."""
    flags = environ.get("XLA_FLAGS", "")
    if DEVICE_COUNT_FLAG not in flags:
        environ["XLA_FLAGS"] = f"{flags} {DEVICE_COUNT_FLAG}={n}".strip()


def _parts(
    args: argparse.Namespace,
) -> tuple[SubmeshShape, ShardingConfig, ClusterSpec, PlanOptions]:
    hosts, per_host = parse_pair(args.submesh, "--submesh")
    submesh = SubmeshShape(hosts=hosts, devices_per_host=per_host)
    config = ShardingConfig(
        logical_mesh=parse_pair(args.logical_mesh, "--logical-mesh"), strategy=args.strategy
    )
    if config.num_devices != submesh.num_devices:
        raise ValueError(
            f"--logical-mesh {args.logical_mesh} has {config.num_devices} devices but "
            f"--submesh {args.submesh} has {submesh.num_devices}"
        )
    cluster = ClusterSpec(
        num_hosts=args.hosts or hosts,
        devices_per_host=args.devices_per_host or per_host,
        device_memory_bytes=max(1, int(args.device_memory_gib * GIB)),
    )
    if hosts > cluster.num_hosts or per_host > cluster.devices_per_host:
        raise ValueError(
            f"--submesh {submesh} does not fit the cluster {cluster.num_hosts}x"
            f"{cluster.devices_per_host}"
        )
    options = PlanOptions(
        **measurement_options(args),
        candidate_timeout_s=args.timeout,
    )
    if args.model is None:
        parse_overrides(args.overrides)
    return submesh, config, cluster, options


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        submesh, config, cluster, options = _parts(args)
    except (ValidationError, ValueError) as err:
        print(f"stageprof profile: {one_line(err)}", file=sys.stderr)
        return 2
    ensure_cpu_devices(submesh.num_devices)
    try:
        spec = load_model(args)
    except (ValidationError, ValueError, OSError) as err:
        print(f"stageprof profile: {one_line(err)}", file=sys.stderr)
        return 2
    if not 0 <= args.start <= args.end < spec.num_layers:
        print(
            f"stageprof profile: --start/--end must satisfy 0 <= start <= end < "
            f"{spec.num_layers} (the model's layers), got {args.start}..{args.end}",
            file=sys.stderr,
        )
        return 2
    from workers.measure.compile_cache import enable_compile_cache
    from workers.measure.stage import measure_stage_on

    enable_compile_cache()  # STAGEPROF_COMPILE_CACHE_DIR, as the measuring actors
    result = measure_stage_on(spec, args.start, args.end, submesh, config, cluster, options)
    if args.json:
        print(result.model_dump_json())
    else:
        print_result(result, [layer.name for layer in spec.layers[args.start : args.end + 1]])
    return 0 if result.ok else 1


def human_bytes(n: float) -> str:
    """`1536` → `"1.50 KiB"`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _collectives(m: ModuleProfileResult) -> str:
    moved = [f"{k} {human_bytes(v)}" for k, v in m.collective_bytes.items() if v]
    return ", ".join(moved) or "none"


def print_result(result: StageProfileResult, layer_names: list[str]) -> None:
    """A rich table of the modules, then the stage's fields."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    title = (
        f"stage {layer_names[0]}..{layer_names[-1]} ({result.num_layers} layers) on "
        f"{result.submesh}, mesh {result.config.label()}: {result.status.value}"
    )
    table = Table(title=title)
    for col in ("module", "cost ms", "runs", "peak", "temp", "compile s", "MFLOP"):
        table.add_column(col, justify="left" if col == "module" else "right", no_wrap=True)
    for m in result.module_profile_results:
        table.add_row(
            m.module.value,
            f"{m.compute_cost * 1e3:.3f}",
            str(len(m.compute_cost_samples_s)),
            human_bytes(m.peak_memory),
            human_bytes(m.temp_buffer_size),
            f"{m.compile_seconds:.2f}",
            f"{m.flops / 1e6:.3f}",
        )
    console.print(table)
    fields = Table(show_header=False, box=None)
    fields.add_column(style="bold")
    fields.add_column(overflow="fold")
    rows = [
        ("status", result.status.value),
        ("error", result.error or "-"),
        ("fingerprint", result.fingerprint),
        ("initial_var_size", human_bytes(result.initial_var_size)),
        ("intermediate_size", human_bytes(result.intermediate_size)),
        ("weight_stash_size", human_bytes(result.weight_stash_size)),
        ("available_memory", human_bytes(result.available_memory)),
        ("max_n_succ_stages", succ_text(result.max_n_succ_stages)),
        ("flops (fwd+bwd)", f"{result.flops / 1e6:.3f} MFLOP"),
        ("compile_seconds", f"{result.compile_seconds:.2f}"),
        (
            "compile_cache_hits",
            f"{result.compile_cache_hits} of {len(result.module_profile_results)} modules",
        ),
        ("device", f"{result.device_kind}, jax {result.jax_version}"),
        ("measured_by", ", ".join(result.measured_by) or "-"),
    ]
    if result.estimate_bytes is not None:
        rows.append(("estimate_bytes", human_bytes(result.estimate_bytes)))
    rows += [
        (f"collectives {m.module.value}", _collectives(m)) for m in result.module_profile_results
    ]
    rows += [(f"sharding {k}", v) for k, v in result.input_shardings.items()]
    for k, v in rows:
        fields.add_row(k, v)
    console.print(fields)
