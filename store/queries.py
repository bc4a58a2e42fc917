"""Read-side queries for the API and the dashboard: the profile table, cost matrices, counts.

The profile table is a keyset-paginated view of `job_candidates` (which carries status,
compute_cost and peak_memory copied from its profile), joined to `stage_profiles` for the
rest. Each page is one or two index range scans, whatever the table size:
rows whose sort value is not null first (ordered by `(value, id)`), then, for the nullable
sort keys, the rows whose value is null (failed or pending candidates) ordered by `id`.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Integer, Select, func, literal, select, tuple_
from sqlalchemy.orm import Session

from schemas import ClusterSpec, ProfileStatus, max_n_succ_stages
from store.tables import (
    ESTIMATED,
    PRUNED,
    JobCandidateRow,
    JobRow,
    LayerProgramRow,
    ModelRow,
    StageProfileRow,
)

SORT_KEYS: tuple[str, ...] = ("compute_cost", "peak_memory", "start", "recorded_at")
NULLABLE_SORT_KEYS = frozenset({"compute_cost", "peak_memory", "recorded_at"})
PENDING = "pending"
MAX_PAGE_SIZE = 1000
_PROFILE_STATUSES = frozenset(s.value for s in ProfileStatus)
# What a candidate's status says about its sort value (how record_result and mark_pruned
# write rows): statuses whose value is never null, and statuses whose value is always null.
# A status filter inside one of these sets lets a page skip one of its two range scans.
_NEVER_NULL: dict[str, frozenset[str]] = {
    "compute_cost": frozenset({"ok"}),
    "peak_memory": _PROFILE_STATUSES,
    "recorded_at": _PROFILE_STATUSES | {PRUNED, ESTIMATED},
}
_ALWAYS_NULL: dict[str, frozenset[str]] = {
    "compute_cost": (_PROFILE_STATUSES - {"ok"}) | {PENDING, PRUNED, ESTIMATED},
    "peak_memory": frozenset({PENDING, PRUNED, ESTIMATED}),
    "recorded_at": frozenset({PENDING}),
}

_C = JobCandidateRow
_P = StageProfileRow

# The columns of one profile-table row, in CSV order: name -> column.
PROFILE_COLUMNS: dict[str, Any] = {
    "id": _C.id,
    "job_id": _C.job_id,
    "model_id": _C.model_id,
    "start": _C.start,
    "end": _C.end,
    "submesh_id": _C.submesh_id,
    "config_id": _C.config_id,
    "micro_batch_size": _C.micro_batch_size,
    "num_devices": _C.num_devices,
    "strategy": _C.strategy,
    "status": _C.status,
    "compute_cost": _C.compute_cost,
    "estimated_cost": _C.estimated_cost,
    "forward_cost": _P.forward_cost,
    "backward_cost": _P.backward_cost,
    "peak_memory": _C.peak_memory,
    "initial_var_size": _P.initial_var_size,
    "intermediate_size": _P.intermediate_size,
    "max_n_succ_stages": _P.max_n_succ_stages,
    "submesh_hosts": _P.submesh_hosts,
    "submesh_devices": _P.submesh_devices,
    "mesh_dp": _P.mesh_dp,
    "mesh_tp": _P.mesh_tp,
    "compile_seconds": _P.compile_seconds,
    "reused": _C.reused,
    "fingerprint": _C.fingerprint,
    "profile_id": _C.profile_id,
    "recorded_at": _C.recorded_at,
    "error": _P.error,
    "measured_by": _P.measured_by,
}
_SORT_COLUMNS = {key: PROFILE_COLUMNS[key] for key in SORT_KEYS}


@dataclass(frozen=True)
class ProfileFilter:
    """Filters of the profile table; None (or empty) means no filter.

    `start_min`/`end_max` select the candidates inside a layer range:
    `start >= start_min` and `end <= end_max`. `statuses` may include "pending"
    (a candidate without a result yet).
    """

    model_id: str | None = None
    job_id: str | None = None
    start_min: int | None = None
    end_max: int | None = None
    submesh_id: int | None = None
    config_id: int | None = None
    statuses: tuple[str, ...] = ()
    num_devices: int | None = None
    strategy: str | None = None
    fingerprint: str | None = None
    micro_batch_size: int | None = None

    def conditions(self) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        equal = {
            "model_id": _C.model_id,
            "job_id": _C.job_id,
            "submesh_id": _C.submesh_id,
            "config_id": _C.config_id,
            "num_devices": _C.num_devices,
            "strategy": _C.strategy,
            "fingerprint": _C.fingerprint,
            "micro_batch_size": _C.micro_batch_size,
        }
        for name, column in equal.items():
            value = getattr(self, name)
            if value is not None:
                out.append(column == value)
        if self.start_min is not None:
            out.append(_C.start >= self.start_min)
        if self.end_max is not None:
            out.append(_C.end <= self.end_max)
        if self.statuses:
            known = [s for s in self.statuses if s != PENDING]
            parts = [_C.status.in_(known)] if known else []
            if PENDING in self.statuses:
                parts.append(_C.status.is_(None))
            out.append(parts[0] if len(parts) == 1 else parts[0] | parts[1])
        return out


@dataclass(frozen=True)
class ProfileSort:
    """Sort of the profile table: a key of `SORT_KEYS`, ascending unless `descending`.

    Nulls (failed or pending candidates) always come last; ties are broken by row id.
    """

    key: str = "compute_cost"
    descending: bool = False

    def __post_init__(self) -> None:
        if self.key not in SORT_KEYS:
            raise ValueError(f"cannot sort by {self.key!r}; use one of {SORT_KEYS}")

    @classmethod
    def parse(cls, text: str) -> "ProfileSort":
        """`"compute_cost"` (ascending) or `"-compute_cost"` (descending)."""
        return cls(key=text.lstrip("-"), descending=text.startswith("-"))

    def __str__(self) -> str:
        return ("-" if self.descending else "") + self.key


@dataclass(frozen=True)
class PageCursor:
    """Where a page ended: the last row's sort value (None in the nulls tail) and id."""

    value: float | int | datetime | None
    id: int


@dataclass(frozen=True)
class ProfilePage:
    rows: list[dict[str, Any]]
    next: PageCursor | None


def profile_page(
    session: Session,
    *,
    filters: ProfileFilter,
    sort: ProfileSort,
    limit: int = 100,
    after: PageCursor | None = None,
) -> ProfilePage:
    """One page of the profile table (dicts keyed like `PROFILE_COLUMNS`) and the next cursor."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be in [1, {MAX_PAGE_SIZE}], got {limit}")
    column = _SORT_COLUMNS[sort.key]
    base = (
        select(*[c.label(name) for name, c in PROFILE_COLUMNS.items()])
        .select_from(_C)
        .outerjoin(_P, _P.id == _C.profile_id)
        .where(*filters.conditions())
    )
    rows: list[dict[str, Any]] = []
    statuses = set(filters.statuses)
    only_nulls = bool(statuses) and statuses <= _ALWAYS_NULL.get(sort.key, frozenset())
    no_nulls = sort.key not in NULLABLE_SORT_KEYS or (
        bool(statuses) and statuses <= _NEVER_NULL[sort.key]
    )
    if (after is None or after.value is not None) and not only_nulls:
        rows = _fetch(session, _valued_part(base, column, sort, after), limit + 1)
    if not no_nulls and len(rows) <= limit:
        rows += _fetch(session, _null_part(base, column, sort, after), limit + 1 - len(rows))
    if len(rows) <= limit:
        _judge_on_their_jobs(session, rows)
        return ProfilePage(rows=rows, next=None)
    rows = rows[:limit]
    _judge_on_their_jobs(session, rows)
    last = rows[-1]
    return ProfilePage(rows=rows, next=PageCursor(value=last[sort.key], id=last["id"]))


def _judge_on_their_jobs(session: Session, rows: list[dict[str, Any]]) -> None:
    """Each ok row's `max_n_succ_stages` as its job sees the stage (that job's device
    memory), not as the job that measured it saw it: a row of a reused stage is judged anew."""
    ok = [r for r in rows if r["status"] == ProfileStatus.ok.value and r["profile_id"]]
    if not ok:
        return
    clusters = session.execute(
        select(JobRow.id, JobRow.cluster).where(JobRow.id.in_({r["job_id"] for r in ok}))
    )
    memory = {j: ClusterSpec.model_validate(c).device_memory_bytes for j, c in clusters}
    stmt = select(_P.id, _P.pipeline_peak_memory).where(
        _P.id.in_({r["profile_id"] for r in ok}), _P.pipeline_peak_memory.is_not(None)
    )
    peaks: dict[int, int | None] = {i: peak for i, peak in session.execute(stmt)}
    for r in ok:
        peak, available = peaks.get(r["profile_id"]), memory.get(r["job_id"])
        if peak is not None and available is not None:
            r["max_n_succ_stages"] = max_n_succ_stages(
                available, peak, r["initial_var_size"], r["intermediate_size"]
            )


def _valued_part(base: Select[Any], column: Any, sort: ProfileSort, after: PageCursor | None):
    stmt = base
    if sort.key in NULLABLE_SORT_KEYS:
        stmt = stmt.where(column.is_not(None))
    if after is not None:
        value = literal(after.value, type_=column.type)
        key, last = tuple_(column, _C.id), tuple_(value, literal(after.id, type_=Integer))
        stmt = stmt.where(key < last if sort.descending else key > last)
    if sort.descending:
        return stmt.order_by(column.desc(), _C.id.desc())
    return stmt.order_by(column.asc(), _C.id.asc())


def _null_part(base: Select[Any], column: Any, sort: ProfileSort, after: PageCursor | None):
    stmt = base.where(column.is_(None))
    if after is not None and after.value is None:
        stmt = stmt.where(_C.id < after.id if sort.descending else _C.id > after.id)
    return stmt.order_by(_C.id.desc() if sort.descending else _C.id.asc())


def _fetch(session: Session, stmt: Select[Any], n: int) -> list[dict[str, Any]]:
    return [dict(r) for r in session.execute(stmt.limit(n)).mappings()]


@dataclass
class CostMatrix:
    """Stage cost by (start, end) of one (submesh_id, config_id) of a job.

    `compute_cost[start][end]` is forward + backward seconds, None where the candidate is
    missing, pending, failed or estimated only; `status[start][end]` says which.
    `estimated_cost[start][end]` is the job's estimate of it (search: estimate), None where
    it made none. Labels come from the stored profiles (None until one is recorded).
    """

    submesh_id: int
    config_id: int
    num_devices: int
    strategy: str
    submesh: tuple[int, int] | None = None
    logical_mesh: tuple[int, int] | None = None
    compute_cost: list[list[float | None]] = field(default_factory=list)
    estimated_cost: list[list[float | None]] = field(default_factory=list)
    status: list[list[str | None]] = field(default_factory=list)


def job_num_layers(session: Session, *, job_id: str) -> int:
    """Layers of the job's model, or one past its largest candidate end (0 when unknown)."""
    stmt = select(ModelRow.num_layers).join(JobRow, JobRow.model_id == ModelRow.id)
    n = session.scalar(stmt.where(JobRow.id == job_id))
    if n is not None:
        return int(n)
    last = session.scalar(select(func.max(_C.end)).where(_C.job_id == job_id))
    return 0 if last is None else int(last) + 1


def cost_matrices(
    session: Session,
    *,
    job_id: str,
    num_layers: int,
    submesh_id: int | None = None,
    config_id: int | None = None,
    micro_batch_size: int | None = None,
) -> list[CostMatrix]:
    """An L×L (start × end) cost matrix for each (submesh_id, config_id) of the job, or
    only those with the given `submesh_id` / `config_id`; `micro_batch_size`: a job that
    searched counts of micro-batches has a matrix per size, this size's only."""
    stmt = (
        select(
            _C.submesh_id,
            _C.config_id,
            _C.start,
            _C.end,
            _C.num_devices,
            _C.strategy,
            _C.status,
            _C.compute_cost,
            _C.estimated_cost,
            _P.submesh_hosts,
            _P.submesh_devices,
            _P.mesh_dp,
            _P.mesh_tp,
        )
        .outerjoin(_P, _P.id == _C.profile_id)
        .where(_C.job_id == job_id)
        .order_by(_C.submesh_id, _C.config_id)
    )
    if submesh_id is not None:
        stmt = stmt.where(_C.submesh_id == submesh_id)
    if config_id is not None:
        stmt = stmt.where(_C.config_id == config_id)
    if micro_batch_size is not None:
        stmt = stmt.where(_C.micro_batch_size == micro_batch_size)
    out: dict[tuple[int, int], CostMatrix] = {}
    for r in session.execute(stmt):
        m = out.get((r.submesh_id, r.config_id))
        if m is None:
            m = CostMatrix(
                submesh_id=r.submesh_id,
                config_id=r.config_id,
                num_devices=r.num_devices,
                strategy=r.strategy,
                compute_cost=[[None] * num_layers for _ in range(num_layers)],
                estimated_cost=[[None] * num_layers for _ in range(num_layers)],
                status=[[None] * num_layers for _ in range(num_layers)],
            )
            out[(r.submesh_id, r.config_id)] = m
        if m.submesh is None and r.submesh_hosts is not None:
            m.submesh = (r.submesh_hosts, r.submesh_devices)
            m.logical_mesh = (r.mesh_dp, r.mesh_tp)
        if r.start < num_layers and r.end < num_layers:
            m.compute_cost[r.start][r.end] = r.compute_cost
            m.estimated_cost[r.start][r.end] = r.estimated_cost
            m.status[r.start][r.end] = r.status or PENDING
    return list(out.values())


def job_micro_batch_sizes(session: Session, *, job_id: str) -> list[int]:
    """The micro-batch sizes a job's candidates run at, ascending: `[0]` for a job of one
    count (its candidates carry no size), several for a job that searched counts."""
    stmt = select(func.distinct(_C.micro_batch_size)).where(_C.job_id == job_id)
    return sorted(int(x) for x in session.scalars(stmt))


def count_profiles_by_status(session: Session) -> dict[str, int]:
    """Stored stage profiles (one per stage fingerprint) by status."""
    stmt = select(_P.status, func.count()).group_by(_P.status)
    return {status: n for status, n in session.execute(stmt)}


def count_candidates(session: Session, *, job_id: str | None = None) -> int:
    stmt = select(func.count()).select_from(_C)
    if job_id is not None:
        stmt = stmt.where(_C.job_id == job_id)
    return int(session.scalar(stmt) or 0)


def layer_jaxprs(session: Session, *, fingerprints: list[str]) -> dict[str, str]:
    """The jaxpr text of each layer fingerprint (without loading the programs)."""
    stmt = select(LayerProgramRow.fingerprint, LayerProgramRow.jaxpr).where(
        LayerProgramRow.fingerprint.in_(set(fingerprints))
    )
    return {fp: text for fp, text in session.execute(stmt)}


def jobs_for_model(session: Session, *, model_id: str, limit: int = 20) -> list[JobRow]:
    """The model's jobs, newest first."""
    stmt = (
        select(JobRow)
        .where(JobRow.model_id == model_id)
        .order_by(JobRow.created_at.desc(), JobRow.id.desc())
        .limit(limit)
    )
    return list(session.scalars(stmt))
