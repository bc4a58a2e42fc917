"""The cluster, its submeshes, sharding configs and stage candidate keys."""

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from schemas.base import TEXT_PATTERN, Frozen
from schemas.limits import MAX_DEVICE_MEMORY_BYTES, MIN_DEVICE_MEMORY_BYTES
from schemas.sharding import (
    LEGACY_DP_AXIS,
    LEGACY_RULES,
    MESH_AXES,
    STRATEGY_NAME_PATTERN,
    Rules,
    ShardingStrategy,
    axes_label,
    rule_errors,
)

# The remat variants a stage can run under ("as_written": the layers as traced).
REMAT_VARIANTS = ("full", "dots")
REMAT_CHOICES = ("as_written", *REMAT_VARIANTS)

StrategyName = Literal["data", "megatron", "fsdp"]


def redundant_strategy(name: StrategyName, dp: int, tp: int) -> bool:
    """Whether strategy `name` on the logical mesh `(dp, tp)` repeats another config's
    work: "megatron" without a tensor axis is "data", "fsdp" without a data axis splits
    nothing more than "megatron", and "data" on a tensor axis replicates the work on it."""
    return (
        (name == "megatron" and tp == 1)
        or (name == "fsdp" and dp == 1)
        or (name == "data" and tp > 1)
    )


DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}

FLOAT_DTYPES: frozenset[str] = frozenset({"float64", "float32", "float16", "bfloat16"})

MAX_HOSTS = 1024
MAX_DEVICES_PER_HOST = 1024
POWERS_OF_TWO = [2**k for k in range(MAX_DEVICES_PER_HOST.bit_length())]


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class ClusterSpec(Frozen):
    """The devices a plan may use: `num_hosts` × `devices_per_host` identical devices."""

    num_hosts: int = Field(1, ge=1, le=MAX_HOSTS, description="Number of hosts.")
    devices_per_host: int = Field(
        4,
        ge=1,
        le=MAX_DEVICES_PER_HOST,
        description="Devices per host; a power of two.",
        json_schema_extra={"enum": POWERS_OF_TWO},
    )
    device_kind: str = Field(
        "cpu",
        min_length=1,
        max_length=64,
        json_schema_extra={"pattern": TEXT_PATTERN},
        description="Device kind, e.g. 'cpu' or 'NVIDIA H100'.",
    )
    device_memory_bytes: int = Field(
        16 * 2**30, gt=0, description="Memory of one device, in bytes."
    )
    intra_host_bandwidth_bytes_per_s: float = Field(
        100e9, gt=0, description="Device-to-device bandwidth inside a host, bytes/s."
    )
    inter_host_bandwidth_bytes_per_s: float = Field(
        12.5e9, gt=0, description="Host-to-host bandwidth, bytes/s."
    )

    @field_validator("devices_per_host")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if not _is_power_of_two(v):
            raise ValueError(f"must be a power of two (Alpa's submesh rule), got {v}")
        return v

    @property
    def num_devices(self) -> int:
        return self.num_hosts * self.devices_per_host


class RequestedCluster(ClusterSpec):
    """The cluster of a plan request: a `ClusterSpec` whose device memory lies within the
    bounds the service accepts (a stored job's cluster is read back as a `ClusterSpec`)."""

    device_memory_bytes: int = Field(
        16 * 2**30,
        ge=MIN_DEVICE_MEMORY_BYTES,
        le=MAX_DEVICE_MEMORY_BYTES,
        description="Memory of one device, in bytes: 1 MiB (2**20) to 16 TiB (2**44).",
    )


class SubmeshShape(Frozen):
    """A physical slice of the cluster: `hosts` × `devices_per_host`."""

    hosts: int = Field(ge=1, le=MAX_HOSTS, description="Hosts in the submesh.")
    devices_per_host: int = Field(
        ge=1, le=MAX_DEVICES_PER_HOST, description="Devices used on each host."
    )

    @property
    def num_devices(self) -> int:
        return self.hosts * self.devices_per_host

    def as_tuple(self) -> tuple[int, int]:
        return (self.hosts, self.devices_per_host)

    def __str__(self) -> str:
        return f"{self.hosts}x{self.devices_per_host}"


class ShardingConfig(Frozen):
    """How a stage uses its submesh: a size per named mesh axis and a logical-axis rule table
    (`schemas.sharding`), plus the remat variant its layers run under.

    Today's strategies leave `mesh_axes` and `rules` out: `logical_mesh` `(dp, tp)` and
    `strategy` (`data`, `megatron`, `fsdp`) stand for the point of the space they are
    (`LEGACY_RULES`), and their stored rows and fingerprints stay as they were. A config of the
    mesh-axes space carries both; its `logical_mesh` is `(devices / tensor, tensor)`, for the
    tables that show `(dp, tp)`. Alpa calls this an auto-sharding config, e.g.
    ``((2, 1), {"force_batch_dim_to_mesh_dim": 0})``.
    """

    logical_mesh: tuple[int, int] = Field(
        description="Logical mesh shape (dp, tp): for today's strategies the sizes of the "
        "'data' and 'model' axes; for a mesh-axes config (devices / tensor, tensor)."
    )
    strategy: str = Field(
        description="The strategy's name: data, megatron or fsdp, or the rule table's name "
        "of a mesh-axes config (e.g. 'maxtext').",
        json_schema_extra={"pattern": STRATEGY_NAME_PATTERN},
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Strategy options, kept as given (JSON values)."
    )
    remat: str = Field(
        "as_written",
        description="Remat variant every layer of the stage runs under: as_written (the "
        "programs as traced), full or dots (the layer's exported remat variants).",
        json_schema_extra={"enum": list(REMAT_CHOICES)},
    )
    mesh_axes: dict[str, int] | None = Field(
        None,
        description="Size of every mesh axis (data, fsdp, context, expert, tensor; product = "
        "the submesh's devices); null for today's strategies.",
    )
    rules: Rules | None = Field(
        None,
        description="Logical axis name -> mesh axes (schemas.sharding); null for today's "
        "strategies.",
    )

    @field_validator("remat")
    @classmethod
    def _remat(cls, v: str) -> str:
        if v not in REMAT_CHOICES:
            raise ValueError(f"unknown remat variant {v!r}; use one of {list(REMAT_CHOICES)}")
        return v

    @field_validator("logical_mesh")
    @classmethod
    def _positive(cls, v: tuple[int, int]) -> tuple[int, int]:
        if any(x < 1 for x in v):
            raise ValueError(f"mesh axes must be >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _one_form(self) -> "ShardingConfig":
        if (self.mesh_axes is None) != (self.rules is None):
            raise ValueError(
                "mesh_axes and rules come together (or neither, for data/megatron/fsdp)"
            )
        if self.mesh_axes is None:
            if self.strategy not in LEGACY_RULES:
                raise ValueError(
                    f"strategy {self.strategy!r} needs mesh_axes and rules; without them use "
                    f"one of {list(LEGACY_RULES)}"
                )
            return self
        if sorted(self.mesh_axes) != sorted(MESH_AXES) or any(
            s < 1 for s in self.mesh_axes.values()
        ):
            raise ValueError(f"mesh_axes must give every axis of {list(MESH_AXES)} a size >= 1")
        errors = rule_errors(self.rules or {})
        if errors:
            raise ValueError("; ".join(errors))
        tensor = self.mesh_axes["tensor"]
        n = math.prod(self.mesh_axes.values())
        if self.logical_mesh != (n // tensor, tensor):
            raise ValueError(
                f"logical_mesh must be (devices / tensor, tensor) = {(n // tensor, tensor)}"
            )
        return self

    @classmethod
    def from_strategy(
        cls, strategy: ShardingStrategy, sizes: dict[str, int], **kw: Any
    ) -> "ShardingConfig":
        """The config of `strategy` with its axes resolved to `sizes` (every mesh axis)."""
        tensor = sizes["tensor"]
        return cls(
            logical_mesh=(math.prod(sizes.values()) // tensor, tensor),
            strategy=strategy.name,
            mesh_axes={a: int(sizes[a]) for a in MESH_AXES},
            rules={k: tuple(v) for k, v in strategy.rules.items()},
            **kw,
        )

    @property
    def num_devices(self) -> int:
        return self.logical_mesh[0] * self.logical_mesh[1]

    @property
    def is_legacy(self) -> bool:
        """Whether it is one of today's strategies in their stored form."""
        return self.mesh_axes is None

    @property
    def axis_sizes(self) -> dict[str, int]:
        """Every mesh axis's size (today's strategies: dp on data, or fsdp for `fsdp`; tp on
        tensor)."""
        if self.mesh_axes is not None:
            return dict(self.mesh_axes)
        dp, tp = self.logical_mesh
        sizes = dict.fromkeys(MESH_AXES, 1)
        sizes[LEGACY_DP_AXIS[self.strategy]] = dp
        sizes["tensor"] = tp
        return sizes

    @property
    def layout_rules(self) -> Rules:
        """The rule table it lays arrays out by."""
        return dict(self.rules) if self.rules is not None else dict(LEGACY_RULES[self.strategy])

    def label(self) -> str:
        remat = "" if self.remat == "as_written" else f"+remat:{self.remat}"
        if self.mesh_axes is not None:
            return f"{axes_label(self.mesh_axes)}/{self.strategy}{remat}"
        dp, tp = self.logical_mesh
        return f"{dp}x{tp}/{self.strategy}{remat}"


class StageKey(Frozen):
    """A stage candidate: layers `start..end` (inclusive) on submesh `submesh_id` with
    sharding config `config_id` (indices into the job's submesh and config choices)."""

    start: int = Field(ge=0, description="First layer of the stage.")
    end: int = Field(ge=0, description="Last layer of the stage, inclusive.")
    submesh_id: int = Field(ge=0, description="Index into the job's submesh choices.")
    config_id: int = Field(ge=0, description="Index into the submesh's sharding configs.")

    @model_validator(mode="after")
    def _ordered(self) -> "StageKey":
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) must be >= start ({self.start})")
        return self

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.start, self.end, self.submesh_id, self.config_id)
