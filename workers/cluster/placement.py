"""Where measuring groups run: the Ray nodes that offer devices, and how many groups of a
shape fit on them at once.

A stage on a submesh of H hosts x D devices is measured by a group of H processes with D
devices each, one per node (`GroupShape(H, D)`), when the Ray cluster has H nodes with
devices; otherwise by one process with H x D devices (its hosts emulated, as on one
machine). With `one_shape`, every group is one process of that many devices, whatever the
submesh: the pool of one shape for all (no packing), kept as a baseline.
"""

import logging
from dataclasses import dataclass
from typing import Any

import ray

from schemas import SubmeshShape
from workers.cluster.ray_env import DEVICE_RESOURCE

logger = logging.getLogger(__name__)

GPU_RESOURCE = "GPU"


@dataclass(frozen=True)
class GroupShape:
    """A measuring group: `processes` processes (one per node) of `devices` devices each."""

    processes: int
    devices: int

    def __str__(self) -> str:
        return f"{self.processes} process{'es' if self.processes > 1 else ''} x {self.devices}"


@dataclass(frozen=True)
class NodeCapacity:
    """What one Ray node offers to measuring processes."""

    node_id: str
    devices: int | None  # None: the node does not count devices (any number fits)
    cpus: float


@dataclass(frozen=True)
class Layout:
    """The cluster's measuring nodes and how processes are sized on them."""

    nodes: tuple[NodeCapacity, ...]
    use_gpus: bool = False
    cpus_per_process: float = 1.0
    one_shape: int | None = None  # devices of every process: no packing
    max_groups: int | None = None  # most groups at once

    @property
    def counts_devices(self) -> bool:
        return any(n.devices is not None for n in self.nodes)

    @property
    def device_resource(self) -> str | None:
        """The Ray resource a bundle asks devices of (None: the nodes do not count them)."""
        if self.use_gpus:
            return GPU_RESOURCE
        return DEVICE_RESOURCE if self.counts_devices else None

    def shape_for(self, submesh: SubmeshShape) -> GroupShape:
        """The group that measures `submesh`: one process per host when enough nodes host
        its devices, else one process with all of them."""
        if self.one_shape is not None:
            return GroupShape(1, self.one_shape)
        spread = GroupShape(submesh.hosts, submesh.devices_per_host)
        if submesh.hosts > 1 and self.groups_that_fit(spread) == 0:
            return GroupShape(1, submesh.num_devices)
        return spread

    def groups_that_fit(self, shape: GroupShape) -> int:
        """How many groups of `shape` run at once: each process on its own node of the
        group, with its devices and CPUs (and at most `max_groups`)."""
        slots = [self._slots(n, shape.devices) for n in self.nodes]
        k = 0
        upper = sum(slots) // shape.processes
        while k < upper and sum(min(s, k + 1) for s in slots) >= (k + 1) * shape.processes:
            k += 1
        return k if self.max_groups is None else min(k, self.max_groups)

    def _slots(self, node: NodeCapacity, devices: int) -> int:
        by_cpu = int(node.cpus // self.cpus_per_process) if self.cpus_per_process > 0 else 1 << 20
        by_devices = by_cpu if node.devices is None else node.devices // devices
        return max(0, min(by_cpu, by_devices))

    def bundle(self, shape: GroupShape) -> dict[str, float]:
        """The Ray resources of one process of `shape`."""
        bundle: dict[str, float] = {"CPU": self.cpus_per_process}
        resource = self.device_resource
        if resource is not None:
            bundle[resource] = float(shape.devices)
        return bundle

    def process_resources(self, shape: GroupShape) -> dict[str, Any]:
        """The Ray actor options that ask one process of `shape` for its bundle (`bundle`)."""
        bundle = self.bundle(shape)
        options: dict[str, Any] = {"num_cpus": bundle.pop("CPU")}
        if GPU_RESOURCE in bundle:
            options["num_gpus"] = bundle.pop(GPU_RESOURCE)
        if bundle:
            options["resources"] = bundle
        return options

    def describe(self) -> str:
        def one(n: NodeCapacity) -> str:
            devices = "any" if n.devices is None else str(n.devices)
            return f"{n.node_id[:12]} ({devices} devices, {n.cpus:g} CPUs)"

        return ", ".join(one(n) for n in self.nodes) or "no nodes"


def measuring_nodes(use_gpus: bool) -> tuple[NodeCapacity, ...]:
    """The alive Ray nodes that can run measuring processes, with what they offer.

    On GPUs a node offers its `GPU`s; on CPUs its `stageprof_devices` (virtual devices).
    A CPU cluster none of whose nodes declares that resource (started by hand without it)
    counts CPUs only, as before devices were counted."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    resource = GPU_RESOURCE if use_gpus else DEVICE_RESOURCE
    counted = any(n.get("Resources", {}).get(resource, 0) > 0 for n in nodes)
    out = []
    for n in nodes:
        res = n.get("Resources", {})
        cpus = float(res.get("CPU", 0.0))
        devices = int(res.get(resource, 0)) if counted else None
        if cpus <= 0 or devices == 0:
            continue
        out.append(NodeCapacity(node_id=str(n["NodeID"]), devices=devices, cpus=cpus))
    if not counted:
        logger.info("no Ray node offers %s: processes are placed by CPUs only", resource)
    return tuple(out)
