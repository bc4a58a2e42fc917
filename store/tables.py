"""The tables: models, layer programs, jobs, stage profiles and job candidates."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from store.base import Base, UTCDateTime, utcnow

HASH_LEN = 64
# Candidate status of a stage the runner skipped: it cannot be in a better plan.
PRUNED = "pruned"
# A candidate a search: estimate job never measured: its numbers are estimates only.
ESTIMATED = "estimated"


class ModelRow(Base):
    """A model spec without its programs (those live in `layer_programs`), by content hash."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(HASH_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    num_layers: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class LayerProgramRow(Base):
    """A layer's serialized programs and jaxpr text, stored once per layer fingerprint.

    `program` holds the forward (with residuals), `backward` the backward; rows of the old
    single-program form have no backward (NULL) and cannot be measured (migration 0004)."""

    __tablename__ = "layer_programs"

    fingerprint: Mapped[str] = mapped_column(String(128), primary_key=True)
    program: Mapped[str] = mapped_column(Text)
    backward: Mapped[str | None] = mapped_column(Text, nullable=True)
    jaxpr: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobRow(Base):
    """One plan request, from queued to done, with its lease and progress."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model_id: Mapped[str | None] = mapped_column(ForeignKey("models.id"), index=True)
    zoo_name: Mapped[str | None] = mapped_column(String(64))
    zoo_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    cluster: Mapped[dict[str, Any]] = mapped_column(JSON)
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    candidates: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    reused: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    measured: Mapped[int] = mapped_column(Integer, default=0)
    distinct_stages: Mapped[int] = mapped_column(Integer, default=0)
    pruned: Mapped[int] = mapped_column(Integer, default=0)
    estimated: Mapped[int] = mapped_column(Integer, default=0)  # 0010
    # What a running job is doing ("layer profiles", "verification round 2"...) (0010).
    phase: Mapped[str | None] = mapped_column(String(64))
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the job waits for right now (devices another job holds), or null.
    waiting: Mapped[str | None] = mapped_column(String(256))
    # The client's Idempotency-Key and the server's hash of the canonical request (0005).
    idempotency_key: Mapped[str | None] = mapped_column(String(128), unique=True, index=True)
    request_hash: Mapped[str | None] = mapped_column(String(HASH_LEN), index=True)
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class StageProfileRow(Base):
    """A stage measurement, content-addressed by stage fingerprint (one row per fingerprint)."""

    __tablename__ = "stage_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(HASH_LEN), unique=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    compute_cost: Mapped[float | None] = mapped_column(Float)
    forward_cost: Mapped[float | None] = mapped_column(Float)
    backward_cost: Mapped[float | None] = mapped_column(Float)
    peak_memory: Mapped[int] = mapped_column(BigInteger, default=0)
    # The forward / backward peak that Alpa's memory rule weighs (0012; null: unknown).
    pipeline_peak_memory: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    initial_var_size: Mapped[int] = mapped_column(BigInteger, default=0)
    intermediate_size: Mapped[int] = mapped_column(BigInteger, default=0)
    max_n_succ_stages: Mapped[int] = mapped_column(Integer, default=-1)
    num_layers: Mapped[int] = mapped_column(Integer)
    submesh_hosts: Mapped[int] = mapped_column(Integer)
    submesh_devices: Mapped[int] = mapped_column(Integer)
    mesh_dp: Mapped[int] = mapped_column(Integer)
    mesh_tp: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(32))
    device_kind: Mapped[str] = mapped_column(String(64), default="")
    jax_version: Mapped[str] = mapped_column(String(64), default="")
    # The processes that measured it, one `<node>:<pid>` per host of its submesh (0008).
    measured_by: Mapped[list[str]] = mapped_column(JSON, default=list)
    compile_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobCandidateRow(Base):
    """A job's stage candidate `(start, end, submesh_id, config_id)` and the profile it got.

    status, compute_cost and peak_memory are copied from the (immutable) profile when it is
    recorded, so the profile table can be filtered and sorted without a join.
    """

    __tablename__ = "job_candidates"
    __table_args__ = (
        UniqueConstraint("job_id", "start", "end", "submesh_id", "config_id", "micro_batch_size"),
        Index("ix_job_candidates_job_fingerprint", "job_id", "fingerprint"),
        Index("ix_job_candidates_job_status", "job_id", "status"),
        Index("ix_job_candidates_job_cost", "job_id", "compute_cost", "id"),
        Index("ix_job_candidates_job_range", "job_id", "start", "end"),
        Index("ix_job_candidates_job_mesh", "job_id", "submesh_id", "config_id"),
        Index("ix_job_candidates_model_cost", "model_id", "compute_cost", "id"),
        Index("ix_job_candidates_cost", "compute_cost", "id"),
        # The profile table's other sorts and its per-submesh/config view (store.queries).
        Index("ix_job_candidates_job_memory", "job_id", "peak_memory", "id"),
        Index("ix_job_candidates_job_recorded", "job_id", "recorded_at", "id"),
        Index(
            "ix_job_candidates_job_mesh_cost",
            "job_id",
            "submesh_id",
            "config_id",
            "compute_cost",
            "id",
        ),
        Index("ix_job_candidates_memory", "peak_memory", "id"),
        Index("ix_job_candidates_recorded", "recorded_at", "id"),
        # A model's profile table under every sort, the global sort by start, and status
        # filters that match few rows (migration 0003; bench/profile_table.py).
        Index("ix_job_candidates_start", "start", "id"),
        Index("ix_job_candidates_model_memory", "model_id", "peak_memory", "id"),
        Index("ix_job_candidates_model_start", "model_id", "start", "id"),
        Index("ix_job_candidates_model_recorded", "model_id", "recorded_at", "id"),
        Index("ix_job_candidates_model_status", "model_id", "status", "id"),
        Index("ix_job_candidates_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    model_id: Mapped[str | None] = mapped_column(String(HASH_LEN))
    start: Mapped[int] = mapped_column(Integer)
    end: Mapped[int] = mapped_column(Integer)
    submesh_id: Mapped[int] = mapped_column(Integer)
    config_id: Mapped[int] = mapped_column(Integer)
    # The micro-batch size the candidate runs at when its job searches the count of
    # micro-batches (each size its own stages); 0: the job plans one count (0011).
    micro_batch_size: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    num_devices: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(32))
    fingerprint: Mapped[str] = mapped_column(String(HASH_LEN))
    profile_id: Mapped[int | None] = mapped_column(ForeignKey("stage_profiles.id"), index=True)
    reused: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str | None] = mapped_column(String(16))
    compute_cost: Mapped[float | None] = mapped_column(Float)
    peak_memory: Mapped[int | None] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The job's estimate of forward + backward from its layer profiles, seconds (0010).
    estimated_cost: Mapped[float | None] = mapped_column(Float)


class StageClaimRow(Base):
    """A stage fingerprint being measured: by whom, for which job, until when (a lease).

    A runner claims a stage before it measures it and deletes the claim when the result is
    stored; other jobs wait for that result instead of measuring the stage again, and take
    the claim over once it expires (its runner died)."""

    __tablename__ = "stage_claims"

    fingerprint: Mapped[str] = mapped_column(String(HASH_LEN), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128), index=True)
    job_id: Mapped[str] = mapped_column(String(32))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ServiceCounterRow(Base):
    """A monotonic counter shared by every runner and API process (DB retries, takeovers,
    reaped jobs, stage claims waited on); `/metrics` exports them."""

    __tablename__ = "service_counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)
