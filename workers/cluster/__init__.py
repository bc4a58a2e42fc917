"""Ray groups and placement: measuring groups of one shape (one actor per host, joined in one
`jax.distributed` group), placed on the cluster's devices, and the pool that runs candidates
on them."""

from workers.cluster.placement import GroupShape, Layout, measuring_nodes
from workers.cluster.pool import (
    KILL_GRACE_S,
    CandidateRetry,
    CandidateTask,
    GroupPool,
    PoolConfig,
    make_layout,
)
from workers.cluster.ray_env import DEVICE_RESOURCE, connect_ray, virtual_devices_only

__all__ = [
    "DEVICE_RESOURCE",
    "KILL_GRACE_S",
    "CandidateRetry",
    "CandidateTask",
    "GroupPool",
    "GroupShape",
    "Layout",
    "PoolConfig",
    "connect_ray",
    "make_layout",
    "measuring_nodes",
    "virtual_devices_only",
]
