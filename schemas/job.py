"""Jobs: the unit of work from request to plan."""

from datetime import datetime
from enum import StrEnum

from pydantic import Field

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
    """Candidate counts of a job."""

    total: int = Field(0, ge=0, description="Stage candidates in the job.")
    done: int = Field(0, ge=0, description="Candidates with a result (any status).")
    cached: int = Field(0, ge=0, description="Of those, reused from a stored profile.")
    failed: int = Field(0, ge=0, description="Of those, with a status other than ok.")
    measured: int = Field(0, ge=0, description="Distinct stages measured by this job.")
    distinct_stages: int = Field(0, ge=0, description="Distinct stage fingerprints in the job.")
    pruned: int = Field(
        0, ge=0, description="Distinct stages skipped: they cannot be in a better plan."
    )


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
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    has_plan: bool = False
