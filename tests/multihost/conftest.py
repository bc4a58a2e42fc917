"""A Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`: a head and a
second raylet), each offering 2 CPUs and 2 virtual devices (`stageprof_devices`)."""

from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from workers.cluster.ray_env import DEVICE_RESOURCE

NODE = {"num_cpus": 2, "resources": {DEVICE_RESOURCE: 2}}


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
