"""Fixtures for the job runner: a local Ray and a SQLite store with real commits."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from sqlalchemy.orm import Session, sessionmaker

from client import zoo
from migrations import upgrade
from schemas import ClusterSpec, ModelSpec, PlanOptions
from store import create_job, make_engine, make_sessionmaker, put_model, session_scope

TINY_GPT = {"hidden_size": 32, "num_heads": 2, "seq_len": 16, "vocab_size": 128, "batch_size": 4}
FAST_OPTIONS = PlanOptions(
    num_microbatches=4,
    config_space="data_parallel_only",
    strategies=["data"],
    repeats=2,
    warmup=1,
    candidate_timeout_s=120,
)


@pytest.fixture
def ray_cluster() -> Iterator[None]:
    """A local Ray of 2 CPUs, started once (a multi-node test may have replaced it: then
    started again); Ray stops it when the session's process exits."""
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield


@pytest.fixture
def db_file(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'runner.db'}"
    upgrade(url)
    return url


@pytest.fixture
def sessions(db_file: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_file)
    yield make_sessionmaker(engine)
    engine.dispose()


def tiny_gpt(num_layers: int, **overrides: int) -> ModelSpec:
    return zoo.build("gpt", num_layers=num_layers, **(TINY_GPT | overrides))


def queue_job(
    sessions: sessionmaker[Session],
    spec: ModelSpec,
    options: PlanOptions = FAST_OPTIONS,
    cluster: ClusterSpec | None = None,
) -> str:
    with session_scope(sessions) as s:
        model, _ = put_model(s, spec=spec)
        job = create_job(
            s,
            model_id=model.id,
            cluster=cluster or ClusterSpec(num_hosts=1, devices_per_host=4),
            options=options,
        )
        return job.id
