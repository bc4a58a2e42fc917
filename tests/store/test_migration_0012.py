"""Migration 0012 on a database at 0011 that holds stage profiles as 0011's code wrote them,
on SQLite and Postgres: each row's pipeline peak is the largest forward / backward peak of
its stored result (apply_grad's is not weighed), null where the result has no modules; new
saves carry it; it goes back down. Postgres runs in a schema of its own, dropped after."""

from datetime import UTC, datetime

from alembic import command
from sqlalchemy import MetaData, Table, inspect, select
from sqlalchemy.orm import Session

from migrations import alembic_config, upgrade
from store import StageProfileRow, make_engine, save_profile
from tests.store.factories import profile


def _row(fingerprint: str, result: dict) -> dict:
    return {
        "fingerprint": fingerprint,
        "status": result["status"],
        "peak_memory": 0,
        "initial_var_size": 0,
        "intermediate_size": 0,
        "max_n_succ_stages": -1,
        "num_layers": 1,
        "submesh_hosts": 1,
        "submesh_devices": 1,
        "mesh_dp": 1,
        "mesh_tp": 1,
        "strategy": "data",
        "device_kind": "cpu",
        "jax_version": "",
        "measured_by": [],
        "compile_seconds": 0.0,
        "result": result,
        "created_at": datetime.now(UTC),
    }


def test_0012_fills_the_pipeline_peak_from_the_stored_results(empty_url: str) -> None:
    upgrade(empty_url, "0011")
    engine = make_engine(empty_url)
    measured = profile("measured").model_dump(mode="json")
    modules = [("forward", 300), ("backward", 700), ("apply_grad", 5000)]
    measured["module_profile_results"] = [
        {**measured["module_profile_results"][0], "module": kind, "peak_memory": peak}
        for kind, peak in modules
    ]
    failed = {"status": "oom", "fingerprint": "failed", "module_profile_results": []}
    unreadable = {"status": "ok", "fingerprint": "odd"}
    with engine.begin() as conn:
        table = Table("stage_profiles", MetaData(), autoload_with=conn)
        assert "pipeline_peak_memory" not in table.c
        conn.execute(
            table.insert(),
            [_row("measured", measured), _row("failed", failed), _row("odd", unreadable)],
        )

    upgrade(empty_url)

    with Session(engine) as s, s.begin():
        stmt = select(StageProfileRow.fingerprint, StageProfileRow.pipeline_peak_memory)
        peaks = {fp: peak for fp, peak in s.execute(stmt)}
        assert peaks == {"measured": 700, "failed": None, "odd": None}
        new = save_profile(s, result=profile("new"))
        assert new.pipeline_peak_memory == profile("new").pipeline_peak_memory > 0
    command.downgrade(alembic_config(empty_url), "0011")
    columns = {c["name"] for c in inspect(engine).get_columns("stage_profiles")}
    assert "pipeline_peak_memory" not in columns and "peak_memory" in columns
    engine.dispose()
