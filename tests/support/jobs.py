"""Queue a job in a store, as `stageprof plan` and the API do."""

from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, ModelSpec, PlanOptions
from store import create_job, put_model, session_scope
from tests.support.models import FAST_OPTIONS


def queue_job(
    sessions: sessionmaker[Session],
    spec: ModelSpec,
    options: PlanOptions = FAST_OPTIONS,
    cluster: ClusterSpec | None = None,
) -> str:
    """Store `spec` and queue a job of it (default: one host of 4 devices); its id."""
    with session_scope(sessions) as s:
        model, _ = put_model(s, spec=spec)
        job = create_job(
            s,
            model_id=model.id,
            cluster=cluster or ClusterSpec(num_hosts=1, devices_per_host=4),
            options=options,
        )
        return job.id
