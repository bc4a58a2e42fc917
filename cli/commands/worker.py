"""`stageprof worker`: a long-running runner that claims jobs from the store and runs them."""

import argparse
import logging
import os
import signal
import threading
from types import ModuleType

logger = logging.getLogger(__name__)

RAY_SHUTDOWN_BUDGET_S = 2.0


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags that size the measuring groups; each defaults to its environment variable
    (`schemas.settings.EnvSettings`)."""
    from schemas.settings import env_settings

    env = env_settings()
    parser.add_argument(
        "--workers",
        type=int,
        default=env.workers,
        help="most measuring groups at once (env STAGEPROF_WORKERS; default: as many as the "
        "Ray cluster's device and CPU resources fit)",
    )
    parser.add_argument(
        "--devices-per-worker",
        type=int,
        default=env.devices_per_worker,
        help="the old one-shape pool: every actor owns N devices and measures every submesh "
        "shape, no packing, a baseline (env STAGEPROF_DEVICES_PER_WORKER; default: off, "
        "groups sized to each shape)",
    )
    parser.add_argument(
        "--gpus",
        action="store_true",
        default=env.use_gpus,
        help="give actors whole GPUs through Ray num_gpus, NCCL between hosts (env "
        "STAGEPROF_USE_GPUS=1)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=env.lease_seconds,
        help="job lease; another runner takes a job over after it expires (env "
        "STAGEPROF_LEASE_SECONDS; default: %(default)s)",
    )


def runner_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from workers.jobs.runner import RunnerConfig

    return RunnerConfig(
        num_workers=args.workers,
        devices_per_worker=args.devices_per_worker,
        use_gpus=args.gpus,
        lease_seconds=args.lease_seconds,
        heartbeat_seconds=max(0.5, args.lease_seconds / 6),
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("worker", help="claim jobs from the store and run them on Ray")
    add_runner_arguments(parser)
    parser.add_argument("--database-url", help="store URL (default STAGEPROF_DATABASE_URL)")
    parser.add_argument("--once", action="store_true", help="run at most one job, then exit")
    parser.add_argument(
        "--idle-sleep", type=float, default=2.0, help="seconds between polls when idle"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run jobs until SIGTERM/SIGINT. A database outage is waited out (the process never
    exits for it); on a signal the current job is handed back within seconds."""
    import ray

    from client import zoo
    from client.symbolic_batch import build_zoo_symbolic
    from migrations import upgrade
    from store import database_url, make_engine, make_sessionmaker
    from workers.cluster.ray_env import connect_ray
    from workers.jobs.runner import JobRunner

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.INFO)
    url = args.database_url or database_url()
    if url.startswith("sqlite"):
        upgrade(url)
    # A lost network fails a connection attempt in seconds (then retried), not minutes.
    engine_args = {} if url.startswith("sqlite") else {"connect_args": {"connect_timeout": 5}}
    sessions = make_sessionmaker(make_engine(url, **engine_args))
    connect_ray()
    # After Ray: its start-up installs a SIGTERM handler that aborts the process.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    runner = JobRunner(
        sessions,
        runner_config(args),
        build_zoo=lambda name, cfg: zoo.build(name, **cfg),
        shutdown=stop,
        build_zoo_symbolic=lambda name, cfg: build_zoo_symbolic(name, **cfg),
    )
    logger.info("worker %s waiting for jobs", runner.config.owner)
    try:
        if args.once:
            outcome = runner.run_next()
            print(f"job {outcome.job_id}: {outcome.status.value}" if outcome else "no job queued")
            return 0
        runner.run_forever(stop, idle_sleep_s=args.idle_sleep)
        logger.info("worker %s stopped", runner.config.owner)
        return 0
    finally:
        _shutdown_ray(ray)


def _shutdown_ray(ray: ModuleType) -> None:
    """Stop Ray, within `RAY_SHUTDOWN_BUDGET_S`: past it the process exits anyway and its
    Ray watchdog (`workers.cluster.ray_watchdog`) stops what is left, so SIGTERM takes effect
    within seconds even on a loaded machine."""
    done = threading.Thread(target=ray.shutdown, daemon=True)
    done.start()
    done.join(RAY_SHUTDOWN_BUDGET_S)
    if done.is_alive():
        logger.warning("Ray did not stop within %g s; exiting", RAY_SHUTDOWN_BUDGET_S)
        logging.shutdown()
        os._exit(0)
