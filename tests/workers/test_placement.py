"""How many measuring groups of a shape fit on a set of Ray nodes, and which shape measures
a submesh (hosts spread over nodes, or emulated in one process)."""

import pytest

from schemas import SubmeshShape
from workers.cluster.placement import GroupShape, Layout, NodeCapacity
from workers.cluster.ray_env import DEVICE_RESOURCE


def _nodes(*devices: int | None, cpus: float = 8) -> tuple[NodeCapacity, ...]:
    return tuple(NodeCapacity(f"node{i:012d}", d, cpus) for i, d in enumerate(devices))


@pytest.mark.parametrize(
    ("devices", "shape", "fit"),
    [
        ((4,), GroupShape(1, 1), 4),  # packed: one group per device
        ((4,), GroupShape(1, 2), 2),
        ((4,), GroupShape(1, 4), 1),
        ((4,), GroupShape(1, 8), 0),
        ((4,), GroupShape(2, 2), 0),  # two hosts need two nodes
        ((2, 2), GroupShape(2, 2), 1),
        ((4, 4), GroupShape(2, 2), 2),  # two groups, each across both nodes
        ((4, 4, 4), GroupShape(2, 4), 1),
        ((8, 8, 8), GroupShape(2, 4), 3),  # 6 slots of 4 over 3 nodes: 3 pairs
        ((8, 2, 2), GroupShape(3, 2), 1),  # three distinct nodes per group
        ((4, 4, 2), GroupShape(3, 2), 1),
        ((4, 4, 4), GroupShape(3, 2), 2),
        ((8, 0, 0), GroupShape(2, 1), 0),
    ],
)
def test_groups_that_fit(devices: tuple[int, ...], shape: GroupShape, fit: int) -> None:
    assert Layout(_nodes(*devices)).groups_that_fit(shape) == fit


def test_cpus_and_the_cap_bound_groups_too() -> None:
    assert Layout(_nodes(64, cpus=2)).groups_that_fit(GroupShape(1, 1)) == 2
    assert Layout(_nodes(64, cpus=2), cpus_per_process=0.5).groups_that_fit(GroupShape(1, 1)) == 4
    assert Layout(_nodes(8, 8), max_groups=3).groups_that_fit(GroupShape(1, 1)) == 3
    # nodes that do not count devices are bounded by CPUs only
    assert Layout(_nodes(None, None, cpus=2)).groups_that_fit(GroupShape(2, 16)) == 2


def test_a_multi_host_submesh_spreads_when_nodes_allow_else_is_emulated() -> None:
    two_hosts = SubmeshShape(hosts=2, devices_per_host=2)
    assert Layout(_nodes(2, 2)).shape_for(two_hosts) == GroupShape(2, 2)
    assert Layout(_nodes(8)).shape_for(two_hosts) == GroupShape(1, 4)
    one = SubmeshShape(hosts=1, devices_per_host=2)
    assert Layout(_nodes(2, 2)).shape_for(one) == GroupShape(1, 2)
    # the pool of one shape: every submesh on the same processes
    assert Layout(_nodes(8), one_shape=4).shape_for(two_hosts) == GroupShape(1, 4)
    assert Layout(_nodes(8), one_shape=4).shape_for(one) == GroupShape(1, 4)


def test_bundles_ask_for_the_devices_they_use() -> None:
    shape = GroupShape(2, 4)
    assert Layout(_nodes(4, 4)).bundle(shape) == {"CPU": 1.0, DEVICE_RESOURCE: 4.0}
    assert Layout(_nodes(4, 4), use_gpus=True).bundle(shape) == {"CPU": 1.0, "GPU": 4.0}
    assert Layout(_nodes(None)).bundle(shape) == {"CPU": 1.0}
    # an actor asks for exactly its bundle
    assert Layout(_nodes(4, 4)).process_resources(shape) == {
        "num_cpus": 1.0,
        "resources": {DEVICE_RESOURCE: 4.0},
    }
    assert Layout(_nodes(4, 4), use_gpus=True).process_resources(shape) == {
        "num_cpus": 1.0,
        "num_gpus": 4.0,
    }
    assert Layout(_nodes(None)).process_resources(shape) == {"num_cpus": 1.0}


@pytest.mark.parametrize(
    ("local", "gpus", "devices_per_worker", "one_shape"),
    [
        (True, False, None, 4),  # stageprof's own Ray, virtual devices: one shape per job
        (False, False, None, None),  # a Ray cluster: packed
        (True, True, None, None),  # GPUs are real devices: packed
        (False, False, 2, 2),  # asked for: the pool of one shape
    ],
)
def test_which_pool_a_job_gets(
    monkeypatch: pytest.MonkeyPatch,
    local: bool,
    gpus: bool,
    devices_per_worker: int | None,
    one_shape: int | None,
) -> None:
    from planner import enumerate_candidates
    from schemas import ClusterSpec, PlanOptions
    from tests.workers.specs import dense_spec
    from workers.jobs import runner as runner_module

    monkeypatch.setattr(runner_module, "virtual_devices_only", lambda: local)
    space = enumerate_candidates(
        dense_spec(), ClusterSpec(num_hosts=1, devices_per_host=4), PlanOptions()
    )
    config = runner_module.RunnerConfig(use_gpus=gpus, devices_per_worker=devices_per_worker)
    job_runner = runner_module.JobRunner(None, config)  # type: ignore[arg-type]
    assert job_runner._pool_config([space]).one_shape == one_shape
