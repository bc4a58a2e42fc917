"""Migration 0008 on a database at 0007 that holds profiles, on SQLite and Postgres: every row
gets `measured_by` (empty, or its stored result's own), nothing else changes, and it goes
back down. Postgres runs in a schema of its own, dropped after."""

from alembic import command
from sqlalchemy import MetaData, Table, inspect
from sqlalchemy.orm import Session

from migrations import alembic_config, upgrade
from schemas import ProfileStatus, StageKey
from store import get_profile, make_engine, profile_result
from store.profiles import _profile_values
from tests.store.factories import profile

KEY = StageKey(start=0, end=0, submesh_id=0, config_id=0)
TWO_HOSTS = ["a1b2c3d4e5f6:4242", "0f9e8d7c6b5a:4250"]


def test_0008_gives_old_rows_measured_by(empty_url: str) -> None:
    upgrade(empty_url, "0007")
    engine = make_engine(empty_url)
    old = profile("old-row", key=KEY)
    failed = profile("old-failed", ProfileStatus.oom, key=KEY)
    # Stored by code that already wrote the field into `result`, before the column existed.
    newer = profile("newer-row", key=KEY).model_copy(update={"measured_by": tuple(TWO_HOSTS)})
    rows = []
    for result in (old, failed, newer):
        values = _profile_values(result)
        del values["measured_by"]
        if result is not newer:
            del values["result"]["measured_by"]
        rows.append(values)
    with engine.begin() as conn:
        table = Table("stage_profiles", MetaData(), autoload_with=conn)
        assert "measured_by" not in table.c
        conn.execute(table.insert(), rows)  # every other column of 0007's table

    upgrade(empty_url)

    columns = {c["name"]: c for c in inspect(engine).get_columns("stage_profiles")}
    assert columns["measured_by"]["nullable"] is False
    with Session(engine) as s:
        for result, column in ((old, []), (failed, []), (newer, TWO_HOSTS)):
            row = get_profile(s, fingerprint=result.fingerprint)
            assert row is not None
            assert row.measured_by == column
            assert profile_result(row) == result
            assert profile_result(row).measured_by == tuple(column)

    command.downgrade(alembic_config(empty_url), "0007")
    columns = {c["name"] for c in inspect(engine).get_columns("stage_profiles")}
    assert "measured_by" not in columns and "result" in columns
    engine.dispose()
