"""Stage profiles: one row per fingerprint, even under concurrent saves; reuse rules; the
estimates of a search: estimate job and its phase."""

import threading

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from schemas import (
    ClusterSpec,
    JobStatus,
    PlanOptions,
    ProfileStatus,
    StageKey,
    StageProfileResult,
)
from store import (
    CandidateIn,
    JobCandidateRow,
    StageProfileRow,
    add_candidates,
    answers,
    claim_job,
    create_job,
    finish_job,
    forget_results,
    get_job,
    get_profile,
    job_results,
    job_to_schema,
    mark_estimated,
    mark_pruned,
    pending_fingerprints,
    profile_result,
    put_model,
    record_estimates,
    record_result,
    refresh_progress,
    reusable_profiles,
    save_profile,
    session_scope,
    set_job_phase,
)
from store.queries import ProfileFilter, ProfileSort, cost_matrices, profile_page
from tests.store.factories import profile, tiny_spec


def test_save_and_read_back(session: Session) -> None:
    result = profile("f1", cost=0.02)
    row = save_profile(session, result=result)
    assert row.status == "ok" and row.compute_cost == result.compute_cost
    assert profile_result(row) == result
    assert get_profile(session, fingerprint="f1") is not None


def test_compile_cache_hits_read_back_and_default_to_none(session: Session) -> None:
    result = profile("f-cache")
    forward, *rest = result.module_profile_results
    hit = forward.model_copy(update={"compile_cache_hit": True})
    result = result.model_copy(
        update={"module_profile_results": (hit, *rest), "compile_cache_hits": 1}
    )
    row = save_profile(session, result=result)
    again = profile_result(row)
    assert again == result and again.compile_cache_hits == 1
    assert [m.compile_cache_hit for m in again.module_profile_results][:2] == [True, False]
    # a result stored before the cache counted its hits: none
    older = {k: v for k, v in row.result.items() if k != "compile_cache_hits"}
    older["module_profile_results"] = [
        {k: v for k, v in m.items() if k != "compile_cache_hit"}
        for m in older["module_profile_results"]
    ]
    row.result = older
    old = profile_result(row)
    assert old.compile_cache_hits == 0
    assert not any(m.compile_cache_hit for m in old.module_profile_results)


def test_failed_profile_has_no_cost(session: Session) -> None:
    row = save_profile(session, result=profile("f2", ProfileStatus.compile_error))
    assert row.compute_cost is None and row.error == "compile_error happened"


def test_first_ok_result_wins(session: Session) -> None:
    first = save_profile(session, result=profile("f3", cost=1.0))
    second = save_profile(session, result=profile("f3", cost=2.0))
    assert first.id == second.id and second.compute_cost == 1.0


def test_transient_failure_is_replaced_and_not_reused(session: Session) -> None:
    save_profile(session, result=profile("f4", ProfileStatus.timeout))
    assert reusable_profiles(session, fingerprints=["f4"]) == {}
    row = save_profile(session, result=profile("f4", cost=3.0))
    assert row.status == "ok" and row.compute_cost == 3.0
    assert set(reusable_profiles(session, fingerprints=["f4", "nope"])) == {"f4"}


def test_oom_is_reusable(session: Session) -> None:
    save_profile(session, result=profile("f5", ProfileStatus.oom))
    assert set(reusable_profiles(session, fingerprints=["f5"])) == {"f5"}


GIB = 2**30
MIB = 2**20


def _oom_at(fingerprint: str, available: int) -> StageProfileResult:
    return profile(fingerprint, ProfileStatus.oom).model_copy(
        update={"available_memory": available}
    )


def test_oom_answers_only_jobs_with_no_more_memory_than_it_was_found_with(
    session: Session,
) -> None:
    save_profile(session, result=_oom_at("f6", 2 * GIB))
    for memory, reusable in ((GIB, True), (2 * GIB, True), (2 * GIB + 1, False), (64 * GIB, False)):
        found = reusable_profiles(session, fingerprints=["f6"], device_memory=memory)
        assert (set(found) == {"f6"}) is reusable, memory
        assert answers(get_profile(session, fingerprint="f6"), memory) is reusable, memory
    assert set(reusable_profiles(session, fingerprints=["f6"])) == {"f6"}  # no job: any


def test_oom_is_replaced_by_a_measurement_on_bigger_devices_only(session: Session) -> None:
    save_profile(session, result=_oom_at("f7", 2 * GIB))
    row = save_profile(session, result=_oom_at("f7", GIB).model_copy(update={"error": "small"}))
    assert row.status == "oom" and row.result["available_memory"] == 2 * GIB  # smaller: kept
    row = save_profile(session, result=_oom_at("f7", 8 * GIB))
    assert row.status == "oom" and row.result["available_memory"] == 8 * GIB
    ok = profile("f7", cost=4.0).model_copy(update={"available_memory": 64 * GIB})
    row = save_profile(session, result=ok)
    assert row.status == "ok" and row.compute_cost == 4.0
    row = save_profile(session, result=_oom_at("f7", 128 * GIB))  # an ok result stays
    assert row.status == "ok"
    timeout = profile("f8", ProfileStatus.timeout).model_copy(update={"available_memory": 9})
    save_profile(session, result=_oom_at("f8", 1))
    assert save_profile(session, result=timeout).status == "oom"  # never by a transient one


def test_concurrent_saves_keep_one_row(committing: sessionmaker[Session]) -> None:
    barrier = threading.Barrier(4)
    ids: list[int] = []
    lock = threading.Lock()

    def saver(cost: float) -> None:
        barrier.wait()
        with session_scope(committing) as s:
            row = save_profile(s, result=profile("same", cost=cost))
            with lock:
                ids.append(row.id)

    threads = [threading.Thread(target=saver, args=(0.1 * (i + 1),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    with session_scope(committing) as s:
        n = s.scalar(
            select(func.count())
            .select_from(StageProfileRow)
            .where(StageProfileRow.fingerprint == "same")
        )
    assert n == 1 and len(ids) == 4 and len(set(ids)) == 1


def test_candidates_record_results_by_fingerprint(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    job = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    keys = [
        StageKey(start=0, end=0, submesh_id=1, config_id=0),
        StageKey(start=1, end=1, submesh_id=1, config_id=0),
        StageKey(start=0, end=1, submesh_id=0, config_id=0),
    ]
    add_candidates(
        session,
        job_id=job.id,
        model_id=model.id,
        candidates=[
            CandidateIn(keys[0], "same-block", 2, "data"),
            CandidateIn(keys[1], "same-block", 2, "data"),
            CandidateIn(keys[2], "whole", 4, "data"),
        ],
    )
    assert pending_fingerprints(session, job_id=job.id) == ["whole", "same-block"]
    row = save_profile(session, result=profile("same-block", key=keys[0]))
    assert record_result(session, job_id=job.id, profile=row, reused=False) == 2
    assert record_result(session, job_id=job.id, profile=row, reused=False) == 0
    assert pending_fingerprints(session, job_id=job.id) == ["whole"]
    results = job_results(session, job_id=job.id)
    assert set(results) == {keys[0].as_tuple(), keys[1].as_tuple()}
    assert results[keys[1].as_tuple()].fingerprint == "same-block"


def test_a_superset_profile_records_under_the_candidates_fingerprint(session: Session) -> None:
    """A measurement with the backward split (its own fingerprint) reused by a job whose
    candidates carry the fingerprint without the split."""
    model, _ = put_model(session, spec=tiny_spec())
    job = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    key = StageKey(start=0, end=0, submesh_id=0, config_id=0)
    add_candidates(
        session, job_id=job.id, model_id=model.id, candidates=[CandidateIn(key, "plain", 1, "data")]
    )
    twin = save_profile(session, result=profile("with-split", key=key))
    assert record_result(session, job_id=job.id, profile=twin, reused=True) == 0
    n = record_result(session, job_id=job.id, profile=twin, reused=True, fingerprint="plain")
    assert n == 1
    assert pending_fingerprints(session, job_id=job.id) == []
    assert job_results(session, job_id=job.id)[key.as_tuple()].fingerprint == "with-split"


def test_an_unsplit_record_is_forgotten_and_replaced_by_the_split_one(session: Session) -> None:
    """A stage measured without the backward split (its own fingerprint), recorded for the
    job's candidate, then measured split: the candidate takes the split measurement."""
    model, _ = put_model(session, spec=tiny_spec())
    job = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    key = StageKey(start=0, end=0, submesh_id=0, config_id=0)
    other = StageKey(start=1, end=1, submesh_id=0, config_id=0)
    add_candidates(
        session,
        job_id=job.id,
        model_id=model.id,
        candidates=[CandidateIn(key, "split", 1, "data"), CandidateIn(other, "kept", 1, "data")],
    )
    plain = save_profile(session, result=profile("unsplit", key=key))
    kept = save_profile(session, result=profile("kept", key=other))
    record_result(session, job_id=job.id, profile=plain, reused=False, fingerprint="split")
    record_result(session, job_id=job.id, profile=kept, reused=False)
    assert pending_fingerprints(session, job_id=job.id) == []
    assert forget_results(session, job_id=job.id, fingerprints=["split"]) == 1
    assert forget_results(session, job_id=job.id, fingerprints=[]) == 0
    assert pending_fingerprints(session, job_id=job.id) == ["split"]
    assert set(job_results(session, job_id=job.id)) == {other.as_tuple()}
    split = save_profile(session, result=profile("split", key=key))
    assert record_result(session, job_id=job.id, profile=split, reused=False) == 1
    assert job_results(session, job_id=job.id)[key.as_tuple()].fingerprint == "split"
    assert get_profile(session, fingerprint="unsplit") is not None  # kept for other jobs


def test_profile_rows_judge_a_reused_stage_on_their_own_job_s_devices(session: Session) -> None:
    """One stage measured by a job on 1 GiB devices, reused by one on 1 MiB devices: each
    job's row says how many stages may follow it on that job's devices (Alpa's rule)."""
    model, _ = put_model(session, spec=tiny_spec())
    key = StageKey(start=0, end=0, submesh_id=0, config_id=0)
    measured = profile("judged", key=key).model_copy(
        update={"available_memory": GIB, "intermediate_size": 200_000, "max_n_succ_stages": 9}
    )
    row = save_profile(session, result=measured)
    free = [m - measured.pipeline_peak_memory - measured.initial_var_size for m in (GIB, MIB)]
    alpa = [f // measured.intermediate_size - 1 for f in free]  # Alpa's 1F1B rule
    assert 0 <= alpa[1] < 9 < alpa[0]
    jobs = {}
    for memory, expected in zip((GIB, MIB), alpa, strict=True):
        cluster = ClusterSpec(devices_per_host=2, device_memory_bytes=memory)
        job = create_job(session, model_id=model.id, cluster=cluster, options=PlanOptions())
        add_candidates(
            session,
            job_id=job.id,
            model_id=model.id,
            candidates=[CandidateIn(key, "judged", 2, "data")],
        )
        record_result(session, job_id=job.id, profile=row, reused=memory != GIB)
        jobs[job.id] = expected
    for job_id, expected in jobs.items():
        page = profile_page(
            session, filters=ProfileFilter(job_id=job_id), sort=ProfileSort("start")
        )
        assert [r["max_n_succ_stages"] for r in page.rows] == [expected]
    assert profile_result(row).max_n_succ_stages == 9  # the stored measurement is as saved


def test_pruned_stages_count_as_done_without_a_profile(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    job = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    add_candidates(
        session,
        job_id=job.id,
        model_id=model.id,
        candidates=[
            CandidateIn(StageKey(start=0, end=0, submesh_id=0, config_id=0), "small", 1, "data"),
            CandidateIn(StageKey(start=0, end=1, submesh_id=0, config_id=0), "big", 1, "data"),
        ],
    )
    record_result(
        session, job_id=job.id, profile=save_profile(session, result=profile("small")), reused=False
    )
    assert mark_pruned(session, job_id=job.id, fingerprints=["big", "small"]) == 1
    assert pending_fingerprints(session, job_id=job.id) == []
    progress = refresh_progress(session, job_id=job.id)
    assert (progress.candidates, progress.done, progress.pruned, progress.failed) == (2, 2, 1, 0)
    assert set(job_results(session, job_id=job.id)) == {(0, 0, 0, 0)}
    late = save_profile(session, result=profile("big"))
    assert record_result(session, job_id=job.id, profile=late, reused=False) == 0


def test_estimated_stages_in_the_profile_table_and_cost_matrix(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    job = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    add_candidates(
        session,
        job_id=job.id,
        model_id=model.id,
        candidates=[
            CandidateIn(StageKey(start=0, end=0, submesh_id=0, config_id=0), "layer", 1, "data"),
            CandidateIn(StageKey(start=0, end=1, submesh_id=0, config_id=0), "long", 1, "data"),
        ],
    )
    layer = save_profile(session, result=profile("layer", cost=0.02))
    record_result(session, job_id=job.id, profile=layer, reused=False)
    assert record_estimates(session, job_id=job.id, estimates={"layer": 0.021, "long": 0.05}) == 2
    assert mark_estimated(session, job_id=job.id, fingerprints=["long", "layer"]) == 1
    set_job_phase(session, job_id=job.id, owner="nobody", phase="estimates")  # not the owner

    def page(*statuses: str) -> list[dict]:
        filters = ProfileFilter(job_id=job.id, statuses=statuses)
        return profile_page(session, filters=filters, sort=ProfileSort.parse("compute_cost")).rows

    (row,) = page("estimated")
    assert (row["end"], row["compute_cost"], row["estimated_cost"]) == (1, None, 0.05)
    assert [r["estimated_cost"] for r in page("ok", "estimated")] == [0.021, 0.05]
    assert page("pending") == []
    progress = refresh_progress(session, job_id=job.id)
    assert (progress.measured, progress.estimated, progress.done) == (1, 1, 2)
    (matrix,) = cost_matrices(session, job_id=job.id, num_layers=2)
    assert matrix.status[0] == ["ok", "estimated"]
    assert matrix.compute_cost[0] == [0.02, None]
    assert matrix.estimated_cost[0] == [0.021, 0.05]


def test_a_running_job_says_its_phase_until_it_ends(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    job = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    assert claim_job(session, owner="r1", lease_seconds=60, job_id=job.id) is not None
    assert not set_job_phase(session, job_id=job.id, owner="r2", phase="estimates")
    assert set_job_phase(session, job_id=job.id, owner="r1", phase="verification round 3")
    session.expire_all()  # the update bypassed the session's copy of the row
    row = get_job(session, job_id=job.id)
    assert row is not None
    assert job_to_schema(session, row).phase == "verification round 3"
    finish_job(session, job_id=job.id, owner="r1", status=JobStatus.failed, error="x")
    session.refresh(row)
    assert job_to_schema(session, row).phase is None


def test_estimated_stages_keep_their_estimate_and_count_as_done(session: Session) -> None:
    model, _ = put_model(session, spec=tiny_spec())
    job = create_job(session, model_id=model.id, cluster=ClusterSpec(), options=PlanOptions())
    keys = [StageKey(start=0, end=e, submesh_id=0, config_id=0) for e in range(3)]
    add_candidates(
        session,
        job_id=job.id,
        model_id=model.id,
        candidates=[CandidateIn(k, f"s{k.end}", 1, "data") for k in keys],
    )
    record_result(
        session, job_id=job.id, profile=save_profile(session, result=profile("s0")), reused=False
    )
    estimates = {"s0": 0.001, "s1": 0.002, "s2": 0.003}
    assert record_estimates(session, job_id=job.id, estimates=estimates) == 3
    assert mark_estimated(session, job_id=job.id, fingerprints=["s0", "s1"]) == 1  # s0: measured
    mark_pruned(session, job_id=job.id, fingerprints=["s2"])
    progress = refresh_progress(session, job_id=job.id)
    assert (progress.done, progress.measured, progress.estimated, progress.pruned) == (3, 1, 1, 1)
    rows = session.execute(
        select(JobCandidateRow.fingerprint, JobCandidateRow.status, JobCandidateRow.estimated_cost)
        .where(JobCandidateRow.job_id == job.id)
        .order_by(JobCandidateRow.fingerprint)
    ).all()
    assert [tuple(r) for r in rows] == [
        ("s0", "ok", 0.001),
        ("s1", "estimated", 0.002),
        ("s2", "pruned", 0.003),
    ]
    assert pending_fingerprints(session, job_id=job.id) == []
