"""SQLAlchemy 2 tables and the functions that read and write them (Postgres or SQLite).

Repository functions take the session first and keyword arguments after; they flush but
never commit: the caller owns the transaction.
"""

from store.base import Base, utcnow
from store.engine import (
    DATABASE_URL_ENV,
    database_url,
    is_postgres,
    lock_for_write,
    make_engine,
    make_sessionmaker,
    normalize_url,
    session_scope,
)
from store.jobs import (
    claim_job,
    count_jobs_by_status,
    create_job,
    finish_job,
    get_job,
    is_cancel_requested,
    job_plan,
    job_to_schema,
    list_jobs,
    refresh_progress,
    renew_lease,
    request_cancel,
    set_job_model,
    set_job_status,
)
from store.models import get_model_row, get_model_spec, list_models, model_id_for, put_model
from store.profiles import (
    CandidateIn,
    add_candidates,
    get_profile,
    job_results,
    mark_pruned,
    pending_fingerprints,
    profile_result,
    record_result,
    reusable_profiles,
    save_profile,
)
from store.tables import JobCandidateRow, JobRow, LayerProgramRow, ModelRow, StageProfileRow

__all__ = [
    "DATABASE_URL_ENV",
    "Base",
    "CandidateIn",
    "JobCandidateRow",
    "JobRow",
    "LayerProgramRow",
    "ModelRow",
    "StageProfileRow",
    "add_candidates",
    "claim_job",
    "count_jobs_by_status",
    "create_job",
    "database_url",
    "finish_job",
    "get_job",
    "get_model_row",
    "get_model_spec",
    "get_profile",
    "is_cancel_requested",
    "is_postgres",
    "job_plan",
    "job_results",
    "job_to_schema",
    "list_jobs",
    "list_models",
    "lock_for_write",
    "make_engine",
    "make_sessionmaker",
    "model_id_for",
    "normalize_url",
    "pending_fingerprints",
    "profile_result",
    "put_model",
    "record_result",
    "refresh_progress",
    "renew_lease",
    "mark_pruned",
    "request_cancel",
    "reusable_profiles",
    "save_profile",
    "session_scope",
    "set_job_model",
    "set_job_status",
    "utcnow",
]
