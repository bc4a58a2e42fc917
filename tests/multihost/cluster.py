"""What the multi-host tests plan for: one host per Ray node of `two_nodes`."""

import os
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table

from schemas import ClusterSpec
from tests.support.models import FAST_OPTIONS
from tests.support.waiting import wait_until
from workers.cluster.ray_env import DEVICE_RESOURCE

CLUSTER = ClusterSpec(num_hosts=2, devices_per_host=2)
# The fast options, every distinct stage measured (so 2-host stages always are).
OPTIONS = FAST_OPTIONS.model_copy(update={"prune": False})


def hold_the_cluster() -> Any:
    """A placement group of every device of both nodes: another job holding them."""
    bundle = {"CPU": 1.0, DEVICE_RESOURCE: 2.0}
    pg = placement_group([bundle, bundle], strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=60)
    return pg


def live_groups() -> list[dict[str, Any]]:
    """The cluster's placement groups not removed (of every driver)."""
    return [t for t in placement_group_table().values() if t["state"] != "REMOVED"]


def wait_all_removed(timeout_s: float = 10) -> bool:
    """Whether every placement group of the cluster is removed within `timeout_s`."""
    try:
        wait_until(lambda: not live_groups(), timeout_s, "every placement group removed")
    except AssertionError:
        return False
    return True


def held_rank(hold: Path, timeout_s: float = 120) -> tuple[str, int]:
    """The held rank's coordinator port and pid, once it is held."""

    def parts() -> list[str] | None:
        text = (hold / "held").read_text().split() if (hold / "held").exists() else []
        return text if len(text) == 2 else None

    port, pid = wait_until(parts, timeout_s, "a rank held while joining", interval_s=0.05)
    return port, int(pid)


def rank0_of(hold: Path, port: str) -> int:
    """Rank 0's pid of the group joining on `port`."""
    paths = wait_until(
        lambda: list(hold.glob(f"join-{port}-0-*")), 30, "rank 0 joining", interval_s=0.05
    )
    return int(paths[0].name.rsplit("-", 1)[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
