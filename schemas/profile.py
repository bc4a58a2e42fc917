"""Measurement records: Alpa's `ModuleProfileResult` / `StageProfileResult` fields, plus ours.

Units: seconds for times, bytes for sizes. Alpa's field names are kept unchanged
(compute_cost, peak_memory, ...); fields that are ours carry the unit in the name.
"""

import math
from enum import StrEnum

from pydantic import Field

from schemas.base import Frozen
from schemas.cluster import ShardingConfig, StageKey, SubmeshShape

MAX_SUCC_STAGES = 2**20


class ProfileStatus(StrEnum):
    """How measuring a candidate ended. Anything but `ok` is infeasible for the planner."""

    ok = "ok"
    oom = "oom"
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    worker_lost = "worker_lost"


class ModuleKind(StrEnum):
    """The compiled programs of a stage, in Alpa's order."""

    forward = "forward"
    backward = "backward"
    apply_grad = "apply_grad"
    # Zero-bubble schedules: the backward split by dependency (B: input cotangents; W: the
    # rest, the weight gradients). FLOPs(B) + FLOPs(W) = FLOPs(backward).
    backward_input = "backward_input"
    backward_weight = "backward_weight"


class ModuleProfileResult(Frozen):
    """One compiled module of a stage (Alpa: `ModuleProfileResult`)."""

    module: ModuleKind = Field(description="Which module: forward, backward or apply_grad.")
    compute_cost: float = Field(ge=0, description="Median wall time of one run, seconds.")
    peak_memory: int = Field(ge=0, description="Peak memory per device, bytes.")
    temp_buffer_size: int = Field(ge=0, description="XLA temp buffers per device, bytes.")
    invar_names: tuple[str, ...] = Field(description="Input var names, in argument order.")
    outvar_names: tuple[str, ...] = Field(description="Output var names, in result order.")
    invar_sizes: tuple[int, ...] = Field(description="Per-device bytes of each input.")
    outvar_sizes: tuple[int, ...] = Field(description="Per-device bytes of each output.")
    donated_invars: tuple[bool, ...] = Field(description="Whether each input is donated.")
    acc_grad_invars_indices: tuple[int, ...] = Field(
        (), description="Inputs that are gradient accumulators (Alpa's field)."
    )
    acc_grad_outvars_indices: tuple[int, ...] = Field(
        (), description="Outputs that are accumulated gradients (Alpa's field)."
    )
    available_memory: int = Field(ge=0, description="Memory of one device, bytes.")
    compute_cost_samples_s: tuple[float, ...] = Field(
        (), description="Every timed run, seconds (compute_cost is their median)."
    )
    compute_cost_spread: float = Field(
        0.0, ge=0, description="Relative spread of the timed runs: (p90 - p10) / median."
    )
    compile_seconds: float = Field(0.0, ge=0, description="Time to lower and compile, seconds.")
    compile_cache_hit: bool = Field(
        False,
        description="Whether the executable came from the persistent compilation cache "
        "(`STAGEPROF_COMPILE_CACHE_DIR`) instead of being compiled; compile_seconds is then "
        "the time to lower and load it.",
    )
    flops: float = Field(0.0, ge=0, description="FLOPs per device from cost_analysis().")
    bytes_accessed: float = Field(0.0, ge=0, description="Bytes accessed from cost_analysis().")
    collective_bytes: dict[str, int] = Field(
        default_factory=dict,
        description="Bytes moved per device by each kind of collective (all-reduce, ...).",
    )


class StageProfileResult(Frozen):
    """A measured stage candidate (Alpa: `StageProfileResult`), or why it could not be."""

    status: ProfileStatus = Field(description="ok, or the failure kind.")
    error: str | None = Field(None, description="The error text when status is not ok.")
    fingerprint: str = Field(description="Stage fingerprint; equal fingerprint, same result.")
    key: StageKey | None = Field(None, description="The candidate it was measured as.")
    submesh: SubmeshShape = Field(description="Physical submesh it ran on.")
    config: ShardingConfig = Field(description="Logical mesh and strategy.")
    num_layers: int = Field(ge=1, description="Layers in the stage.")
    module_profile_results: tuple[ModuleProfileResult, ...] = Field(
        (), description="forward, backward, apply_grad (empty when it failed early)."
    )
    available_memory: int = Field(ge=0, description="Memory of one device, bytes.")
    initial_var_size: int = Field(
        0, ge=0, description="Parameters + optimizer state per device, bytes."
    )
    intermediate_size: int = Field(
        0, ge=0, description="Stashed activations per micro-batch per device, bytes."
    )
    weight_stash_size: int = Field(
        0,
        ge=0,
        description="Bytes per device per micro-batch that B keeps for W until W runs: "
        "B's values that W reads and the output cotangents W reads (the stash W also reads "
        "is in intermediate_size, not here); zero-bubble schedules, 0 when the split was "
        "not measured.",
    )
    max_n_succ_stages: int = Field(
        -1, ge=-1, le=MAX_SUCC_STAGES, description="Alpa's 1F1B memory rule; -1 = infeasible."
    )
    input_shardings: dict[str, str] = Field(
        default_factory=dict, description="PartitionSpec of each stage input, as text."
    )
    flops: float = Field(0.0, ge=0, description="FLOPs per device of forward + backward.")
    compile_seconds: float = Field(0.0, ge=0, description="Compile time of all modules, s.")
    compile_cache_hits: int = Field(
        0, ge=0, description="Modules loaded from the persistent compilation cache."
    )
    device_kind: str = Field("", description="Device kind it ran on.")
    jax_version: str = Field("", description="jax version it ran with.")
    measured_by: tuple[str, ...] = Field(
        (),
        description="The processes that ran it, one per host of its submesh: "
        "`<node>:<pid>` (node: the Ray node id's first 12 hex digits, or `local`).",
    )
    estimate_bytes: int | None = Field(
        None, description="Estimated bytes per device when skipped before compiling (oom)."
    )

    @property
    def ok(self) -> bool:
        return self.status == ProfileStatus.ok

    def module(self, kind: ModuleKind) -> ModuleProfileResult | None:
        for m in self.module_profile_results:
            if m.module == kind:
                return m
        return None

    @property
    def forward_cost(self) -> float:
        m = self.module(ModuleKind.forward)
        return m.compute_cost if m and self.ok else math.inf

    @property
    def backward_cost(self) -> float:
        m = self.module(ModuleKind.backward)
        return m.compute_cost if m and self.ok else math.inf

    @property
    def input_grad_cost(self) -> float:
        """B of a split backward, seconds (inf when the split was not measured)."""
        m = self.module(ModuleKind.backward_input)
        return m.compute_cost if m and self.ok else math.inf

    @property
    def weight_grad_cost(self) -> float:
        """W of a split backward, seconds (inf when the split was not measured)."""
        m = self.module(ModuleKind.backward_weight)
        return m.compute_cost if m and self.ok else math.inf

    @property
    def compute_cost(self) -> float:
        """Stage cost for the DP: forward + backward, seconds (inf when not ok)."""
        return self.forward_cost + self.backward_cost

    @property
    def compute_cost_spread(self) -> float:
        """Relative spread of forward + backward: their spreads weighted by their costs."""
        parts = [self.module(k) for k in (ModuleKind.forward, ModuleKind.backward)]
        total = sum(m.compute_cost for m in parts if m)
        if not self.ok or total <= 0:
            return 0.0
        return sum(m.compute_cost * m.compute_cost_spread for m in parts if m) / total

    @property
    def peak_memory(self) -> int:
        return max((m.peak_memory for m in self.module_profile_results), default=0)

    @property
    def pipeline_peak_memory(self) -> int:
        """The forward / backward peak, bytes per device: what Alpa's memory rule weighs
        against the stash (apply_grad runs once per iteration, when nothing is stashed)."""
        kinds = (ModuleKind.forward, ModuleKind.backward)
        return max(
            (m.peak_memory for m in self.module_profile_results if m.module in kinds), default=0
        )

    def for_device_memory(self, available_memory: int) -> "StageProfileResult":
        """This measurement as a job whose devices have `available_memory` bytes sees it.

        A stored result is reused by jobs on other clusters: what the devices did (times,
        peak, stash, FLOPs) is the row's; `available_memory` and `max_n_succ_stages` are the
        asking job's, recomputed here (never read from the job that measured)."""
        succ = -1
        if self.ok:
            succ = max_n_succ_stages(
                available_memory,
                self.pipeline_peak_memory,
                self.initial_var_size,
                self.intermediate_size,
            )
        if succ == self.max_n_succ_stages and available_memory == self.available_memory:
            return self
        return self.model_copy(
            update={"available_memory": available_memory, "max_n_succ_stages": succ}
        )


def max_n_succ_stages(
    available_memory: float, peak_memory: float, initial_var_size: float, intermediate_size: float
) -> int:
    """Alpa's 1F1B rule: how many stages may follow this one before activations overflow.

    ``floor((available - peak - initial) / intermediate) - 1``, clamped to [-1, 2**20];
    any non-finite or negative input gives -1, and zero intermediate means unbounded.
    """
    values = (available_memory, peak_memory, initial_var_size, intermediate_size)
    if any(not math.isfinite(v) or v < 0 for v in values):
        return -1
    free = available_memory - peak_memory - initial_var_size
    if free < 0:
        return -1
    if intermediate_size == 0:
        return MAX_SUCC_STAGES
    n = math.floor(free / intermediate_size) - 1
    return max(-1, min(MAX_SUCC_STAGES, n))
