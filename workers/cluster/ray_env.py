"""Connecting to Ray: the cluster at `RAY_ADDRESS`, or a local one started in-process.

A local Ray is watched by `workers.cluster.ray_watchdog`: when this process dies, by any signal,
the watchdog stops the Ray processes it started."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import ray

logger = logging.getLogger(__name__)

RAY_ADDRESS_ENV = "RAY_ADDRESS"
# The Ray node resource that counts a host's measuring devices on CPU (virtual devices):
# `ray start --resources='{"stageprof_devices": 4}'`. GPU hosts count Ray's own `GPU`.
DEVICE_RESOURCE = "stageprof_devices"
# A local Ray started in-process offers this many virtual devices (a bound no job reaches);
# its CPUs bound how many measuring processes run at once.
LOCAL_DEVICE_BUDGET = 4096

_started_here = False


def connect_ray(num_cpus: int | None = None, *, verbose: bool = False) -> None:
    """Join `RAY_ADDRESS` when set, else start a local Ray with this machine's CPUs. Ray's
    own start-up notices are shown only when `verbose`."""
    if ray.is_initialized():
        return
    # Importing ray set its logger to INFO; its notices (e.g. about token authentication,
    # which stays on) say nothing a stageprof user can act on.
    logging.getLogger("ray").setLevel(logging.INFO if verbose else logging.ERROR)
    address = os.environ.get(RAY_ADDRESS_ENV, "").strip()
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=False)
        return
    ray.init(
        # "local": a Ray of our own, even where another `ray start` runs on this machine
        # (a bare ray.init() would join that one)
        address="local",
        num_cpus=num_cpus or os.cpu_count() or 1,
        resources={DEVICE_RESOURCE: LOCAL_DEVICE_BUDGET},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    global _started_here
    _started_here = True
    session = session_name()
    watchdog = start_watchdog(session)
    logger.info("local Ray session %s, watched by pid %d", session, watchdog.pid)


def session_name() -> str:
    """The local Ray session's name (`session_<date>_<pid>`), found in the command line
    of each of its processes."""
    node = ray._private.worker.global_worker.node
    return Path(node.get_session_dir_path()).name


def start_watchdog(session: str) -> subprocess.Popen[bytes]:
    """A process that outlives this one and stops the Ray session `session` after it."""
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cluster.ray_watchdog", str(os.getpid()), session],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def virtual_devices_only() -> bool:
    """Whether this process started its own local Ray (`connect_ray` without
    `RAY_ADDRESS`): its devices are virtual CPU devices on this machine's cores, where packing
    groups gains nothing (bench/RESULTS.md §7)."""
    return _started_here
