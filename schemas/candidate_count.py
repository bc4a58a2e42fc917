"""How many stage candidates a job will have, counted without building them.

The same space as `planner.enumerate_candidates` (checked against it in
tests/server/test_admission.py), in closed form: Σ over submeshes of (ranges kept) ×
(sharding configs). The API counts a request's candidates with it before queueing the job,
so a request over the cap is refused at once instead of making a worker enumerate it.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from schemas.cluster import ClusterSpec, StrategyName, redundant_strategy
from schemas.plan import PlanOptions
from schemas.sharding import MeshFacts, mesh_points

SMALL_POWER_OF_TWO_MAX_HOSTS = 4


@dataclass(frozen=True)
class CandidateCount:
    """`total` candidates; `exact` is False when it is an upper bound (layer FLOPs unknown,
    so `layer_imbalance_tolerance` could not be applied)."""

    total: int
    exact: bool
    per_submesh: tuple[int, ...]


def submesh_shapes(
    num_hosts: int,
    devices_per_host: int,
    space: str,
    manual: Sequence[tuple[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """The `(hosts, devices_per_host)` choices of `planner.choices.submesh_choices`
    (manual submeshes as given: their rules are checked on their own)."""
    if space == "manual":
        return [(int(h), int(d)) for h, d in manual or []]
    choices = []
    d = 1
    while d <= devices_per_host:
        choices.append((1, d))
        d *= 2
    if space == "all":
        hosts = list(range(2, num_hosts + 1))
    else:
        limit = (
            num_hosts if space == "power_of_two" else min(num_hosts, SMALL_POWER_OF_TWO_MAX_HOSTS)
        )
        hosts = [2**k for k in range(1, limit.bit_length())]
    choices.extend((h, devices_per_host) for h in hosts)
    return choices


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return tuple(small + large[::-1])


def config_count(
    hosts: int,
    devices_per_host: int,
    micro_batch_size: int,
    space: str,
    strategies: Sequence[StrategyName],
) -> int:
    """Sharding configs of one submesh (`planner.choices.config_choices`, counted):
    per logical mesh `(dp, tp)` with dp dividing both the device count and the micro-batch,
    "data" when tp == 1, "megatron" when tp > 1, "fsdp" when dp > 1; "data" on the
    largest-dp mesh when that leaves none."""
    n = hosts * devices_per_host
    count = 0
    any_mesh = False
    for dp in _divisors(math.gcd(n, max(micro_batch_size, 1))):
        tp = n // dp
        if space == "single_node_model_parallel" and tp > devices_per_host:
            continue
        if space == "data_parallel_only" and tp != 1:
            continue
        count += sum(not redundant_strategy(name, dp, tp) for name in strategies)
        any_mesh = True
    if count == 0 and any_mesh and "data" in strategies:
        return 1  # "data" kept on the largest-dp mesh, so the submesh has a config
    return count


def mesh_config_count(
    hosts: int,
    devices_per_host: int,
    micro_batch_size: int,
    options: PlanOptions,
    facts: MeshFacts = MeshFacts(),
) -> int:
    """Mesh-axes configs of one submesh (`planner.choices.mesh_configs`, counted)."""
    count = 0
    one_device_data = hosts * devices_per_host == 1 and "data" in options.strategies
    if options.mesh_axes and not one_device_data:
        for p in mesh_points(
            hosts,
            devices_per_host,
            micro_batch_size,
            options.mesh_axes,
            options.tensor_across_hosts,
            facts,
        ):
            tensor = p["tensor"]
            if options.config_space == "data_parallel_only" and tensor != 1:
                continue
            if options.config_space == "single_node_model_parallel" and tensor > devices_per_host:
                continue
            count += 1
    return count + sum(s.fits(hosts * devices_per_host) for s in options.shardings)


def _keep(
    range_flops: float, total: float, n: int, cluster_n: int, tol: float
) -> tuple[bool, bool]:
    """(not too large, not too small): the two halves of `planner.candidates.keep_range`."""
    source_ratio = n / cluster_n
    flops_ratio = range_flops / total
    return flops_ratio / (1 + tol) <= source_ratio, source_ratio <= flops_ratio * (1 + tol)


def ranges_kept(
    prefix: Sequence[float], submesh_devices: int, cluster_devices: int, tolerance: float | None
) -> int:
    """Ranges (start, end) of `len(prefix) - 1` layers a non-whole submesh keeps under Alpa's
    imbalance rule; `prefix[i]` is the FLOPs of layers 0..i-1. Both halves of the rule are
    monotone in the range's FLOPs, so two pointers count them in O(layers)."""
    num_layers = len(prefix) - 1
    total = prefix[-1]
    if tolerance is None or total <= 0:
        return num_layers * (num_layers + 1) // 2

    def keep(start: int, end: int) -> tuple[bool, bool]:
        flops = prefix[end + 1] - prefix[start]
        return _keep(flops, total, submesh_devices, cluster_devices, tolerance)

    count, lo, hi = 0, 0, -1
    for start in range(num_layers):
        lo = max(lo, start)
        while lo < num_layers and not keep(start, lo)[1]:
            lo += 1
        hi = max(hi, start - 1)
        while hi + 1 < num_layers and keep(start, hi + 1)[0]:
            hi += 1
        count += max(0, hi - lo + 1)
    return count


def count_candidates(
    num_layers: int,
    cluster: ClusterSpec,
    options: PlanOptions,
    micro_batch_size: int,
    layer_flops: Sequence[float] | None = None,
    remat_choices: int = 1,
    facts: MeshFacts | None = None,
) -> CandidateCount:
    """The number of stage candidates `planner.enumerate_candidates` makes.

    `remat_choices`: how many remat variants each sharding config is measured under
    (`planner.remat_choices`; 1 when the spec carries none).

    `layer_flops` (one per layer) applies `options.layer_imbalance_tolerance`; without them
    the count is an upper bound when a tolerance is set. `facts`: the model's
    (`ModelSpec.mesh_facts`); without them, mesh-axes configs with context or expert are
    counted as if the model had both (an upper bound).
    """
    tolerance = options.layer_imbalance_tolerance
    prefix: list[float] | None = None
    if layer_flops is not None:
        prefix = [0.0]
        for f in layer_flops:
            prefix.append(prefix[-1] + f)
    cluster_n = cluster.num_devices
    all_ranges = num_layers * (num_layers + 1) // 2
    per_submesh = []
    for hosts, per_host in submesh_shapes(
        cluster.num_hosts, cluster.devices_per_host, options.submesh_space, options.manual_submeshes
    ):
        n = hosts * per_host
        configs = remat_choices * (
            config_count(
                hosts, per_host, micro_batch_size, options.config_space, options.strategies
            )
            + mesh_config_count(hosts, per_host, micro_batch_size, options, facts or MeshFacts())
        )
        if n == cluster_n:
            ranges = 1
            if prefix is not None and tolerance is not None and prefix[-1] > 0:
                ranges = int(all(_keep(prefix[-1] - prefix[0], prefix[-1], n, n, tolerance)))
        elif prefix is not None:
            ranges = ranges_kept(prefix, n, cluster_n, tolerance)
        else:
            ranges = all_ranges
        per_submesh.append(ranges * configs)
    exact = tolerance is None or prefix is not None
    if facts is None and {"context", "expert"} & set(options.mesh_axes or []):
        exact = False
    return CandidateCount(total=sum(per_submesh), exact=exact, per_submesh=tuple(per_submesh))
