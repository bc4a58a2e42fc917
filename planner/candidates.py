"""The candidate space of a job: every (start, end) range × submesh × sharding config."""

import logging
from dataclasses import dataclass

from planner.choices import all_config_choices, submesh_choices
from schemas import (
    REMAT_VARIANTS,
    ClusterSpec,
    ModelSpec,
    PlanOptions,
    ShardingConfig,
    StageKey,
    SubmeshShape,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CandidateSpace:
    """What a job measures. `configs[m]` are submesh `m`'s configs; `keys` in profiling order."""

    submeshes: list[SubmeshShape]
    configs: list[list[ShardingConfig]]
    keys: list[StageKey]

    @property
    def max_configs(self) -> int:
        """C of the cost tensor: the most configs any submesh has."""
        return max((len(c) for c in self.configs), default=0)

    def resolve(
        self, key: StageKey | tuple[int, int, int, int]
    ) -> tuple[SubmeshShape, ShardingConfig]:
        """The submesh and config a key names; IndexError when it names none."""
        _, _, m, c = key.as_tuple() if isinstance(key, StageKey) else key
        if not 0 <= m < len(self.submeshes):
            raise IndexError(f"submesh_id {m} out of range (have {len(self.submeshes)})")
        if not 0 <= c < len(self.configs[m]):
            raise IndexError(
                f"config_id {c} out of range for submesh {self.submeshes[m]} "
                f"(have {len(self.configs[m])})"
            )
        return self.submeshes[m], self.configs[m][c]

    def is_remat(self, key: StageKey | tuple[int, int, int, int]) -> bool:
        """Whether the key's config runs its layers under a remat variant."""
        return self.resolve(key)[1].remat != "as_written"


def keep_range(
    range_flops: float,
    total_flops: float,
    submesh_devices: int,
    cluster_devices: int,
    tolerance: float | None,
) -> bool:
    """Alpa's `stage_imbalance_tolerance` rule.

    The stage's share of the devices must lie within a factor `1 + tolerance` of its share of
    the FLOPs: skip when `devices share > flops share × (1 + tol)` or
    `devices share < flops share / (1 + tol)`. No tolerance, or no FLOPs known, keeps all.
    """
    if tolerance is None or total_flops <= 0:
        return True
    source_ratio = submesh_devices / cluster_devices
    flops_ratio = range_flops / total_flops
    return flops_ratio / (1 + tolerance) <= source_ratio <= flops_ratio * (1 + tolerance)


def remat_choices(spec: ModelSpec, remat: str) -> list[str]:
    """The remat variants stages of `spec` are measured under for `PlanOptions.remat`:
    "auto": as_written and every variant some layer carries; else just that one. Raises
    `ValueError` for a variant no layer carries."""
    carried = [v for v in REMAT_VARIANTS if any(v in layer.remat_variants for layer in spec.layers)]
    if remat == "auto":
        return ["as_written", *carried]
    if remat != "as_written" and remat not in carried:
        raise ValueError(
            f"remat: no layer of the model carries the {remat!r} variant; trace it with "
            f"client.trace(..., remat_variants=({remat!r},)) (carried: {carried or 'none'})"
        )
    return [remat]


def enumerate_candidates(
    spec: ModelSpec, cluster: ClusterSpec, options: PlanOptions
) -> CandidateSpace:
    """Every stage candidate of `spec` on `cluster`, largest submesh first (as Alpa profiles).

    A submesh using the whole cluster gets only the range (0, L-1) (Alpa's rule); the
    optional `options.layer_imbalance_tolerance` drops ranges far from a balanced share.
    Within a submesh, keys are ordered by start, end, config.
    """
    options.check_micro_batch(spec.micro_batch_size)
    shapes = submesh_choices(
        cluster.num_hosts,
        cluster.devices_per_host,
        options.submesh_space,
        options.manual_submeshes,
    )
    submeshes = [SubmeshShape(hosts=h, devices_per_host=d) for h, d in shapes]
    remats = remat_choices(spec, options.remat)
    configs = [
        [
            c.model_copy(update={"remat": r})
            for r in remats
            for c in all_config_choices(s, spec.micro_batch_size, options, spec.mesh_facts)
        ]
        for s in submeshes
    ]
    num_layers = spec.num_layers
    prefix = [0.0]
    for layer in spec.layers:
        prefix.append(prefix[-1] + layer.flops)
    total = prefix[-1]
    if options.layer_imbalance_tolerance is not None and total <= 0:
        logger.warning("layer_imbalance_tolerance ignored: the spec's layers carry no FLOPs")
    order = sorted(range(len(submeshes)), key=lambda m: -submeshes[m].num_devices)
    keys: list[StageKey] = []
    for m in order:
        n = submeshes[m].num_devices
        whole = n == cluster.num_devices
        for start in range(num_layers):
            for end in range(start, num_layers):
                if whole and (start, end) != (0, num_layers - 1):
                    continue
                flops = prefix[end + 1] - prefix[start]
                if not keep_range(
                    flops, total, n, cluster.num_devices, options.layer_imbalance_tolerance
                ):
                    continue
                keys.extend(
                    StageKey(start=start, end=end, submesh_id=m, config_id=c)
                    for c in range(len(configs[m]))
                )
    logger.info(
        "%d candidates: %d layers, %d submeshes, up to %d configs",
        len(keys),
        num_layers,
        len(submeshes),
        max((len(c) for c in configs), default=0),
    )
    return CandidateSpace(submeshes=submeshes, configs=configs, keys=keys)
