"""Migration 0011 on a database at 0010 that holds a job's candidates, on SQLite and Postgres:
old rows read as micro-batch size 0, one key may then be stored once per size (and only once
per size), and it goes back down. Postgres runs in a schema of its own, dropped after."""

import pytest
from alembic import command
from sqlalchemy import MetaData, Table, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from migrations import alembic_config, upgrade
from schemas import ClusterSpec, PlanOptions, StageKey
from store import (
    CandidateIn,
    add_candidates,
    create_job,
    job_results,
    make_engine,
    pending_fingerprints,
    put_model,
    record_result,
    save_profile,
)
from tests.store.factories import profile, tiny_spec

KEY = StageKey(start=0, end=0, submesh_id=0, config_id=0)


def test_0011_keeps_old_candidates_and_keys_them_by_size(empty_url: str) -> None:
    upgrade(empty_url, "0010")
    engine = make_engine(empty_url)
    with Session(engine) as s, s.begin():
        model, _ = put_model(s, spec=tiny_spec())
        job = create_job(s, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
        job_id, model_id = job.id, model.id
    with engine.begin() as conn:
        table = Table("job_candidates", MetaData(), autoload_with=conn)
        assert "micro_batch_size" not in table.c
        conn.execute(  # a row as 0010's code wrote it
            table.insert(),
            [
                {
                    "job_id": job_id,
                    "model_id": model_id,
                    "start": 0,
                    "end": 0,
                    "submesh_id": 0,
                    "config_id": 0,
                    "num_devices": 1,
                    "strategy": "data",
                    "fingerprint": "old",
                    "reused": False,
                }
            ],
        )

    upgrade(empty_url)

    columns = {c["name"]: c for c in inspect(engine).get_columns("job_candidates")}
    assert columns["micro_batch_size"]["nullable"] is False
    with Session(engine) as s, s.begin():
        assert pending_fingerprints(s, job_id=job_id) == ["old"]
        assert pending_fingerprints(s, job_id=job_id, micro_batch_size=0) == ["old"]
        assert pending_fingerprints(s, job_id=job_id, micro_batch_size=4) == []
        # the same key at two sizes: two candidates, each with its own stage
        added = add_candidates(
            s,
            job_id=job_id,
            model_id=model_id,
            candidates=[
                CandidateIn(KEY, "at-4", 1, "data", 4),
                CandidateIn(KEY, "at-2", 1, "data", 2),
            ],
        )
        assert added == 2
        for fp in ("old", "at-4"):
            row = save_profile(s, result=profile(fp, key=KEY))
            record_result(s, job_id=job_id, profile=row, reused=False)
        assert job_results(s, job_id=job_id, micro_batch_size=4)[KEY.as_tuple()].fingerprint == (
            "at-4"
        )
        assert job_results(s, job_id=job_id, micro_batch_size=0)[KEY.as_tuple()].fingerprint == (
            "old"
        )
        assert job_results(s, job_id=job_id, micro_batch_size=2) == {}
        assert pending_fingerprints(s, job_id=job_id) == ["at-2"]
    with pytest.raises(IntegrityError), Session(engine) as s, s.begin():
        s.connection().execute(
            Table("job_candidates", MetaData(), autoload_with=s.connection()).insert(),
            [
                {
                    "job_id": job_id,
                    "model_id": model_id,
                    "start": 0,
                    "end": 0,
                    "submesh_id": 0,
                    "config_id": 0,
                    "micro_batch_size": 4,
                    "num_devices": 1,
                    "strategy": "data",
                    "fingerprint": "twice",
                    "reused": False,
                }
            ],
        )

    with Session(engine) as s, s.begin():  # one size per key again: downgrade-able
        s.connection().exec_driver_sql("DELETE FROM job_candidates WHERE micro_batch_size > 0")
    command.downgrade(alembic_config(empty_url), "0010")
    columns_after = {c["name"] for c in inspect(engine).get_columns("job_candidates")}
    assert "micro_batch_size" not in columns_after and "fingerprint" in columns_after
    engine.dispose()
