"""Prometheus metrics of one app: requests, jobs by status, stored profiles.

Each app has its own registry (tests build many apps). With `--workers N` every process
counts its own requests; the job and profile gauges are read from the database at scrape
time, so they agree across processes.
"""

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy.orm import Session

from schemas import JobStatus, ProfileStatus
from store import count_jobs_by_status
from store.queries import count_profiles_by_status

__all__ = ["PROMETHEUS_CONTENT_TYPE", "Metrics"]


class Metrics:
    """The app's collectors and how to render them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "stageprof_http_requests",
            "HTTP requests by route template, method and status code.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "stageprof_http_request_duration_seconds",
            "Time to answer an HTTP request, seconds.",
            ["route", "method"],
            registry=self.registry,
        )
        self.jobs = Gauge(
            "stageprof_jobs", "Jobs in the store by status.", ["status"], registry=self.registry
        )
        self.profiles = Gauge(
            "stageprof_profiles_stored",
            "Stage profiles stored (one per stage fingerprint) by status.",
            ["status"],
            registry=self.registry,
        )

    def observe_request(self, *, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, method=method, status=str(status)).inc()
        self.latency.labels(route=route, method=method).observe(seconds)

    def render(self, session: Session) -> bytes:
        """Refresh the gauges from the database and render everything as Prometheus text."""
        jobs = count_jobs_by_status(session)
        for status in JobStatus:
            self.jobs.labels(status=status.value).set(jobs.get(status.value, 0))
        profiles = count_profiles_by_status(session)
        for pstatus in ProfileStatus:
            self.profiles.labels(status=pstatus.value).set(profiles.get(pstatus.value, 0))
        return generate_latest(self.registry)
