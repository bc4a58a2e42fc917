"""Warm re-plan: the same job again with every profile stored, through the API.

Starts `stageprof serve` (a free loopback port) and `stageprof worker` (polling for jobs every
`--idle-sleep` s) as subprocesses on one SQLite file, plans a zoo GPT once (cold: every
stage measured), then submits the same request again `--repeats` times (warm: every profile
is stored, the runner starts no actors) and times submit -> plan readable through the API.
The worker's actors get an empty compilation cache of their own (`common.compile_cache`).
Warm submissions are made both as the zoo request (the worker rebuilds the zoo model) and
by the stored model's id.

Usage: python bench/warm_replan.py [--layers 16] [--idle-sleep 0.2] [--repeats 3] [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)

START_TIMEOUT_S = 120.0
GOAL_S = 3.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="transformer blocks")
    parser.add_argument("--micro-batches", type=int, default=8, help="B")
    parser.add_argument("--idle-sleep", type=float, default=0.2, help="worker poll, seconds")
    parser.add_argument("--repeats", type=int, default=3, help="warm submissions per kind")
    parser.add_argument("--workers", type=int, default=2, help="actors of the worker")
    parser.add_argument("--poll", type=float, default=0.02, help="client poll, seconds")
    parser.add_argument("--quick", action="store_true", help="tiny widths (smoke tests)")
    parser.add_argument("--work-dir", help="where the SQLite file goes (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per job, seconds")
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """This environment without stageprof/Ray settings that would point elsewhere, but the
    compilation cache of `common.compile_cache` (main's: an empty one, so the cold plan is
    cold)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("STAGEPROF_") and k not in ("RAY_ADDRESS", "XLA_FLAGS")
    }
    if common.COMPILE_CACHE_ENV in os.environ:
        env[common.COMPILE_CACHE_ENV] = os.environ[common.COMPILE_CACHE_ENV]
    return env


@contextmanager
def process(cmd: list[str], log: Path) -> Any:
    """Run `cmd` (output to `log`) for the block; SIGINT then kill at the end."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=clean_env(), stdout=out, stderr=subprocess.STDOUT, cwd=common.ROOT
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(api: Any, proc: subprocess.Popen, log: Path) -> None:
    from client.sdk import ServerUnreachable

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"stageprof serve exited: {log.read_text()[-2000:]}")
        try:
            api.health()
            return
        except ServerUnreachable:
            if time.monotonic() > deadline:
                raise RuntimeError("stageprof serve did not answer") from None
            time.sleep(0.1)


def time_job(api: Any, submit: Any, poll_s: float, timeout_s: float) -> dict[str, Any]:
    """Submit, poll until the plan is readable; seconds from submit to plan in hand."""
    began = time.perf_counter()
    ref = submit()
    job = api.wait_for_job(ref.job_id, timeout_s=timeout_s, poll_s=poll_s)
    plan = api.get_plan(job.id) if job.status.value == "done" else None
    wall = time.perf_counter() - began
    run_s = None
    if job.started_at and job.finished_at:
        run_s = (job.finished_at - job.started_at).total_seconds()
    return {
        "job_id": job.id,
        "status": job.status.value,
        "error": job.error,
        "seconds": round(wall, 3),
        "runner_seconds": round(run_s, 3) if run_s is not None else None,
        "measured": job.progress.measured,
        "reused": job.progress.reused,
        "pruned": job.progress.pruned,
        "candidates": job.progress.candidates,
        "plan": common.plan_keys(plan) if plan else None,
        "model_id": job.model_id,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging()
    from client.sdk import StageprofClient
    from schemas import ClusterSpec, PlanOptions

    widths = common.QUICK_WIDTHS if args.quick else common.GPT_WIDTHS
    zoo_config = {"num_layers": args.layers, **widths}
    cluster = ClusterSpec(num_hosts=1, devices_per_host=4)
    options = PlanOptions(
        num_microbatches=args.micro_batches,
        config_space="data_parallel_only",
        strategies=["data"],
        repeats=2 if args.quick else 5,
        warmup=1,
    )
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-warm-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "warm.db"
    db.unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    port = free_port()
    cli = [sys.executable, "-m", "cli"]
    serve_cmd = cli + ["serve", "--port", str(port), "--database-url", url]
    serve_cmd += ["--log-level", "warning"]
    worker_cmd = cli + ["worker", "--database-url", url, "--idle-sleep", str(args.idle_sleep)]
    worker_cmd += ["--workers", str(args.workers)]
    with ExitStack() as stack:
        stack.enter_context(common.compile_cache())  # an empty one: the cold plan is cold
        server = stack.enter_context(process(serve_cmd, work / "serve.log"))
        api = stack.enter_context(StageprofClient(f"http://127.0.0.1:{port}"))
        wait_healthy(api, server, work / "serve.log")  # migrates before the worker starts
        stack.enter_context(process(worker_cmd, work / "worker.log"))

        def by_zoo() -> Any:
            return api.submit_plan(
                zoo="gpt", zoo_config=zoo_config, cluster=cluster, options=options
            )

        cold = time_job(api, by_zoo, args.poll, args.timeout)
        if cold["status"] != "done":
            raise RuntimeError(f"cold job {cold['status']}: {cold['error']}")

        def by_id() -> Any:
            return api.submit_plan(model_id=cold["model_id"], cluster=cluster, options=options)

        warm_zoo = [time_job(api, by_zoo, args.poll, args.timeout) for _ in range(args.repeats)]
        warm_id = [time_job(api, by_id, args.poll, args.timeout) for _ in range(args.repeats)]
    out = report(args, cold, warm_zoo, warm_id, widths)
    common.emit_json(out)
    return 0


def report(
    args: argparse.Namespace,
    cold: dict[str, Any],
    warm_zoo: list[dict[str, Any]],
    warm_id: list[dict[str, Any]],
    widths: dict[str, int],
) -> dict[str, Any]:
    warm_all = warm_zoo + warm_id
    warm_s = common.median(w["seconds"] for w in warm_zoo)
    warm_id_s = common.median(w["seconds"] for w in warm_id)
    out = {
        "model": "gpt",
        "blocks": args.layers,
        "widths": widths,
        "cluster": "1x4 cpu (virtual devices)",
        "config_space": "data_parallel_only",
        "strategies": ["data"],
        "idle_sleep_s": args.idle_sleep,
        "client_poll_s": args.poll,
        "cold_s": cold["seconds"],
        "cold_runner_s": cold["runner_seconds"],
        "warm_s": warm_s,
        "warm_by_model_id_s": warm_id_s,
        "warm_runs_s": [w["seconds"] for w in warm_zoo],
        "warm_by_model_id_runs_s": [w["seconds"] for w in warm_id],
        "warm_runner_s": common.median(
            w["runner_seconds"] for w in warm_zoo if w["runner_seconds"] is not None
        ),
        "candidates": cold["candidates"],
        "warm_measured": sum(w["measured"] for w in warm_all),
        "same_plan": all(w["plan"] == cold["plan"] for w in warm_all),
        "goal_s": GOAL_S,
        "goal_met": max(warm_s, warm_id_s) < GOAL_S,
        "commit": common.git_commit(),
    }
    con = common.console()
    rows = [
        ("submit -> plan, s (zoo request)", cold["seconds"], warm_s),
        ("submit -> plan, s (by model id)", None, warm_id_s),
        ("runner (claim -> plan stored), s", cold["runner_seconds"], out["warm_runner_s"]),
        ("stages measured", cold["measured"], warm_zoo[0]["measured"] if warm_zoo else None),
        ("stages reused", cold["reused"], warm_zoo[0]["reused"] if warm_zoo else None),
        ("candidates pruned", cold["pruned"], warm_zoo[0]["pruned"] if warm_zoo else None),
        ("candidates", cold["candidates"], warm_zoo[0]["candidates"] if warm_zoo else None),
    ]
    title = (
        f"warm re-plan through the API: gpt {args.layers} blocks, 1x4 cpu, "
        f"worker --idle-sleep {args.idle_sleep}"
    )
    con.print(common.side_by_side(title, rows, ("cold", "warm (median)")))
    con.print(f"same plan every time: {out['same_plan']}   goal < {GOAL_S} s: {out['goal_met']}")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
