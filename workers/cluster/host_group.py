"""A measuring group: the processes that measure a stage as one SPMD program.

A group of shape H x D is H Ray actors, one per bundle of a STRICT_SPREAD placement group
(so one per node), each with D devices. Rank 0 picks `node_ip:free_port`; every rank calls
`jax.distributed.initialize` with it before anything touches its backend (gloo collectives
on CPU devices, NCCL on GPUs), and from then on they compile and run each candidate together
over the H x D mesh. A process cannot join a second group, so a group lives for one shape
and is respawned as a whole: after a shape, a death, or a timeout. Its result is the slowest
host's timing, with every process in `measured_by`.
"""

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import ObjectRef
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from schemas import ClusterSpec, ModelSpec, PlanOptions, StageKey, StageProfileResult
from schemas.settings import env_forwarded, env_name
from workers.cluster.placement import GroupShape, Layout

logger = logging.getLogger(__name__)

# Measurement settings of this process that its actors follow (workers.measure.quiet, timing,
# compile_cache, compose_scan).
FORWARDED_SETTINGS = (
    "quiet_timing",
    "lock_dir",
    "timing_clock",
    "compile_cache_dir",
    "scan_stages",
)
# A backstop only: the group start kills a group's ranks as soon as one dies while joining.
JOIN_TIMEOUT_S = 120
# Test hook (tests/multihost): with STAGEPROF_TEST_HOLD_JOIN=<dir>, each rank of a group
# writes `<dir>/join-<coordinator port>-<rank>-<pid>` as it joins, and the first rank > 0 to
# create `<dir>/held` writes `<port> <pid>` there and sleeps `HOLD_JOIN_S` before joining,
# so a test can kill it while its peers wait in `jax.distributed.initialize`.
HOLD_JOIN_ENV = "STAGEPROF_TEST_HOLD_JOIN"
HOLD_JOIN_S = 30.0


def worker_env(devices: int, use_gpus: bool, rank: int = 0) -> dict[str, str]:
    """Environment of an actor process: N virtual CPU devices unless it has GPUs, and this
    process's measurement settings (`FORWARDED_SETTINGS`). Only rank 0 of a group takes the
    machine's quiet-timing lock: ranks of one group that share a machine would otherwise
    wait for each other inside a collective."""
    forwarded = env_forwarded(FORWARDED_SETTINGS)
    if HOLD_JOIN_ENV in os.environ:
        forwarded[HOLD_JOIN_ENV] = os.environ[HOLD_JOIN_ENV]
    if rank > 0:
        forwarded[env_name("quiet_timing")] = "0"
    if use_gpus:
        return forwarded
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "xla_force_host_platform_device_count" not in f)
    flags = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", **forwarded}


class HostWorker:
    """Ray actor body: one process of a measuring group (rank `rank` of `size`)."""

    def __init__(self, rank: int, size: int, use_gpus: bool) -> None:
        self.rank, self.size, self.use_gpus = rank, size, use_gpus
        self.ident = f"{ray.get_runtime_context().get_node_id()[:12]}:{os.getpid()}"
        self._spec_cache: dict[str, ModelSpec] = {}

    def coordinator_address(self) -> str:
        """`node_ip:port` of a port free on this node, for the group's coordinator."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def join(self, coordinator: str | None) -> dict[str, Any]:
        """Turn the persistent compilation cache on (or off), join the group (a no-op for a
        group of one), then report the devices. Importing jax and the measuring code and
        making the devices run as a compile would (`compile_slot`): another actor's timing
        waits for them, where a job's first groups measure while the later ones start."""
        from workers.measure.quiet import compile_slot

        with compile_slot(JOIN_TIMEOUT_S):
            import jax

            import workers.measure.stage  # noqa: F401  (what `measure` imports)
            from workers.measure.compile_cache import enable_compile_cache

            cache_dir = enable_compile_cache()
        if self.size > 1:
            _hold_join(coordinator or "", self.rank)
            if not self.use_gpus:
                jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(
                coordinator,
                num_processes=self.size,
                process_id=self.rank,
                initialization_timeout=JOIN_TIMEOUT_S,
            )
        with compile_slot(JOIN_TIMEOUT_S):
            devices = jax.devices()
        return {
            "device_kind": devices[0].device_kind,
            "num_devices": len(devices),
            "local_devices": jax.local_device_count(),
            "jax_version": jax.__version__,
            "pid": os.getpid(),
            "process": self.ident,
            "compile_cache_dir": cache_dir,
        }

    def measure(
        self,
        model_key: str,
        spec: ModelSpec,
        fingerprint: str,
        key: StageKey,
        cluster: ClusterSpec,
        options: PlanOptions,
    ) -> StageProfileResult:
        import jax

        from workers.measure.stage import measure_stage

        spec = self._spec_cache.setdefault(model_key, spec)
        result = measure_stage(spec, key, cluster, options, devices=jax.devices())
        return result.model_copy(
            update={"fingerprint": fingerprint, "key": key, "measured_by": (self.ident,)}
        )


def _hold_join(coordinator: str, rank: int) -> None:
    """The `HOLD_JOIN_ENV` test hook (a no-op unless it is set)."""
    hold = os.environ.get(HOLD_JOIN_ENV)
    if not hold:
        return
    import time

    port, pid = coordinator.rsplit(":", 1)[-1], os.getpid()
    with open(os.path.join(hold, f"join-{port}-{rank}-{pid}"), "w"):
        pass
    if rank == 0:
        return
    try:
        fd = os.open(os.path.join(hold, "held"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{port} {pid}")
    time.sleep(HOLD_JOIN_S)


@dataclass
class MeasuringGroup:
    """The actors of one group in their placement group, and the candidate they run."""

    shape: GroupShape
    pg: PlacementGroup
    actors: list[Any] = field(default_factory=list)  # Ray actor handles of HostWorker
    infos: list[dict[str, Any]] = field(default_factory=list)  # each rank's `join` answer
    task: Any = None
    refs: list[ObjectRef] = field(default_factory=list)
    started: float = 0.0
    first_done: float | None = None  # when the first rank answered (others still running)

    def spawn(self, layout: Layout) -> ObjectRef | None:
        """Start one actor per bundle; returns the ref of rank 0's coordinator address
        (None for a group of one)."""
        cls = ray.remote(HostWorker)
        size = self.shape.processes
        self.actors = []
        for rank in range(size):
            opts: dict[str, Any] = {
                **layout.process_resources(self.shape),
                "runtime_env": {"env_vars": worker_env(self.shape.devices, layout.use_gpus, rank)},
                "max_restarts": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=rank
                ),
            }
            self.actors.append(cls.options(**opts).remote(rank, size, layout.use_gpus))
        self.infos = []
        return self.actors[0].coordinator_address.remote() if size > 1 else None

    def join(self, coordinator: str | None) -> list[ObjectRef]:
        """Ask every rank to join the group; returns the refs of their answers."""
        return [a.join.remote(coordinator) for a in self.actors]

    def joined(self, infos: list[dict[str, Any]]) -> None:
        self.infos = infos

    @property
    def info(self) -> dict[str, Any] | None:
        """Rank 0's `join` answer (None until the group joined)."""
        return self.infos[0] if self.infos else None

    @property
    def processes(self) -> list[str]:
        """`node:pid` of each rank, once joined."""
        return [i["process"] for i in self.infos]

    @property
    def pids(self) -> list[int]:
        return [int(i["pid"]) for i in self.infos]

    def kill(self) -> None:
        """Kill every process of the group (its placement group stays reserved)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors, self.refs, self.task, self.first_done = [], [], None, None


def combine(results: list[StageProfileResult]) -> StageProfileResult:
    """One group's result from its ranks': the first failure if any failed, else the
    slowest host's timing of each module, loaded from the compilation cache only if every
    rank loaded it; `measured_by` names every process."""
    processes = tuple(p for r in results for p in r.measured_by)
    failed = [r for r in results if not r.ok]
    if failed:
        return failed[0].model_copy(update={"measured_by": processes})
    first = results[0]
    modules = []
    for i, module in enumerate(first.module_profile_results):
        ranks = [r.module_profile_results[i] for r in results if len(r.module_profile_results) > i]
        slowest = max(ranks, key=lambda m: m.compute_cost) if ranks else module
        loaded = all(m.compile_cache_hit for m in ranks)
        modules.append(slowest.model_copy(update={"compile_cache_hit": loaded}))
    return first.model_copy(
        update={
            "module_profile_results": tuple(modules),
            "measured_by": processes,
            "compile_cache_hits": sum(m.compile_cache_hit for m in modules),
        }
    )
