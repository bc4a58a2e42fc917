"""Plan requests and plans: what the planner answers, also usable as manual input."""

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from schemas.base import TEXT_PATTERN, Frozen
from schemas.cluster import (
    MAX_DEVICES_PER_HOST,
    MAX_HOSTS,
    ClusterSpec,
    ShardingConfig,
    StageKey,
    StrategyName,
    SubmeshShape,
)
from schemas.limits import MAX_MANUAL_SUBMESHES
from schemas.model import ModelSpec
from schemas.sharding import MeshAxisName, Rules, ShardingStrategy, check_rule_table
from schemas.zoo_sizes import ZOO_SIZES

SubmeshSpace = Literal["power_of_two", "small_power_of_two", "all", "manual"]
ConfigSpace = Literal["all", "single_node_model_parallel", "data_parallel_only"]
OptimizerName = Literal["sgd", "adam"]
ScheduleName = Literal["1f1b", "gpipe", "interleaved", "zb-h1"]
# The schedules a plan request may ask for: one of them, or "auto" (the best in simulated time).
ScheduleChoice = Literal["auto", "1f1b", "gpipe", "interleaved", "zb-h1"]
TrainerName = Literal["maxtext", "jaxpp"]
# How a job chooses what to measure (PlanOptions.search).
SearchMode = Literal["estimate", "prune", "exhaustive"]
ZERO_BUBBLE_SCHEDULES: frozenset[str] = frozenset({"zb-h1"})
MAX_VIRTUAL_STAGES = 16
MAX_MICROBATCHES = 4096
MAX_MEASURE_STAGES = 256  # PlanOptions.measure_stages
MAX_AUTO_MICROBATCHES = 64  # microbatch_search "auto": counts up to this
MAX_MICROBATCH_CHOICES = 32  # microbatch_search: most counts listed
ALL_STRATEGIES: tuple[StrategyName, ...] = ("data", "megatron", "fsdp")


# The counts `PlanOptions.microbatch_search` lists (unique: checked by its validator).
MicrobatchCounts = Annotated[
    list[Annotated[int, Field(ge=1, le=MAX_MICROBATCHES)]],
    Field(min_length=1, max_length=MAX_MICROBATCH_CHOICES),
]

ManualSubmesh = tuple[
    Annotated[int, Field(ge=1, le=MAX_HOSTS)],
    Annotated[int, Field(ge=1, le=MAX_DEVICES_PER_HOST)],
]


class PlanOptions(Frozen):
    """How to enumerate, measure and plan.

    A job may have at most `STAGEPROF_MAX_CANDIDATES` stage candidates (default 20000):
    ranges of layers × submeshes × sharding configs; a request with more is refused (422).
    """

    num_microbatches: int = Field(
        4, ge=1, le=MAX_MICROBATCHES, description="Micro-batches per iteration (B)."
    )
    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Global batch; must equal micro-batch size × num_microbatches (unless "
        "microbatch_search is set). Default: the spec's micro-batch size × num_microbatches.",
    )
    microbatch_search: Literal["auto"] | MicrobatchCounts | None = Field(
        None,
        description="Search the number of micro-batches at the fixed global batch (above): "
        f"'auto' plans every divisor of it from 1 to {MAX_AUTO_MICROBATCHES}, a list plans "
        "those counts (each must divide it); each count B runs micro-batches of global "
        "batch / B, measured from the model's layers at that size (a spec with a symbolic "
        "batch dimension, or a zoo model). The fastest plan in simulated time answers; "
        "null: num_microbatches is fixed.",
        json_schema_extra={"uniqueItems": True},
    )
    submesh_space: SubmeshSpace = Field("power_of_two", description="Submesh choices (Alpa).")
    manual_submeshes: list[ManualSubmesh] | None = Field(
        None,
        max_length=MAX_MANUAL_SUBMESHES,
        description="(hosts, devices_per_host) choices when submesh_space is 'manual', each "
        "dividing the cluster: one host with devices dividing devices_per_host, or whole "
        "hosts (devices = devices_per_host) with hosts dividing num_hosts; no duplicates.",
        json_schema_extra={"uniqueItems": True},
    )
    config_space: ConfigSpace = Field(
        "all", description="Logical meshes tried per submesh (Alpa's logical shape space)."
    )
    strategies: list[StrategyName] = Field(
        default_factory=lambda: list(ALL_STRATEGIES),
        description="Today's sharding strategies tried on each logical mesh (dp, tp), each "
        "once; may be empty when mesh_axes or shardings give configs.",
        json_schema_extra={"uniqueItems": True},
    )
    mesh_axes: list[MeshAxisName] | None = Field(
        None,
        description="Mesh axes searched per submesh besides the strategies: every split of "
        "the submesh's devices over these axes (at most two of them larger than 1; data x "
        "fsdp x expert dividing the micro-batch; tensor within a host unless "
        "tensor_across_hosts; data with fsdp only as data across hosts), each under "
        "mesh_rules. Null: none.",
        json_schema_extra={"uniqueItems": True},
    )
    mesh_rules: str | Rules = Field(
        "maxtext",
        description="The logical-axis rules of the mesh_axes configs: a preset name "
        "('maxtext': MaxText's default logical_axis_rules; 'pure-fsdp') or a table "
        "{logical name: [mesh axes]}.",
    )
    shardings: list[ShardingStrategy] = Field(
        default_factory=list,
        max_length=64,
        description="The user's own sharding configs (mesh axis sizes and rules), each tried "
        "on every submesh whose device count its sizes resolve to.",
    )
    tensor_across_hosts: bool = Field(
        False, description="Let the mesh_axes search split tensor across hosts."
    )
    optimizer: OptimizerName = Field("adam", description="Optimizer of the apply_grad module.")
    repeats: int = Field(
        5, ge=1, le=1000, description="Least number of timed runs per module (then adaptive)."
    )
    max_repeats: int = Field(
        40,
        ge=1,
        le=1000,
        description="Most timed runs per module: runs are added until the relative spread "
        "(p90 - p10) / median is under target_spread or this cap is reached.",
    )
    target_spread: float = Field(
        0.05, gt=0, le=10, description="Relative spread (p90 - p10) / median to reach."
    )
    warmup: int = Field(1, ge=0, le=100, description="Untimed runs before timing.")
    candidate_timeout_s: float = Field(
        300.0, gt=0, le=86400, description="Wall-clock limit per candidate, seconds."
    )
    layer_imbalance_tolerance: float | None = Field(
        None,
        gt=0,
        description="Skip ranges whose FLOPs exceed this × the balanced share (Alpa's "
        "stage_imbalance_tolerance); null keeps every range.",
    )
    include_communication: bool = Field(
        False, description="Add inter-stage activation transfer time (Alpa ignores it)."
    )
    schedule: ScheduleChoice = Field(
        "auto",
        description="Pipeline schedule: one of 1f1b, gpipe, interleaved, zb-h1, or auto (the "
        "best plan of each is simulated and the fastest chosen).",
    )
    remat: Literal["auto", "as_written", "full", "dots"] = Field(
        "auto",
        description="Rematerialization per stage: auto (the planner chooses each stage's "
        "variant under the schedule's memory rule), or every stage as_written / full / dots.",
    )
    virtual_stages: int | None = Field(
        None,
        ge=1,
        le=MAX_VIRTUAL_STAGES,
        description="Model chunks per device group for the interleaved schedule (v); "
        "default: chosen by the planner.",
    )
    target: TrainerName | None = Field(
        None,
        description="The trainer the plan is for: 'maxtext' adds the best plan MaxText can "
        "run (uniform stages of the repeated blocks; the estimate search verifies it as it "
        "verifies the unrestricted plan; with search 'prune' it turns pruning off unless "
        "set); 'jaxpp' marks the plan for JaxPP.",
    )
    outside_layers: bool = Field(
        True,
        description="Let the search run the layers before and after the repeated blocks "
        "(embedding, head) on every device outside the pipeline, as MaxText does, where "
        "that is faster: their one-layer stages on all devices are measured too. Not for "
        "target 'jaxpp' (JaxPP pipelines every layer). false: every layer in the pipeline "
        "(Alpa's space; such a plan always has Alpa's ManualStageOption form).",
    )
    prune: bool = Field(
        True,
        description="Skip candidates that cannot be in a plan better than one already "
        "measured (B × the largest measured time of a sub-range exceeds that plan's cost).",
    )
    prune_margin: float = Field(
        0.1, ge=0, le=10, description="Safety margin of the pruning bound, a fraction."
    )
    search: SearchMode = Field(
        "estimate",
        description="What the job measures: 'estimate' measures every distinct layer (and "
        "adjacent pair) alone, estimates every stage from them and measures only the stages "
        "of the plans that could be best within the estimates' observed error; 'prune' "
        "measures every stage that could still be in a better plan; 'exhaustive' measures "
        "every candidate (the plan is the same search over a full table). prune: false "
        "means exhaustive.",
    )

    measure_stages: list[StageKey] = Field(
        default_factory=list,
        max_length=MAX_MEASURE_STAGES,
        description="Stage candidates the job measures whatever its search decides (e.g. "
        "`stageprof gate` asks for its baseline plan's stages, so its verdict rests on "
        "measurements only). A key whose `end` is not a layer of the model is refused (422) "
        "when the model is known at request time (`model`, `model_id`); a zoo model is built "
        "by the runner, which ignores any key that is not a candidate of the job.",
    )

    @field_validator("strategies", "mesh_axes")
    @classmethod
    def _unique_strategies(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"must be unique, got {v}")
        return v

    @field_validator("mesh_rules")
    @classmethod
    def _mesh_rules(cls, v: str | Rules) -> str | Rules:
        return check_rule_table(v)

    @field_validator("shardings")
    @classmethod
    def _unique_shardings(cls, v: list[ShardingStrategy]) -> list[ShardingStrategy]:
        names = [s.name for s in v]
        if len(set(names)) != len(names):
            raise ValueError(f"sharding names must be unique, got {names}")
        return v

    @field_validator("microbatch_search")
    @classmethod
    def _microbatch_choices(cls, v: object) -> object:
        if isinstance(v, list):
            if len(set(v)) != len(v):
                raise ValueError(f"counts must be unique, got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "PlanOptions":
        search = self.microbatch_search
        if isinstance(search, list) and self.global_batch_size is not None:
            bad = [b for b in search if self.global_batch_size % b]
            if bad:
                raise ValueError(
                    f"microbatch_search: {bad} do not divide global_batch_size "
                    f"({self.global_batch_size})"
                )
        if search is not None and self.measure_stages:
            raise ValueError(
                "measure_stages: its keys name config ids of one count's space, and each "
                "count of microbatch_search has its own; give a fixed num_microbatches"
            )
        fixed = search is None and self.global_batch_size is not None
        if fixed and self.global_batch_size % self.num_microbatches:  # type: ignore[operator]
            raise ValueError(
                f"num_microbatches ({self.num_microbatches}) must divide global_batch_size "
                f"({self.global_batch_size})"
            )
        if self.submesh_space == "manual" and not self.manual_submeshes:
            raise ValueError("manual_submeshes is required when submesh_space is 'manual'")
        if not self.strategies and not self.mesh_axes and not self.shardings:
            raise ValueError("give at least one of strategies, mesh_axes, shardings")
        return self

    @model_validator(mode="before")
    @classmethod
    def _maxtext_measures_all(cls, data: Any) -> Any:
        """A MaxText plan needs the uniform stages, which pruning (judged against the
        unrestricted plan) may skip: `target: maxtext` with `search: prune` turns pruning
        off unless set (the estimate search verifies MaxText's best plan itself)."""
        if (
            isinstance(data, dict)
            and data.get("target") == "maxtext"
            and data.get("search") == "prune"
            and "prune" not in data
        ):
            data = {**data, "prune": False}
        if isinstance(data, dict) and data.get("prune") is False and "search" not in data:
            data = {**data, "search": "exhaustive"}
        return data

    @property
    def search_mode(self) -> SearchMode:
        """The search this job runs: `search`, except that prune: false measures everything."""
        return "exhaustive" if not self.prune else self.search

    @property
    def allows_outside(self) -> bool:
        """Whether plans may run the layers around the blocks outside the pipeline."""
        return self.outside_layers and self.target != "jaxpp"

    @property
    def measures_split_backward(self) -> bool:
        """Whether stages are also measured with their backward split into B and W (the
        zero-bubble schedules need it; `auto` considers them)."""
        return self.schedule == "auto" or self.schedule in ZERO_BUBBLE_SCHEDULES

    @property
    def splits_backward_on_demand(self) -> bool:
        """Whether stages may be measured without the split backward first, measured split
        only where a zero-bubble plan that could be best rests on them: `schedule: auto`
        with the estimate search (see `planner.split_estimate`)."""
        return self.schedule == "auto" and self.search_mode == "estimate"

    def without_split_backward(self) -> "PlanOptions":
        """These options for a measurement without the split backward (only the schedule
        decides the split: 1F1B needs none)."""
        return self.model_copy(update={"schedule": "1f1b"})

    def global_batch(self, micro_batch_size: int) -> int:
        """The global batch of a model traced at `micro_batch_size`."""
        if self.global_batch_size is not None:
            return self.global_batch_size
        return micro_batch_size * self.num_microbatches

    def microbatch_counts(self, micro_batch_size: int) -> list[int]:
        """The counts of micro-batches this job plans, ascending: the fixed one, or those
        `microbatch_search` gives (divisors of the global batch). Raises ValueError for a
        listed count that does not divide the global batch."""
        batch = self.global_batch(micro_batch_size)
        search = self.microbatch_search
        if search is None:
            return [self.num_microbatches]
        if search == "auto":
            return [b for b in range(1, min(batch, MAX_AUTO_MICROBATCHES) + 1) if batch % b == 0]
        bad = [b for b in search if batch % b]
        if bad:
            raise ValueError(
                f"microbatch_search: {bad} do not divide the global batch {batch} (micro-batch "
                f"{micro_batch_size} x num_microbatches {self.num_microbatches})"
            )
        return sorted(search)

    def count_sizes(self, micro_batch_size: int) -> list[tuple[int, int]]:
        """Each count of `microbatch_counts` with its micro-batch size (the global batch
        divided by the count), for a model traced at `micro_batch_size`."""
        batch = self.global_batch(micro_batch_size)
        return [(count, batch // count) for count in self.microbatch_counts(micro_batch_size)]

    def at_count(self, count: int, micro_batch_size: int) -> "PlanOptions":
        """These options with `count` micro-batches fixed, at the same global batch."""
        batch = self.global_batch(micro_batch_size)
        return self.model_copy(
            update={
                "num_microbatches": count,
                "global_batch_size": batch,
                "microbatch_search": None,
            }
        )

    def check_micro_batch(self, micro_batch_size: int) -> None:
        """Raise ValueError when the global batch disagrees with the spec's micro-batch."""
        if self.microbatch_search is not None:
            self.microbatch_counts(micro_batch_size)
            return
        if self.global_batch_size is None:
            return
        mb = self.global_batch_size // self.num_microbatches
        if mb != micro_batch_size:
            raise ValueError(
                f"global_batch_size / num_microbatches = {mb}, but the model was traced at "
                f"micro-batch {micro_batch_size}"
            )


class ZooRef(Frozen):
    """A model from the server-side zoo, by name with overrides."""

    name: str = Field(
        min_length=1,
        max_length=64,
        description="Zoo model name, e.g. 'gpt'.",
        json_schema_extra={"enum": [*sorted(ZOO_SIZES)]},
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides: which keys, value types and bounds depend on the model (name).",
    )


class PlanRequest(Frozen):
    """Plan a model on a cluster. Exactly one of `model_id`, `model`, `zoo`."""

    model_id: str | None = Field(
        None,
        max_length=64,
        json_schema_extra={"pattern": TEXT_PATTERN},
        description="A stored model's id.",
    )
    model: ModelSpec | None = Field(None, description="An inline model spec.")
    zoo: ZooRef | None = Field(None, description="A zoo model.")
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="The cluster.")
    options: PlanOptions = Field(default_factory=PlanOptions, description="Plan options.")

    @model_validator(mode="after")
    def _one_model(self) -> "PlanRequest":
        given = [n for n in ("model_id", "model", "zoo") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of model_id, model, zoo (got {given or 'none'})")
        return self


class PlannedStage(Frozen):
    """One stage of a plan."""

    start: int = Field(ge=0, description="First layer.")
    end: int = Field(ge=0, description="Last layer, inclusive.")
    layer_names: list[str] = Field(description="Names of its layers.")
    submesh_id: int = Field(ge=0, description="Index into the job's submesh choices.")
    config_id: int = Field(ge=0, description="Index into the submesh's configs.")
    submesh: SubmeshShape = Field(description="Physical submesh.")
    config: ShardingConfig = Field(description="Logical mesh and strategy.")
    forward_cost: float = Field(ge=0, description="Forward time per micro-batch, seconds.")
    backward_cost: float = Field(ge=0, description="Backward time per micro-batch, seconds.")
    compute_cost: float = Field(ge=0, description="forward + backward (DP stage time), seconds.")
    comm_cost_s: float = Field(0.0, ge=0, description="Added transfer time, seconds.")
    peak_memory: int = Field(0, ge=0, description="Peak memory per device, bytes.")
    initial_var_size: int = Field(0, ge=0, description="Params + optimizer state, bytes.")
    intermediate_size: int = Field(0, ge=0, description="Activations per micro-batch, bytes.")
    max_n_succ_stages: int = Field(-1, description="Stages allowed after it by memory.")
    fingerprint: str = Field("", description="Stage fingerprint of its profile.")
    flops: float = Field(
        0.0, ge=0, description="FLOPs per device of forward + backward; 0 when not recorded."
    )
    device_group: int | None = Field(
        None,
        ge=0,
        description="The device group it runs on (interleaved: chunk k on group k mod p); "
        "null (stored before): its own.",
    )
    input_grad_cost: float | None = Field(
        None, ge=0, description="B of the split backward, seconds; null when not measured."
    )
    weight_cost: float | None = Field(
        None, ge=0, description="W of the split backward, seconds; null when not measured."
    )
    schedule_memory: int | None = Field(
        None,
        ge=0,
        description="Predicted peak bytes per device of its device group under the plan's "
        "schedule (peak + parameters and optimizer state + the micro-batches it keeps).",
    )
    remat: str = Field(
        "as_written", description="Remat variant its layers run under (its config's)."
    )
    measured: bool = Field(
        True,
        description="Whether its numbers were measured; false: estimated from layer "
        "profiles (only a baseline or a runner-up may hold such a stage, never the plan).",
    )
    estimated_cost_s: float | None = Field(
        None,
        ge=0,
        description="The job's estimate of forward + backward from its layer profiles, "
        "seconds (beside compute_cost when the stage was measured); null: not estimated.",
    )


class SearchSummary(Frozen):
    """How a job chose what to measure, and how good its estimates were."""

    mode: SearchMode = Field(description="The search the job ran (PlanOptions.search).")
    layer_profiles: int = Field(
        0, ge=0, description="Stages of one layer or two adjacent layers measured to estimate."
    )
    verified: int = Field(
        0, ge=0, description="Longer stages measured because a plan that could be best has them."
    )
    estimated: int = Field(0, ge=0, description="Stages never measured: estimated only.")
    split_on_demand: int = Field(
        0,
        ge=0,
        description="Stages measured first without the split backward (schedule auto) and "
        "again with it, because a zero-bubble plan that could be best had them.",
    )
    rounds: int = Field(0, ge=0, description="Estimate-then-measure rounds.")
    estimate_error_median: float | None = Field(
        None,
        ge=0,
        description="Median |estimate - measured| / measured of forward + backward over the "
        "stages measured after being estimated; null: none was.",
    )
    estimate_error_max: float | None = Field(
        None, ge=0, description="The largest such error; null: none was."
    )
    error_band: float | None = Field(
        None,
        ge=0,
        description="The band the last round trusted: unmeasured stages were assumed at "
        "least (1 - band) x their estimate.",
    )
    compared: int = Field(
        0, ge=0, description="Stages measured after being estimated (the error's sample)."
    )


class ScheduleEvent(Frozen):
    """One op of one micro-batch on one stage (chunk) in the simulated schedule."""

    stage: int = Field(ge=0, description="The stage (interleaved: the model chunk).")
    microbatch: int = Field(ge=0)
    kind: Literal["forward", "backward", "weight"] = Field(
        description="forward; backward (input gradients only when the backward is split); "
        "weight (the weight gradients of a split backward)."
    )
    start_s: float = Field(ge=0, description="Start time, seconds from iteration start.")
    end_s: float = Field(ge=0, description="End time, seconds.")
    device_group: int | None = Field(
        None, ge=0, description="The device group it runs on; null (stored before): the stage."
    )

    @property
    def group(self) -> int:
        """The device group, the stage's own when not recorded."""
        return self.stage if self.device_group is None else self.device_group


class ScheduleOption(Frozen):
    """One schedule's best plan beside the others (`schedule: auto` compares them)."""

    schedule: ScheduleName
    virtual_stages: int = Field(1, ge=1, description="Model chunks per device group.")
    feasible: bool
    reason: str | None = Field(None, description="Why it has no plan, when it has none.")
    predicted_iteration_time_s: float | None = Field(None, ge=0, description="Simulated.")
    bubble_fraction: float | None = Field(None, ge=0, le=1)
    peak_memory: int | None = Field(
        None, ge=0, description="Largest predicted bytes per device of any device group."
    )
    dp_cost_s: float | None = Field(None, ge=0, description="Its search's objective, seconds.")
    search_seconds: float = Field(0.0, ge=0, description="Time its search took, seconds.")
    layout: str = Field("", description="Its stages on one line (stage_layout).")
    chosen: bool = Field(False, description="Whether it is the plan's schedule.")


class BaselinePlan(Frozen):
    """A simple plan from the same table, for comparison."""

    name: str = Field(description="'data_parallel' (one stage) or 'uniform_<n>'.")
    iteration_time_s: float | None = Field(
        None, description="Predicted iteration time, seconds; null when infeasible."
    )
    stages: list[PlannedStage] = Field(default_factory=list)
    reason: str | None = Field(None, description="Why it is infeasible, when it is.")


class ManualStageOption(Frozen):
    """Alpa's `ManualStageOption`: a plan in the shape Alpa replays."""

    forward_stage_layer_ids: list[list[int]]
    submesh_physical_shapes: list[tuple[int, int]]
    submesh_logical_shapes: list[tuple[int, int]]
    submesh_autosharding_option_dicts: list[dict[str, Any]]


Stability = Literal["stable", "within_noise", "unique"]
STABILITY_LABELS: dict[str, str] = {
    "stable": "stable",
    "within_noise": "within noise",
    "unique": "unique",
}


def stage_layout(stages: list[PlannedStage]) -> str:
    """A plan's stages on one line: "0-2 on 1x2 as 2x1/data · 3-5 on 1x2 as 1x2/megatron"."""
    return " · ".join(f"{s.start}-{s.end} on {s.submesh} as {s.config.label()}" for s in stages)


def percent(fraction: float) -> str:
    """7.3%, 0.042%, 0%: one decimal, or two significant digits below 0.1%."""
    if fraction == 0:
        return "0%"
    if abs(fraction) < 1e-3:
        return f"{fraction * 100:.2g}%"
    return f"{fraction:.1%}"


class RunnerUpPlan(Frozen):
    """The best plan other than the chosen one in simulated time, under any schedule
    searched, the baselines (1F1B plans) included where 1F1B is searched. Another plan:
    other stages, or the same stages under another schedule (one that runs them as fast
    only when there is no other)."""

    dp_cost_s: float = Field(ge=0, description="Its search's objective (1F1B: Σt + (B-1)·max t).")
    gap: float | None = Field(
        None,
        ge=0,
        description="(its simulated iteration time − the plan's) / the plan's (stored before: "
        "of the DP objectives); null when the plan's is 0.",
    )
    cost_spread: float = Field(
        0.0, ge=0, description="Relative measured spread of its objective (as Plan.cost_spread)."
    )
    predicted_iteration_time_s: float = Field(
        ge=0, description="Simulated iteration time under its schedule, seconds."
    )
    stages: list[PlannedStage] = Field(min_length=1)
    outside: list[PlannedStage] = Field(
        default_factory=list,
        description="Its layers run on every device outside the pipeline (as Plan.outside).",
    )
    schedule_name: ScheduleName | None = Field(
        None, description="Its schedule; null (stored before): the plan's."
    )
    virtual_stages: int = Field(1, ge=1, description="Model chunks per device group.")
    baseline: str | None = Field(
        None, description="The baseline it is (e.g. 'data_parallel'), when it is one."
    )

    @property
    def partly_estimated(self) -> bool:
        """Whether some of its stages are estimates only (never measured)."""
        return any(not st.measured for st in self.stages)


class MaxTextPlan(Frozen):
    """The best plan MaxText can run: uniform stages of the repeated blocks, GPipe or
    circular; the layers before and after the blocks on all devices, outside the pipeline."""

    feasible: bool
    reason: str | None = Field(None, description="Why no MaxText plan exists, when none does.")
    settings: dict[str, int | str] = Field(
        default_factory=dict, description="MaxText keys -> values (remat_policy a name)."
    )
    schedule: Literal["gpipe", "circular"] | None = None
    blocks: tuple[int, int] | None = Field(
        None, description="First and last pipelined layer (the repeated blocks)."
    )
    outside_layers: list[str] = Field(
        default_factory=list, description="Layers run on all devices outside the pipeline."
    )
    chunks: list[tuple[int, int]] = Field(
        default_factory=list, description="Each pipeline chunk's first and last layer."
    )
    submesh: SubmeshShape | None = None
    config: ShardingConfig | None = None
    predicted_iteration_time_s: float | None = Field(None, ge=0)
    pipeline_time_s: float | None = Field(None, ge=0, description="The pipelined blocks.")
    outside_time_s: float | None = Field(
        None, ge=0, description="The outside layers, data parallel on all devices."
    )
    unrestricted_time_s: float | None = Field(None, ge=0, description="The best plan's time.")
    not_expressible: list[str] = Field(
        default_factory=list, description="What the unrestricted plan does that MaxText cannot."
    )


class MicrobatchOption(Frozen):
    """One count of micro-batches searched (`PlanOptions.microbatch_search`): its best plan's
    simulated time beside the others, or why it has none."""

    num_microbatches: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1, description="Global batch / num_microbatches.")
    feasible: bool
    reason: str | None = Field(None, description="Why it has no plan, when it has none.")
    predicted_iteration_time_s: float | None = Field(None, ge=0, description="Simulated.")
    schedule: ScheduleName | None = Field(None, description="Its best plan's schedule.")
    layout: str = Field("", description="Its best plan's stages on one line (stage_layout).")
    chosen: bool = Field(False, description="Whether it is the plan's count.")


class Plan(Frozen):
    """A pipeline plan: stages covering every layer (but those run outside the pipeline on
    every device, `outside`), using every device."""

    stages: list[PlannedStage] = Field(min_length=1)
    num_microbatches: int = Field(ge=1)
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per micro-batch the stages were measured at; null: the model's "
        "traced size (stored before).",
    )
    microbatch_options: list[MicrobatchOption] = Field(
        default_factory=list,
        description="Each count of micro-batches searched, its best plan's simulated time "
        "(empty unless the request set microbatch_search).",
    )
    num_layers: int = Field(ge=1)
    num_devices: int = Field(ge=1)
    dp_cost_s: float = Field(
        ge=0, description="DP objective Σt + (B-1)·max t, seconds (Alpa's training_dp)."
    )
    predicted_iteration_time_s: float = Field(
        ge=0, description="Simulated iteration time under its schedule, seconds."
    )
    bubble_fraction: float = Field(ge=0, le=1, description="Idle share of device time.")
    dp_wall_seconds: float = Field(0.0, ge=0, description="Time the DP took, seconds.")
    include_communication: bool = False
    baselines: list[BaselinePlan] = Field(default_factory=list)
    schedule: list[ScheduleEvent] = Field(default_factory=list)
    manual_stage_option: ManualStageOption | None = None
    cost_spread: float = Field(
        0.0,
        ge=0,
        description="Relative measured spread of dp_cost_s: each stage's measured forward + "
        "backward time times its relative spread (p90 - p10) / median over the timed runs, "
        "weighted as the objective weighs the stage (B for the largest, else 1), over the "
        "objective. Transfer time is modelled, not measured, and adds none; 0 when the "
        "profiles carry no spread.",
    )
    runner_up: RunnerUpPlan | None = Field(
        None, description="The best other plan; null when there is none (or not assessed)."
    )
    stability: Stability | None = Field(
        None,
        description="'stable': the runner-up's gap is larger than the measured spread (the "
        "larger of the two plans' cost_spread); 'within_noise': it is not, so measurement "
        "noise could swap them; 'unique': no other plan is feasible under any schedule "
        "searched, nor a baseline; null: not assessed "
        "(plans stored before stageprof assessed it).",
    )
    runner_up_wall_seconds: float = Field(
        0.0, ge=0, description="Time the search for the runner-up took, seconds."
    )
    schedule_name: ScheduleName = Field(
        "1f1b", description="The pipeline schedule (plans stored before are 1f1b)."
    )
    virtual_stages: int = Field(
        1, ge=1, description="Model chunks per device group (interleaved; else 1)."
    )
    peak_memory: int | None = Field(
        None, ge=0, description="Largest predicted bytes per device under the schedule."
    )
    schedules: list[ScheduleOption] = Field(
        default_factory=list,
        description="Each schedule searched, its best plan's simulated numbers or why it "
        "has none (one entry unless the request asked for auto).",
    )
    target: TrainerName | None = Field(
        None, description="The trainer the plan was made for (None: stageprof's own)."
    )
    search: SearchSummary | None = Field(
        None,
        description="How the job chose what to measure and how good its estimates were; "
        "null: planned without a search (stored before, or planned from a given table).",
    )
    maxtext: MaxTextPlan | None = Field(
        None, description="The best MaxText plan (target 'maxtext' only)."
    )
    outside: list[PlannedStage] = Field(
        default_factory=list,
        description="Layers run on every device outside the pipeline, before and after it, "
        "as MaxText runs embedding and head (each its measured one-layer stage on all "
        "devices, once per micro-batch); `stages` then cover the other layers. Empty: the "
        "pipeline holds every layer.",
    )
    outside_time_s: float = Field(
        0.0,
        ge=0,
        description="The outside layers' time per iteration (forward + backward × "
        "micro-batches), seconds; part of predicted_iteration_time_s.",
    )

    @property
    def num_device_groups(self) -> int:
        """Device groups: the stages, or the chunks over the virtual stages."""
        return max(1, len(self.stages) // self.virtual_stages)

    @property
    def noise_spread(self) -> float:
        """The spread the runner-up's gap is compared with: the larger of the two plans'."""
        if self.runner_up is None:
            return self.cost_spread
        return max(self.cost_spread, self.runner_up.cost_spread)

    def runner_up_differs(self) -> list[bool]:
        """For each runner-up stage, whether the plan lacks it (same layers, submesh, config)."""
        if self.runner_up is None:
            return []

        def key(s: PlannedStage) -> tuple[int, int, tuple[int, int], str]:
            return (s.start, s.end, s.submesh.as_tuple(), s.config.model_dump_json())

        ours = {key(s) for s in self.stages}
        return [key(s) not in ours for s in self.runner_up.stages]

    def runner_up_label(self) -> str:
        """The runner-up's schedule, and the baseline it is: e.g. "gpipe", "interleaved,
        v=2", "1f1b, data_parallel" ("" without a runner-up; one stored before runner-ups
        had a schedule ran the plan's)."""
        runner = self.runner_up
        if runner is None:
            return ""
        name = runner.schedule_name or self.schedule_name
        label = f"{name}, v={runner.virtual_stages}" if name == "interleaved" else name
        return f"{label}, {runner.baseline}" if runner.baseline else label

    def stability_summary(self) -> str | None:
        """e.g. "stable: runner-up 7.3% slower, measured spread 2.1%"; None if not assessed."""
        if self.stability is None:
            return None
        label = STABILITY_LABELS[self.stability]
        runner = self.runner_up
        if runner is None:
            return f"{label}: no other plan is feasible"
        if runner.gap is None:
            extra = runner.predicted_iteration_time_s - self.predicted_iteration_time_s
            slower = f"{extra:.3g} s slower"
        elif runner.gap == 0:
            slower = "as fast (a tie)"
        else:
            slower = f"{percent(runner.gap)} slower"
        text = f"{label}: runner-up {slower}, measured spread {percent(self.noise_spread)}"
        return text + ("; runner-up partly estimated" if runner.partly_estimated else "")
