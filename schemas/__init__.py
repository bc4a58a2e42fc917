"""Pydantic v2 types that cross a package or process boundary.

No jax, ray or sqlalchemy here: every other package imports these.
"""

from schemas.base import TEXT_PATTERN
from schemas.cluster import (
    DTYPE_BYTES,
    FLOAT_DTYPES,
    ClusterSpec,
    ShardingConfig,
    StageKey,
    StrategyName,
    SubmeshShape,
)
from schemas.job import Job, JobStatus, Progress
from schemas.model import (
    REMAT_CHOICES,
    REMAT_VARIANTS,
    LayerSpec,
    ModelSpec,
    ParamSpec,
    RematVariant,
    VarSpec,
)
from schemas.plan import (
    BaselinePlan,
    ConfigSpace,
    ManualStageOption,
    OptimizerName,
    Plan,
    PlannedStage,
    PlanOptions,
    PlanRequest,
    RunnerUpPlan,
    ScheduleEvent,
    ScheduleOption,
    SearchSummary,
    Stability,
    SubmeshSpace,
    ZooRef,
)
from schemas.profile import (
    ModuleKind,
    ModuleProfileResult,
    ProfileStatus,
    StageProfileResult,
    max_n_succ_stages,
)

__all__ = [
    "DTYPE_BYTES",
    "TEXT_PATTERN",
    "FLOAT_DTYPES",
    "BaselinePlan",
    "ClusterSpec",
    "ConfigSpace",
    "Job",
    "JobStatus",
    "LayerSpec",
    "REMAT_CHOICES",
    "REMAT_VARIANTS",
    "RematVariant",
    "ManualStageOption",
    "ModelSpec",
    "ModuleKind",
    "ModuleProfileResult",
    "OptimizerName",
    "ParamSpec",
    "Plan",
    "PlanOptions",
    "PlanRequest",
    "PlannedStage",
    "SearchSummary",
    "ProfileStatus",
    "Progress",
    "RunnerUpPlan",
    "ScheduleEvent",
    "ScheduleOption",
    "ShardingConfig",
    "StageKey",
    "Stability",
    "StageProfileResult",
    "StrategyName",
    "SubmeshShape",
    "SubmeshSpace",
    "VarSpec",
    "ZooRef",
    "max_n_succ_stages",
]
