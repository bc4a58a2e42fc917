"""Stage claims: one runner at a time measures a stage fingerprint, under a lease.

A claim is taken before a stage is measured and deleted when its result is stored. Other
jobs see the claim, measure other stages meanwhile and wait for the stored result; a claim
whose lease expired (its runner died) may be taken over by anyone.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from store.base import utcnow
from store.engine import is_postgres
from store.tables import StageClaimRow


def claim_stage(
    session: Session, *, fingerprint: str, owner: str, job_id: str, lease_seconds: float
) -> bool:
    """Claim `fingerprint` for `owner`: True when it was free, expired or already `owner`'s."""
    now = utcnow()
    values = {
        "fingerprint": fingerprint,
        "owner": owner,
        "job_id": job_id,
        "expires_at": now + timedelta(seconds=lease_seconds),
    }
    dialect_insert = pg_insert if is_postgres(session) else sqlite_insert
    stmt = dialect_insert(StageClaimRow).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[StageClaimRow.fingerprint],
        set_={k: stmt.excluded[k] for k in ("owner", "job_id", "expires_at")},
        where=or_(StageClaimRow.expires_at < now, StageClaimRow.owner == owner),
    )
    # RETURNING, not rowcount: psycopg reports no rowcount for an upsert.
    return session.execute(stmt.returning(StageClaimRow.fingerprint)).first() is not None


def renew_claims(session: Session, *, owner: str, lease_seconds: float) -> int:
    """Extend every claim `owner` holds; how many it holds."""
    result = session.execute(
        update(StageClaimRow)
        .where(StageClaimRow.owner == owner)
        .values(expires_at=utcnow() + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def release_claims(
    session: Session, *, owner: str, fingerprints: Iterable[str] | None = None
) -> int:
    """Delete `owner`'s claims (all of them, or those on `fingerprints`); how many."""
    stmt = delete(StageClaimRow).where(StageClaimRow.owner == owner)
    if fingerprints is not None:
        wanted = list(fingerprints)
        if not wanted:
            return 0
        stmt = stmt.where(StageClaimRow.fingerprint.in_(wanted))
    result = session.execute(stmt.execution_options(synchronize_session=False))
    return int(result.rowcount)  # type: ignore[attr-defined]


def live_claims(
    session: Session, *, fingerprints: Iterable[str], exclude_owner: str | None = None
) -> dict[str, tuple[str, datetime]]:
    """Unexpired claims on `fingerprints`: fingerprint -> (owner, expires_at)."""
    wanted = list(set(fingerprints))
    now = utcnow()
    found: dict[str, tuple[str, datetime]] = {}
    for i in range(0, len(wanted), 500):
        stmt = select(StageClaimRow).where(
            StageClaimRow.fingerprint.in_(wanted[i : i + 500]), StageClaimRow.expires_at >= now
        )
        if exclude_owner is not None:
            stmt = stmt.where(StageClaimRow.owner != exclude_owner)
        found.update((r.fingerprint, (r.owner, r.expires_at)) for r in session.scalars(stmt))
    return found
