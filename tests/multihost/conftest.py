"""A Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`: a head and a
second raylet), each offering 2 CPUs and 2 virtual devices (`stageprof_devices`)."""

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, placement_group_table

from schemas import ClusterSpec
from tests.runner.conftest import FAST_OPTIONS, db_file, sessions  # noqa: F401 (fixtures)
from workers.cluster.ray_env import DEVICE_RESOURCE

NODE = {"num_cpus": 2, "resources": {DEVICE_RESOURCE: 2}}
# The cluster the tests plan for: one host per Ray node.
CLUSTER = ClusterSpec(num_hosts=2, devices_per_host=2)
# The runner tests' options, every distinct stage measured (so 2-host stages always are).
OPTIONS = FAST_OPTIONS.model_copy(update={"prune": False})


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    if ray.is_initialized():  # another module's single-node Ray
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE))
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


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
    deadline = time.monotonic() + timeout_s
    while live_groups():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def held_rank(hold: Path, timeout_s: float = 120) -> tuple[str, int]:
    """The held rank's coordinator port and pid, once it is held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parts = (hold / "held").read_text().split() if (hold / "held").exists() else []
        if len(parts) == 2:
            return parts[0], int(parts[1])
        time.sleep(0.05)
    raise AssertionError("no rank was held while joining")


def rank0_of(hold: Path, port: str) -> int:
    """Rank 0's pid of the group joining on `port`."""
    deadline = time.monotonic() + 30
    while not (paths := list(hold.glob(f"join-{port}-0-*"))):
        assert time.monotonic() < deadline, "rank 0 never joined"
        time.sleep(0.05)
    return int(paths[0].name.rsplit("-", 1)[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
