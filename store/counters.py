"""Counters shared by every runner and API process, kept in the store so that one `/metrics`
scrape of any API process shows the whole service's totals."""

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from store.engine import is_postgres
from store.tables import ServiceCounterRow

# The names in use, with what each counts (the `/metrics` help text).
COUNTERS = {
    "db_retries": "Store accesses of runners retried after a transient database error.",
    "job_takeovers": "Jobs a runner took over after their lease expired.",
    "jobs_reaped": "Jobs cancelled after their runner was gone (lease expired, cancel asked).",
    "stage_claims_waited": "Stages a job waited for because another runner was measuring them.",
    "leases_lost": "Jobs a runner stopped because its lease was lost or it was cancelled.",
}


def add_counts(session: Session, *, counts: Mapping[str, int]) -> None:
    """Add `counts` to the stored counters (created at zero when new)."""
    dialect_insert = pg_insert if is_postgres(session) else sqlite_insert
    for name, n in sorted(counts.items()):
        if n <= 0:
            continue
        stmt = dialect_insert(ServiceCounterRow).values(name=name, value=n)
        stmt = stmt.on_conflict_do_update(
            index_elements=[ServiceCounterRow.name],
            set_={"value": ServiceCounterRow.value + stmt.excluded.value},
        )
        session.execute(stmt)


def read_counters(session: Session) -> dict[str, int]:
    """Every stored counter by name."""
    rows = session.execute(select(ServiceCounterRow.name, ServiceCounterRow.value))
    return {name: int(value) for name, value in rows}
