"""The cost table: measured results laid out as Alpa's `[L, L, S, C]` arrays."""

import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from planner.candidates import CandidateSpace
from planner.comm import transfer_seconds
from schemas import ClusterSpec, ModelSpec, StageKey, StageProfileResult

logger = logging.getLogger(__name__)

Key = tuple[int, int, int, int]


@dataclass(frozen=True)
class CostTable:
    """Arrays indexed `[start, end_inclusive, submesh, config]`; inf / -1 where not ok.

    `forward`, `backward`: measured seconds; `comm_forward`, `comm_backward`: transfer
    seconds per `[start, end, submesh]` (zeros unless communication is included);
    `max_n_succ_stages`: Alpa's memory rule; `results`: the ok results by key;
    `statuses`: how measuring each measured key ended ("ok", "oom", ...).
    `input_grad`, `weight_grad`: the split backward's B and W seconds (inf where the split
    was not measured); `free_bytes`: device memory left beside the stage's peak, parameters
    and optimizer state (available - peak - initial); `intermediate`, `weight_stash`: bytes
    kept per micro-batch from forward to backward, and from B to W; `fixed_bytes`: peak +
    initial; `available`: device memory (all per device; 0 where not ok).
    """

    forward: NDArray[np.float64]
    backward: NDArray[np.float64]
    comm_forward: NDArray[np.float64]
    comm_backward: NDArray[np.float64]
    max_n_succ_stages: NDArray[np.int64]
    results: Mapping[Key, StageProfileResult]
    statuses: dict[Key, str]
    num_missing: int
    input_grad: NDArray[np.float64]
    weight_grad: NDArray[np.float64]
    free_bytes: NDArray[np.float64]
    intermediate: NDArray[np.float64]
    weight_stash: NDArray[np.float64]
    fixed_bytes: NDArray[np.float64]
    available: NDArray[np.float64]

    @property
    def failures(self) -> Counter[str]:
        """How many measured candidates ended in each failure status."""
        return Counter(s for s in self.statuses.values() if s != "ok")

    @property
    def compute_cost(self) -> NDArray[np.float64]:
        """forward + backward (Alpa's stage cost), seconds."""
        return self.forward + self.backward

    @property
    def dp_cost(self) -> NDArray[np.float64]:
        """What the DP minimises over: compute cost plus transfer time."""
        return self.compute_cost + (self.comm_forward + self.comm_backward)[..., None]

    def stage_seconds(self, key: Key) -> tuple[float, float]:
        """(forward, backward) of a stage including its transfers, seconds."""
        a, b, m, c = key
        return (
            float(self.forward[key] + self.comm_forward[a, b, m]),
            float(self.backward[key] + self.comm_backward[a, b, m]),
        )

    def split_seconds(self, key: Key) -> tuple[float, float, float]:
        """(forward, B, W) of a stage, transfers added to forward and B (inf: not split)."""
        a, b, m, c = key
        return (
            float(self.forward[key] + self.comm_forward[a, b, m]),
            float(self.input_grad[key] + self.comm_backward[a, b, m]),
            float(self.weight_grad[key]),
        )

    def failure_summary(self) -> str:
        """e.g. "12 oom, 3 compile_error, 2 not measured"."""
        parts = [f"{n} {status}" for status, n in sorted(self.failures.items())]
        if self.num_missing:
            parts.append(f"{self.num_missing} not measured")
        return ", ".join(parts) or "none"


def _as_key(key: StageKey | tuple[int, ...]) -> Key:
    if isinstance(key, StageKey):
        return key.as_tuple()
    start, end, m, c = (int(x) for x in key)
    return (start, end, m, c)


def build_cost_table(
    spec: ModelSpec,
    cluster: ClusterSpec,
    space: CandidateSpace,
    results: Mapping[Key, StageProfileResult] | Mapping[StageKey, StageProfileResult],
    include_communication: bool = False,
) -> CostTable:
    """Lay the results out as arrays; a missing or failed candidate is infeasible (inf).

    Each result is seen as this job's devices see it (`for_device_memory` of the cluster's
    device memory): a stored measurement of another job is judged against this job's memory.
    """
    num_layers, num_submeshes = spec.num_layers, len(space.submeshes)
    shape = (num_layers, num_layers, num_submeshes, space.max_configs)
    forward = np.full(shape, np.inf)
    backward = np.full(shape, np.inf)
    mns = np.full(shape, -1, dtype=np.int64)
    split = {name: np.full(shape, np.inf) for name in ("input_grad", "weight_grad")}
    memory = {
        name: np.zeros(shape)
        for name in ("free_bytes", "intermediate", "weight_stash", "fixed_bytes", "available")
    }
    ok: dict[Key, StageProfileResult] = {}
    statuses: dict[Key, str] = {}
    for raw_key, result in results.items():
        key = _as_key(raw_key)
        result = result.for_device_memory(cluster.device_memory_bytes)
        start, end, m, c = key
        if not (0 <= start <= end < num_layers) or not (0 <= m < num_submeshes):
            raise ValueError(f"result key {key} is outside the candidate space")
        if not 0 <= c < len(space.configs[m]):
            raise ValueError(f"result key {key} names no config of submesh {m}")
        fwd, bwd = result.forward_cost, result.backward_cost
        statuses[key] = str(result.status.value)
        if not result.ok:
            continue
        if not (math.isfinite(fwd) and math.isfinite(bwd)):
            statuses[key] = "no_timing"
            logger.warning("result %s is ok but has no forward/backward timing", key)
            continue
        forward[key], backward[key], mns[key] = fwd, bwd, result.max_n_succ_stages
        split["input_grad"][key] = result.input_grad_cost
        split["weight_grad"][key] = result.weight_grad_cost
        fixed = float(result.peak_memory + result.initial_var_size)
        memory["fixed_bytes"][key] = fixed
        memory["available"][key] = float(result.available_memory)
        memory["free_bytes"][key] = float(result.available_memory) - fixed
        memory["intermediate"][key] = float(result.intermediate_size)
        memory["weight_stash"][key] = float(result.weight_stash_size)
        ok[key] = result
    measured = {_as_key(k) for k in results}
    missing = sum(1 for k in space.keys if k.as_tuple() not in measured)
    comm_shape = shape[:3]
    if include_communication:
        comm_forward, comm_backward = transfer_seconds(spec, cluster, space.submeshes)
    else:
        comm_forward, comm_backward = np.zeros(comm_shape), np.zeros(comm_shape)
    return CostTable(
        forward=forward,
        backward=backward,
        comm_forward=comm_forward,
        comm_backward=comm_backward,
        max_n_succ_stages=mns,
        results=ok,
        statuses=statuses,
        num_missing=missing,
        **split,
        **memory,
    )
