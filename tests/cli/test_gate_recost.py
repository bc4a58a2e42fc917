"""Today's measurements of the baseline's stages, from a real job's profile table: read from
the store (embedded gate) and through the API of the live server (`--server`), the same; a
candidate today's job only estimated is never taken for a measurement; the keys the gate
asks today's job to measure."""

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from cli.gate.local import StoreProfiles
from cli.gate.recost import baseline_keys, measure_baseline, remeasure
from cli.gate.remote import ApiProfiles
from cli.gate.verdict import Remeasured
from client.sdk import StageprofClient
from schemas import (
    PlannedStage,
    PlanOptions,
    ProfileStatus,
    ShardingConfig,
    StageKey,
    StageProfileResult,
    SubmeshShape,
)
from schemas.plan import MAX_MEASURE_STAGES
from server import Settings
from store import JobCandidateRow, mark_estimated, session_scope
from tests.server.factories import seed_job
from tests.server.live import LiveServer
from tests.support.profiles import GIB, fake_profile

# seed_job's 1x2 cluster: submesh 0 is 1x1 (data); submesh 1 is 1x2 (2x1 data, 1x2 megatron)
MESHES = {
    (0, 0): ((1, 1), (1, 1), "data"),
    (1, 0): ((1, 2), (2, 1), "data"),
    (1, 1): ((1, 2), (1, 2), "megatron"),
}


def planned(start: int, end: int, submesh_id: int, config_id: int) -> PlannedStage:
    """A baseline stage with these ids, on the submesh and config they name in the job."""
    submesh, mesh, strategy = MESHES[(submesh_id, config_id)]
    return PlannedStage(
        start=start,
        end=end,
        layer_names=[f"chain_layer{i}" for i in range(start, end + 1)],
        submesh_id=submesh_id,
        config_id=config_id,
        submesh=SubmeshShape(hosts=submesh[0], devices_per_host=submesh[1]),
        config=ShardingConfig(logical_mesh=mesh, strategy=strategy),  # type: ignore[arg-type]
        forward_cost=0.001,
        backward_cost=0.002,
        compute_cost=0.003,
    )


@pytest.fixture(scope="module")
def live(db_url: str) -> Iterator[LiveServer]:
    with LiveServer(Settings(database_url=db_url)) as srv:
        yield srv


def describe(got: Remeasured) -> str:
    if got.result is None:
        return f"missing: {got.missing}"
    return f"{got.result.status.value} {got.result.submesh} peak {got.result.peak_memory}"


def test_baseline_stages_are_found_in_todays_job_or_say_why_not(
    committing: sessionmaker[Session], live: LiveServer
) -> None:
    # 4 layers: the first half of the candidates recorded, the last 3 pruned, the rest pending
    job = seed_job(committing, num_layers=4, finished=False, recorded_fraction=0.5, pruned=3)
    moved = planned(0, 1, 1, 0).model_copy(
        update={"submesh": SubmeshShape(hosts=1, devices_per_host=1)}
    )
    stages = [
        planned(0, 1, 1, 0),  # measured ok on 1x2
        planned(0, 3, 0, 0),  # the whole model on one device: oom
        planned(3, 3, 1, 1),  # pruned
        planned(2, 3, 0, 0),  # never measured: pending
        planned(0, 5, 0, 0),  # not a candidate (the model has 4 layers)
        moved,  # the ids name another submesh in today's job
    ]
    expected = [
        "ok 1x2 peak 1000",
        "oom 1x1 peak 0",
        "missing: pruned: today's job found it could not be in a better plan",
        "missing: still pending when today's job ended",
        "missing: not a stage candidate of today's job",
        "missing: today's candidate with these ids is 1x2 as 2x1/data",
    ]
    from_store = remeasure(StoreProfiles(committing), job.job_id, stages, device_memory_bytes=GIB)
    assert [describe(r) for r in from_store] == expected
    assert from_store[1].result is not None and from_store[1].result.status == ProfileStatus.oom
    with StageprofClient(live.url) as api:
        from_api = remeasure(ApiProfiles(api), job.job_id, stages, device_memory_bytes=GIB)
    assert from_api == from_store


def test_a_candidate_todays_job_only_estimated_is_not_a_measurement(
    committing: sessionmaker[Session], live: LiveServer
) -> None:
    job = seed_job(committing, num_layers=4, finished=False, recorded_fraction=0.5)
    with session_scope(committing) as s:
        pending = s.execute(
            select(JobCandidateRow).where(
                JobCandidateRow.job_id == job.job_id, JobCandidateRow.status.is_(None)
            )
        ).scalars()
        row = next(r for r in pending if (r.start, r.end) != (0, 1))
        key = (row.start, row.end, row.submesh_id, row.config_id)
        assert mark_estimated(s, job_id=job.job_id, fingerprints=[row.fingerprint]) == 1
    stages = [planned(0, 1, 1, 0), planned(*key)]
    expected = ["ok 1x2 peak 1000", "missing: estimated only: today's job did not measure it"]
    from_store = remeasure(StoreProfiles(committing), job.job_id, stages, device_memory_bytes=GIB)
    assert [describe(r) for r in from_store] == expected
    with StageprofClient(live.url) as api:
        assert (
            remeasure(ApiProfiles(api), job.job_id, stages, device_memory_bytes=GIB) == from_store
        )


class OneRow:
    """A profile table of one candidate with `status`, whose fingerprint the store holds a
    measurement of (as when another job measured the same stage)."""

    def __init__(self, status: str) -> None:
        self.status = status

    def candidates(self, job_id: str, stage: PlannedStage) -> list[dict[str, Any]]:
        return [{"start": stage.start, "end": stage.end, "status": self.status, "fingerprint": "f"}]

    def result(self, fingerprint: str) -> StageProfileResult | None:
        return fake_profile(fingerprint, submesh=SubmeshShape(hosts=1, devices_per_host=1))


@pytest.mark.parametrize(
    ("status", "missing"),
    [
        ("estimated", "estimated only: today's job did not measure it"),
        ("pruned", "pruned: today's job found it could not be in a better plan"),
        ("ok", None),
    ],
)
def test_only_a_candidate_todays_job_measured_counts(status: str, missing: str | None) -> None:
    (got,) = remeasure(OneRow(status), "job", [planned(0, 3, 0, 0)], device_memory_bytes=GIB)
    assert got.missing == missing
    assert (got.result is None) == (missing is not None)


def test_the_baseline_stages_are_asked_for_each_once_within_todays_layers() -> None:
    stages = [planned(0, 1, 1, 0), planned(2, 3, 1, 1), planned(0, 1, 1, 0)]
    keys = [k.as_tuple() for k in baseline_keys(stages)]
    assert keys == [(0, 1, 1, 0), (2, 3, 1, 1)]
    assert [k.as_tuple() for k in baseline_keys(stages, num_layers=3)] == [(0, 1, 1, 0)]
    mine = StageKey(start=2, end=3, submesh_id=1, config_id=1)
    options = PlanOptions(measure_stages=[mine])
    asked = measure_baseline(options, stages)
    assert [k.as_tuple() for k in asked.measure_stages] == [(2, 3, 1, 1), (0, 1, 1, 0)]
    assert measure_baseline(options, []) is options  # no baseline: nothing asked
    many = [planned(i, i, 0, 0) for i in range(MAX_MEASURE_STAGES + 5)]
    capped = measure_baseline(PlanOptions(), many)
    assert len(capped.measure_stages) == MAX_MEASURE_STAGES
    PlanOptions.model_validate(capped.model_dump())  # still a valid request
