"""A job's life against the store: claim it, enumerate its candidates, reuse what is stored,
measure the rest (the measuring phase), then plan. Leases, store retries and cross-job stage
claims keep it going through outages and runner deaths."""

from workers.jobs.heartbeat import JobCancelled, WorkerShutdown
from workers.jobs.job_inputs import JobFailed
from workers.jobs.job_stats import JobOutcome, JobStats, ProgressCallback
from workers.jobs.retry import StoreRetry
from workers.jobs.runner import JobRunner, RunnerConfig

__all__ = [
    "JobCancelled",
    "JobFailed",
    "JobOutcome",
    "JobRunner",
    "JobStats",
    "ProgressCallback",
    "RunnerConfig",
    "StoreRetry",
    "WorkerShutdown",
]
