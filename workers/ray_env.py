"""Connecting to Ray: the cluster at `RAY_ADDRESS`, or a local one started in-process."""

import logging
import os

import ray

logger = logging.getLogger(__name__)

RAY_ADDRESS_ENV = "RAY_ADDRESS"


def connect_ray(num_cpus: int | None = None) -> None:
    """Join `RAY_ADDRESS` when set, else start a local Ray with this machine's CPUs."""
    if ray.is_initialized():
        return
    address = os.environ.get(RAY_ADDRESS_ENV, "").strip()
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=False)
        return
    ray.init(
        num_cpus=num_cpus or os.cpu_count() or 1,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
