"""Fixtures for the job runner: a local Ray (the store: `sessions`, in tests/conftest.py)."""

from collections.abc import Iterator

import pytest
import ray


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
