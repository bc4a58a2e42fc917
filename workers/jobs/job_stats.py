"""What a job cost and how it ended: `JobStats` (the `stats` of `stageprof plan --json`) and
`JobOutcome`."""

from collections.abc import Callable
from dataclasses import dataclass, field

import store
from schemas import JobStatus, Plan, Progress


@dataclass
class JobStats:
    """What a job cost: the `stats` of `stageprof plan --json`. The counts are the job's
    progress as the store keeps it (`schemas.Progress`, one meaning each, read at the job's
    end); the rest is the runner's own."""

    progress: Progress = field(default_factory=Progress)
    wall_seconds: float = 0.0
    actors_started: int = 0
    actors_replaced: int = 0
    waited: int = 0  # stages another runner was measuring, whose result this job waited for
    store_seconds: float = 0.0  # the measuring phase's time writing results to the store
    device_wait_seconds: float = 0.0  # waiting for devices another job held
    # Set while the job waits for devices another job holds (what its progress says).
    waiting_for_devices: str | None = None

    @property
    def candidates(self) -> int:
        return self.progress.candidates

    @property
    def distinct_stages(self) -> int:
        return self.progress.distinct_stages

    @property
    def measured(self) -> int:
        return self.progress.measured

    @property
    def reused(self) -> int:
        return self.progress.reused

    @property
    def failed(self) -> int:
        return self.progress.failed

    @property
    def pruned(self) -> int:
        return self.progress.pruned

    @property
    def estimated(self) -> int:
        return self.progress.estimated

    def as_dict(self) -> dict[str, float | int]:
        counts: dict[str, float | int] = dict(self.progress.model_dump())
        return counts | {
            "wall_seconds": self.wall_seconds,
            "actors_started": self.actors_started,
            "actors_replaced": self.actors_replaced,
            "waited": self.waited,
            "device_wait_seconds": self.device_wait_seconds,
        }


@dataclass
class JobOutcome:
    job_id: str
    status: JobStatus
    plan: Plan | None
    error: str | None
    stats: JobStats


ProgressCallback = Callable[[store.JobRow | None, JobStats], None]
