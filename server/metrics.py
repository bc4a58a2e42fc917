"""Prometheus metrics of one app: requests, jobs by status, stored profiles, and the
service's reliability counters (DB retries, takeovers, reaped jobs, stage claims waited on).

Each app has its own registry (tests build many apps). Under `serve --workers N` the
request counters live in Prometheus multiprocess files (`PROMETHEUS_MULTIPROC_DIR`, set by
`stageprof serve`), so any process's `/metrics` shows the sum over all of them. Jobs,
profiles and the reliability counters are read from the database at scrape time (runners
write theirs to the store), so they agree across processes and include every worker.
"""

import os
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from schemas import JobStatus, ProfileStatus
from store import count_jobs_by_status
from store.counters import COUNTERS, read_counters
from store.queries import count_profiles_by_status

__all__ = ["MULTIPROC_DIR_ENV", "PROMETHEUS_CONTENT_TYPE", "Metrics"]

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class StoreCollector(Collector):
    """What the database says now: jobs by status, profiles by status, shared counters."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def collect(self) -> Iterator[Metric]:
        jobs = count_jobs_by_status(self.session)
        family = GaugeMetricFamily(
            "stageprof_jobs", "Jobs in the store by status.", labels=["status"]
        )
        for status in JobStatus:
            family.add_metric([status.value], jobs.get(status.value, 0))
        yield family
        profiles = count_profiles_by_status(self.session)
        family = GaugeMetricFamily(
            "stageprof_profiles_stored",
            "Stage profiles stored (one per stage fingerprint) by status.",
            labels=["status"],
        )
        for pstatus in ProfileStatus:
            family.add_metric([pstatus.value], profiles.get(pstatus.value, 0))
        yield family
        counters = read_counters(self.session)
        for name, help_text in COUNTERS.items():
            yield CounterMetricFamily(f"stageprof_{name}", help_text, value=counters.get(name, 0))


class Metrics:
    """The app's collectors and how to render them."""

    def __init__(self) -> None:
        self.multiprocess = bool(os.environ.get(MULTIPROC_DIR_ENV))
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

    def observe_request(self, *, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, method=method, status=str(status)).inc()
        self.latency.labels(route=route, method=method).observe(seconds)

    def render(self, session: Session) -> bytes:
        """Every metric as Prometheus text: requests (of all processes in multiprocess
        mode) and what the database holds now."""
        if self.multiprocess:
            requests = CollectorRegistry()
            MultiProcessCollector(requests)
        else:
            requests = self.registry
        store_registry = CollectorRegistry()
        store_registry.register(StoreCollector(session))
        return generate_latest(requests) + generate_latest(store_registry)
