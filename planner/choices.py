"""Submesh and sharding-config choices (Alpa's `get_submesh_choices` and logical shape spaces)."""

import logging
from collections.abc import Sequence

from schemas import PlanOptions, ShardingConfig, StrategyName, SubmeshShape
from schemas.cluster import redundant_strategy
from schemas.sharding import MeshFacts, ShardingStrategy, fill_mesh_axes, mesh_points, resolve_rules

logger = logging.getLogger(__name__)

SUBMESH_SPACES = ("power_of_two", "small_power_of_two", "all", "manual")
CONFIG_SPACES = ("all", "single_node_model_parallel", "data_parallel_only")
DEFAULT_STRATEGIES: tuple[StrategyName, ...] = ("data", "megatron", "fsdp")
SMALL_POWER_OF_TWO_MAX_HOSTS = 4


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def submesh_choices(
    num_hosts: int,
    devices_per_host: int,
    space: str = "power_of_two",
    manual: Sequence[tuple[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """The submesh shapes `(hosts, devices_per_host)` a stage may get, in Alpa's order.

    Every space starts with the single-host slices `(1, 1), (1, 2), (1, 4) ... (1, M)`; then
    whole hosts: "power_of_two" `(2, M), (4, M) ...` up to `num_hosts`; "small_power_of_two"
    the same but at most 4 hosts; "all" `(2, M), (3, M) ... (num_hosts, M)`. "manual" returns
    `manual`, checked to fit the cluster.
    """
    if num_hosts < 1 or devices_per_host < 1:
        raise ValueError(f"need at least one host and device, got {num_hosts}x{devices_per_host}")
    if space not in SUBMESH_SPACES:
        raise ValueError(f"unknown submesh space {space!r}; use one of {SUBMESH_SPACES}")
    if space == "manual":
        return _check_manual(num_hosts, devices_per_host, manual)
    if not _is_power_of_two(devices_per_host):
        raise ValueError(
            f"devices_per_host must be a power of two (Alpa's rule), got {devices_per_host}"
        )
    choices: list[tuple[int, int]] = []
    d = 1
    while d <= devices_per_host:
        choices.append((1, d))
        d *= 2
    if space == "all":
        hosts: list[int] = list(range(2, num_hosts + 1))
    else:
        limit = (
            num_hosts if space == "power_of_two" else min(num_hosts, SMALL_POWER_OF_TWO_MAX_HOSTS)
        )
        hosts = []
        h = 2
        while h <= limit:
            hosts.append(h)
            h *= 2
    choices.extend((h, devices_per_host) for h in hosts)
    return choices


def _check_manual(
    num_hosts: int, devices_per_host: int, manual: Sequence[tuple[int, int]] | None
) -> list[tuple[int, int]]:
    if not manual:
        raise ValueError("the 'manual' submesh space needs a non-empty list of (hosts, devices)")
    out: list[tuple[int, int]] = []
    for item in manual:
        hosts, devices = (int(x) for x in item)
        if hosts < 1 or devices < 1:
            raise ValueError(f"manual submesh {item} must have positive sizes")
        if hosts > num_hosts or devices > devices_per_host:
            raise ValueError(
                f"manual submesh {item} does not fit the {num_hosts}x{devices_per_host} cluster"
            )
        if hosts > 1 and devices != devices_per_host:
            raise ValueError(f"manual submesh {item}: a multi-host submesh must use whole hosts")
        if (hosts, devices) in out:
            raise ValueError(f"manual submesh {item} is listed twice")
        out.append((hosts, devices))
    return out


def _as_tuple(submesh: tuple[int, int] | SubmeshShape) -> tuple[int, int]:
    if isinstance(submesh, SubmeshShape):
        return submesh.as_tuple()
    hosts, devices = submesh
    return int(hosts), int(devices)


def logical_meshes(
    submesh: tuple[int, int] | SubmeshShape, micro_batch_size: int, space: str = "all"
) -> list[tuple[int, int]]:
    """Logical meshes `(dp, tp)` of a submesh, `dp` dividing the micro-batch, decreasing `dp`."""
    if space not in CONFIG_SPACES:
        raise ValueError(f"unknown config space {space!r}; use one of {CONFIG_SPACES}")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    hosts, per_host = _as_tuple(submesh)
    n = hosts * per_host
    meshes = []
    for dp in range(n, 0, -1):
        if n % dp or micro_batch_size % dp:
            continue
        tp = n // dp
        if space == "single_node_model_parallel" and tp > per_host:
            continue
        if space == "data_parallel_only" and tp != 1:
            continue
        meshes.append((dp, tp))
    return meshes


def config_choices(
    submesh: tuple[int, int] | SubmeshShape,
    micro_batch_size: int,
    space: str = "all",
    strategies: Sequence[StrategyName] = DEFAULT_STRATEGIES,
) -> list[ShardingConfig]:
    """The sharding configs measured on a submesh; their list index is the `config_id`.

    Per logical mesh (see `logical_meshes`), the strategies in the given order, skipping the
    redundant ones: "megatron" only when tp > 1, "fsdp" only when dp > 1, "data" only when
    tp == 1 (on a tensor axis it splits nothing: every device of the axis runs the same
    program). Where that leaves the submesh nothing, "data" stays on its largest-dp mesh, so
    a plan can still use the submesh. "data" carries Alpa's option
    `{"force_batch_dim_to_mesh_dim": 0}`.
    """
    if len(set(strategies)) != len(strategies):
        raise ValueError(f"strategies must be unique, got {list(strategies)}")
    meshes = logical_meshes(submesh, micro_batch_size, space)
    configs = [
        _config(dp, tp, name)
        for dp, tp in meshes
        for name in strategies
        if not redundant_strategy(name, dp, tp)
    ]
    if not configs and meshes and "data" in strategies:
        configs = [_config(*meshes[0], "data")]
    return configs


def _config(dp: int, tp: int, name: StrategyName) -> ShardingConfig:
    options = {"force_batch_dim_to_mesh_dim": 0} if name == "data" else {}
    return ShardingConfig(logical_mesh=(dp, tp), strategy=name, options=options)


def _space_allows(tensor: int, per_host: int, space: str) -> bool:
    """Alpa's config spaces on a mesh point: tensor as its `tp`."""
    if space == "data_parallel_only":
        return tensor == 1
    if space == "single_node_model_parallel":
        return tensor <= per_host
    return True


def _one_device_has_data(num_devices: int, options: PlanOptions) -> bool:
    return num_devices == 1 and "data" in options.strategies


def mesh_configs(
    submesh: tuple[int, int] | SubmeshShape,
    micro_batch_size: int,
    options: PlanOptions,
    facts: MeshFacts = MeshFacts(),
) -> list[ShardingConfig]:
    """The mesh-axes configs of a submesh, after `config_choices`' strategies: every mesh
    point of `options.mesh_axes` (`schemas.sharding.mesh_points`) under `options.mesh_rules`,
    then each of the user's `options.shardings` whose sizes resolve on the submesh. `facts`:
    the model's (context only with a sequence, expert only with experts). On one device,
    where nothing is split, the mesh point is left out when today's `data` is there."""
    hosts, per_host = _as_tuple(submesh)
    configs = []
    if options.mesh_axes and not _one_device_has_data(hosts * per_host, options):
        rules = ShardingStrategy(
            name=options.mesh_rules if isinstance(options.mesh_rules, str) else "rules",
            mesh_axes={},
            rules=resolve_rules(options.mesh_rules),
        )
        for sizes in mesh_points(
            hosts,
            per_host,
            micro_batch_size,
            options.mesh_axes,
            options.tensor_across_hosts,
            facts,
        ):
            if _space_allows(sizes["tensor"], per_host, options.config_space):
                configs.append(ShardingConfig.from_strategy(rules, sizes))
    for strategy in options.shardings:
        if strategy.fits(hosts * per_host):
            sizes = fill_mesh_axes(strategy.mesh_axes, hosts * per_host)
            configs.append(ShardingConfig.from_strategy(strategy, sizes))
    return configs


def all_config_choices(
    submesh: tuple[int, int] | SubmeshShape,
    micro_batch_size: int,
    options: PlanOptions,
    facts: MeshFacts = MeshFacts(),
) -> list[ShardingConfig]:
    """Every config of a submesh: today's strategies (`config_choices`), then the mesh-axes
    configs (`mesh_configs`); the list index is the `config_id`."""
    legacy = (
        config_choices(submesh, micro_batch_size, options.config_space, options.strategies)
        if options.strategies
        else []
    )
    return legacy + mesh_configs(submesh, micro_batch_size, options, facts)
