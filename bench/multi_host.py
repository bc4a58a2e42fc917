"""Measuring across hosts and packing devices, on Ray clusters started on this machine.

Part 1, hosts: a Ray cluster of two nodes (`ray.cluster_utils.Cluster`, 2 CPUs and 2 virtual
devices each). Every config of the whole GPT on a 2 hosts x 2 devices submesh is measured
twice in one run: across 2 processes on the two nodes (one `jax.distributed` program, gloo
CPU collectives), and in this one process on 4 virtual devices (the old way, and the
reference). Printed side by side: forward/backward/apply_grad medians, FLOPs, peak memory,
and the ratio of the step costs.

Part 2, packing: one node offering N devices and N CPUs (`--packing-devices`, default 4). A
job on 1 host x N devices (its submeshes are 1, 2, ... N devices) is planned twice on fresh
stores: with the pool of one shape (every process owns N devices, so one process fits: what
an N-GPU host allowed before) and packed (N 1-device groups, then N/2 2-device, ... then one
N-device). Printed: wall time, stages measured, processes started, the groups' busy time,
compile and timed-run seconds, and the ratio.

Usage: python bench/multi_host.py [--part both|hosts|packing] [--layers 2] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The reference runs in this process on 4 virtual devices: set before jax is imported.
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    + ["--xla_force_host_platform_device_count=4"]
)

import common  # noqa: E402  (bench/common.py; the script's directory is on sys.path)

MODULES = ("forward", "backward", "apply_grad")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["both", "hosts", "packing"], default="both")
    parser.add_argument("--layers", type=int, default=2, help="GPT blocks")
    parser.add_argument(
        "--packing-devices",
        type=int,
        default=4,
        help="the packing part's node: this many devices and as many CPUs",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per module")
    parser.add_argument(
        "--quick", action="store_true", help="tiny widths, 2 repeats, 2 configs across hosts"
    )
    parser.add_argument(
        "--no-quiet-timing",
        action="store_true",
        help="measure without the machine-wide quiet-timing lock (STAGEPROF_QUIET_TIMING=0)",
    )
    parser.add_argument("--verbose", action="store_true", help="runner logs on stderr")
    return parser.parse_args(argv)


def _cluster(nodes: int, cpus: int, devices: int) -> Any:
    import ray
    from ray.cluster_utils import Cluster

    from workers.cluster.ray_env import DEVICE_RESOURCE

    node = {"num_cpus": cpus, "resources": {DEVICE_RESOURCE: devices}}
    cluster = Cluster(initialize_head=True, head_node_args=dict(node))
    for _ in range(nodes - 1):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster


def _stop(cluster: Any) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


def hosts_part(spec: Any, options: Any, max_configs: int | None) -> dict[str, Any]:
    from planner import enumerate_candidates
    from schemas import ClusterSpec
    from workers.cluster.pool import CandidateTask, GroupPool, PoolConfig
    from workers.measure.stage import measure_stage

    cluster_spec = ClusterSpec(num_hosts=2, devices_per_host=2)
    space = enumerate_candidates(spec, cluster_spec, options)
    keys = [
        k
        for k in space.keys
        if space.submeshes[k.submesh_id].as_tuple() == (2, 2)
        and k.start == 0
        and k.end == spec.num_layers - 1
    ]
    keys = keys[:max_configs]
    cluster = _cluster(nodes=2, cpus=2, devices=2)
    rows: list[dict[str, Any]] = []
    try:
        pool = GroupPool(
            PoolConfig(),
            model_key="bench",
            spec=spec,
            cluster=cluster_spec,
            options=options,
            failure_result=lambda task, status, error: (status, error),
        )
        try:
            for key in keys:
                submesh, config = space.resolve(key)
                pool.submit(CandidateTask(str(key), key, submesh))
                results: list[Any] = []
                while not results:
                    results = pool.poll(1.0)
                spread = results[0]
                alone = measure_stage(spec, key, cluster_spec, options)
                rows.append(_compare(config.label(), spread, alone))
        finally:
            pool.shutdown()
    finally:
        _stop(cluster)
    return {"configs": rows}


def _compare(label: str, spread: Any, alone: Any) -> dict[str, Any]:
    def costs(r: Any) -> dict[str, float]:
        if not getattr(r, "ok", False):
            return {}
        return {m.module.value: m.compute_cost for m in r.module_profile_results}

    ours, ref = costs(spread), costs(alone)
    step = sum(ours.get(m, 0.0) for m in MODULES[:2])
    ref_step = sum(ref.get(m, 0.0) for m in MODULES[:2])
    return {
        "config": label,
        "status": [getattr(spread, "status", spread).__str__(), alone.status.value],
        "processes": list(getattr(spread, "measured_by", ())),
        "ms_2_processes": {m: round(1e3 * v, 3) for m, v in ours.items()},
        "ms_1_process": {m: round(1e3 * v, 3) for m, v in ref.items()},
        "flops_equal": getattr(spread, "flops", None) == alone.flops,
        "peak_equal": getattr(spread, "peak_memory", None) == alone.peak_memory,
        "step_ratio": round(step / ref_step, 2) if ref_step > 0 else None,
    }


def packing_part(spec: Any, options: Any, work: Path, devices: int) -> dict[str, Any]:
    from schemas import ClusterSpec
    from workers.jobs.runner import RunnerConfig

    cluster_spec = ClusterSpec(num_hosts=1, devices_per_host=devices)
    setups = {
        "one shape": RunnerConfig(devices_per_worker=devices),
        "packed": RunnerConfig(),
    }
    out: dict[str, Any] = {}
    for name, config in setups.items():
        cluster = _cluster(nodes=1, cpus=devices, devices=devices)
        try:
            sessions = common.sqlite_sessions(work / f"{name.split()[0]}.db")
            run = common.run_job(sessions, spec, cluster_spec, options, config)
        finally:
            _stop(cluster)
        stats = run.outcome.stats
        measured = {r.fingerprint: r for r in run.results.values() if r.module_profile_results}
        modules = [m for r in measured.values() for m in r.module_profile_results]
        out[name] = {
            "status": run.outcome.status.value,
            "wall_s": round(run.wall_seconds, 1),
            "measured": stats.measured,
            "failed": stats.failed,
            "processes_started": stats.actors_started,
            # inside measure calls, summed over groups (dispatch -> result collected)
            "group_busy_s": round(run.busy_seconds, 1),
            "compile_s": round(sum(m.compile_seconds for m in modules), 1),
            "timed_runs_s": round(sum(sum(m.compute_cost_samples_s) for m in modules), 1),
            "load_avg": run.load_avg,
            "plan": common.plan_keys(run.outcome.plan) if run.outcome.plan else None,
        }
    one, packed = (out[n]["wall_s"] for n in setups)
    out["packed_vs_one_shape"] = round(packed / one, 2) if one else None
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging(args.verbose)
    if args.no_quiet_timing:
        os.environ["STAGEPROF_QUIET_TIMING"] = "0"  # forwarded to every measuring process
    from client import zoo
    from schemas import PlanOptions

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    spec = zoo.build("gpt", num_layers=args.layers, **widths)
    options = PlanOptions(
        schedule="1f1b",  # as the runs recorded in RESULTS.md
        remat="as_written",
        num_microbatches=4,
        repeats=2 if args.quick else args.repeats,
        warmup=1,
        prune=False,
        candidate_timeout_s=600,
    )
    figures: dict[str, Any] = {
        "commit": common.git_commit(),
        "layers": args.layers,
        "quiet_timing": not args.no_quiet_timing,
    }
    con = common.console()
    if args.part in ("both", "hosts"):
        began = time.perf_counter()
        figures["hosts"] = hosts_part(spec, options, 2 if args.quick else None)
        for row in figures["hosts"]["configs"]:
            table = common.side_by_side(
                f"2 hosts x 2 devices, {row['config']}: across 2 processes vs 1 process",
                [(m, row["ms_2_processes"].get(m), row["ms_1_process"].get(m)) for m in MODULES]
                + [("flops equal", row["flops_equal"], ""), ("peak equal", row["peak_equal"], "")]
                + [("step ratio", row["step_ratio"], "")],
                ("2 processes (ms)", "1 process (ms)"),
            )
            con.print(table)
        figures["hosts"]["seconds"] = round(time.perf_counter() - began, 1)
    if args.part in ("both", "packing"):
        work = Path(tempfile.mkdtemp(prefix="stageprof-packing-"))
        figures["packing"] = packing_part(spec, options, work, args.packing_devices)
        names = [n for n in figures["packing"] if n != "packed_vs_one_shape"]
        rows = [
            (field, figures["packing"][names[0]][field], figures["packing"][names[1]][field])
            for field in (
                "status",
                "wall_s",
                "measured",
                "failed",
                "processes_started",
                "group_busy_s",
                "compile_s",
                "timed_runs_s",
            )
        ]
        title = f"time to plan, 1 host x {args.packing_devices} devices"
        con.print(common.side_by_side(title, rows, tuple(names)))
        con.print(f"packed / one shape: {figures['packing']['packed_vs_one_shape']}")
    common.emit_json(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
