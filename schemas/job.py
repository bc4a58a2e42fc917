"""Jobs: the unit of work from request to plan."""

from datetime import datetime
from enum import StrEnum

from pydantic import Field, computed_field, model_validator

from schemas.base import Frozen
from schemas.cluster import ClusterSpec
from schemas.plan import PlanOptions, ZooRef


class JobStatus(StrEnum):
    queued = "queued"
    profiling = "profiling"
    planning = "planning"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.done, JobStatus.failed, JobStatus.cancelled)


class Progress(Frozen):
    """A job's counts, one meaning each. A *stage* is a distinct stage fingerprint among the
    job's candidates (identical candidates share one measurement); every stage is exactly one
    of measured, reused, failed, pruned, estimated or still pending:

        distinct_stages = measured + reused + failed + pruned + estimated + pending
        done = measured + reused + failed + pruned + estimated
    """

    candidates: int = Field(
        0, ge=0, description="Stage candidates (start, end, submesh, config) in the job."
    )
    distinct_stages: int = Field(
        0, ge=0, description="Distinct stages among them (identical candidates share one)."
    )
    measured: int = Field(0, ge=0, description="Stages this job measured, with status ok.")
    reused: int = Field(
        0, ge=0, description="Stages whose ok result was already stored (or another job's)."
    )
    failed: int = Field(0, ge=0, description="Stages whose result is not ok (oom, timeout, ...).")
    pruned: int = Field(
        0, ge=0, description="Stages skipped: they cannot be in a better plan than one measured."
    )
    estimated: int = Field(
        0,
        ge=0,
        description="Stages never measured: estimated from the layer profiles, no plan that "
        "could be best needed them (search: estimate).",
    )

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: object) -> object:
        """`done` and `pending` are derived: accept them back (e.g. from the API's JSON)."""
        if isinstance(data, dict) and ("done" in data or "pending" in data):
            data = {k: v for k, v in data.items() if k not in ("done", "pending")}
        return data

    @computed_field(description="measured + reused + failed + pruned + estimated.")  # type: ignore[prop-decorator]
    @property
    def done(self) -> int:
        return self.measured + self.reused + self.failed + self.pruned + self.estimated

    @computed_field(description="Stages with no result yet.")  # type: ignore[prop-decorator]
    @property
    def pending(self) -> int:
        return max(0, self.distinct_stages - self.done)


class Job(Frozen):
    """A job as the API shows it."""

    id: str
    model_id: str | None = Field(None, description="Null until a zoo job's model is built.")
    zoo: ZooRef | None = Field(None, description="The zoo model requested, if any.")
    model_name: str = ""
    status: JobStatus
    cluster: ClusterSpec
    options: PlanOptions
    progress: Progress
    error: str | None = None
    lease_owner: str | None = None
    cancel_requested: bool = False
    waiting: str | None = Field(
        None,
        description="What the job is waiting for right now, e.g. 'waiting for devices held by "
        "another job (...)'; null when it is not waiting.",
    )
    phase: str | None = Field(
        None,
        description="What a running job is doing: 'layer profiles', 'estimates', "
        "'verification round N', 'measuring', 'planning'; null when not running.",
    )
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    has_plan: bool = False
