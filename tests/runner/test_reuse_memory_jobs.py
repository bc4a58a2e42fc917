"""One store, jobs on devices of different memory (issue 37): a stage measured by a job on big
devices is judged on the asking job's devices. A one-device job measures remat variants only
when memory could bind; the gate against a baseline of bigger devices reports the memory
regression; the verdict is never "unique" beside another feasible plan."""

import json
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from cli.main import main
from schemas import ClusterSpec, JobStatus, PlannedStage, StageProfileResult
from store import get_profile, profile_result, session_scope
from tests.support.jobs import queue_job
from tests.support.models import FAST_OPTIONS, tiny_gpt
from workers.jobs.runner import JobRunner, RunnerConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

GIB = 2**30
BIG = 64 * GIB
# big enough that one stage needs more than the least device memory a job may ask (1 MiB)
SIZES = {"hidden_size": 128, "seq_len": 64, "vocab_size": 512, "batch_size": 8}


def one_device(memory: int) -> ClusterSpec:
    return ClusterSpec(num_hosts=1, devices_per_host=1, device_memory_bytes=memory)


def stored(sessions: sessionmaker[Session], stage: PlannedStage) -> StageProfileResult:
    with session_scope(sessions, write=False) as s:
        row = get_profile(s, fingerprint=stage.fingerprint)
        assert row is not None
        return profile_result(row)


def need(r: StageProfileResult) -> int:
    """Bytes a lone 1F1B stage needs per device: its peak, parameters and optimizer state,
    and one micro-batch's stash (Alpa's rule with no stage after it)."""
    return r.pipeline_peak_memory + r.initial_var_size + r.intermediate_size


def test_a_stage_stored_by_a_bigger_device_is_judged_on_the_asking_job_s(
    sessions: sessionmaker[Session],
) -> None:
    spec = tiny_gpt(num_layers=1, **SIZES)
    runner = JobRunner(sessions, RunnerConfig(num_workers=1, lease_seconds=20))
    auto = FAST_OPTIONS.model_copy(update={"remat": "auto"})

    def run(options, memory: int):
        outcome = runner.run_next(queue_job(sessions, spec, options, cluster=one_device(memory)))
        assert outcome is not None
        return outcome

    # ample memory on one device: the whole model once, no remat variant
    first = run(auto, BIG)
    assert first.status == JobStatus.done and first.plan is not None, first.error
    print(f"64 GiB, remat auto: {first.stats.measured} stage(s) measured")
    assert first.stats.measured == 1
    (written,) = first.plan.stages
    assert written.remat == "as_written"
    full = run(FAST_OPTIONS.model_copy(update={"remat": "full"}), BIG)
    assert full.status == JobStatus.done and full.plan is not None, full.error
    need_written, need_full = (
        need(stored(sessions, written)),
        need(stored(sessions, full.plan.stages[0])),
    )
    print(f"one stage needs {need_written} B as written, {need_full} B under full remat")
    assert need_full < need_written
    small = (need_written + need_full) // 2
    assert small >= 2**20

    # the same store, a small device: the stored stage no longer fits
    refused = run(FAST_OPTIONS, small)
    print(f"{small} B, as written: {refused.status.value}: {refused.error}")
    assert refused.status == JobStatus.failed and refused.plan is None
    assert refused.stats.measured == 0 and refused.stats.reused == 1
    assert "misses by" in (refused.error or "")
    # with remat auto the same store answers with a remat variant that fits
    remat = run(auto, small)
    assert remat.status == JobStatus.done and remat.plan is not None, remat.error
    (stage,) = remat.plan.stages
    print(f"{small} B, remat auto: {stage.remat}, max succ {stage.max_n_succ_stages}")
    assert stage.remat != "as_written" and stage.max_n_succ_stages >= 0
    assert need(stored(sessions, stage)) <= small


def test_an_oom_found_on_smaller_devices_is_measured_again_for_bigger_ones(
    sessions: sessionmaker[Session],
) -> None:
    spec = tiny_gpt(num_layers=1, **SIZES)
    runner = JobRunner(sessions, RunnerConfig(num_workers=1, lease_seconds=20))

    def run(memory: int):
        job = queue_job(sessions, spec, FAST_OPTIONS, cluster=one_device(memory))
        outcome = runner.run_next(job)
        assert outcome is not None
        return outcome

    tiny = run(2**20)  # the least memory a job may ask: this stage does not fit
    print(f"1 MiB: {tiny.status.value}: {tiny.error}")
    assert tiny.status == JobStatus.failed and tiny.stats.progress.failed == 1
    # a bigger device measures it again instead of reusing the oom, and plans it
    big = run(BIG)
    assert big.status == JobStatus.done and big.plan is not None, big.error
    assert big.stats.measured == 1 and big.stats.reused == 0
    (stage,) = big.plan.stages
    assert stored(sessions, stage).ok  # the stored row is the bigger device's answer now
    # a device as small as the first is answered by that measurement, not measured again
    again = run(2**20)
    assert again.status == JobStatus.failed and again.stats.measured == 0
    assert "misses by" in (again.error or ""), again.error


def gate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["gate", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1])


def test_the_gate_against_a_baseline_of_bigger_devices_reports_the_memory_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sessions, db_file: str
) -> None:
    model = tmp_path / "gpt.json"
    model.write_text(tiny_gpt(num_layers=1, **SIZES).model_dump_json())
    argv = [
        *("--model", str(model), "--devices-per-host", "1", "--schedule", "1f1b"),
        *("--remat", "as_written", "--micro-batches", "4", "--strategies", "data"),
        *("--repeats", "2", "--warmup", "1", "--workers", "1", "--json"),
        *("--database-url", db_file),
    ]
    base = tmp_path / "baseline.json"
    code, out = gate(capsys, *argv, "--device-memory-gib", "64", "--write-baseline", str(base))
    assert code == 0, out
    (stage,) = json.loads(base.read_text())["plan"]["stages"]
    small = stage["peak_memory"] // 2 + 2**20
    code, out = gate(
        capsys, *argv, "--device-memory-gib", repr(small / GIB), "--baseline", str(base)
    )
    failed = [c for c in out["checks"] if c["outcome"] == "fail"]
    print(f"gate on {small} B devices: exit {code}; " + "; ".join(c["reason"] for c in failed))
    assert code == 1
    assert any(c["figure"] == "memory" and "no longer fits" in c["reason"] for c in failed)


def test_the_verdict_is_never_unique_beside_another_feasible_plan(
    sessions: sessionmaker[Session],
) -> None:
    spec = tiny_gpt(num_layers=2)
    runner = JobRunner(sessions, RunnerConfig(num_workers=1, lease_seconds=20))
    options = FAST_OPTIONS.model_copy(update={"schedule": "auto"})
    job = queue_job(sessions, spec, options, cluster=ClusterSpec(num_hosts=1, devices_per_host=2))
    outcome = runner.run_next(job)
    assert outcome is not None and outcome.plan is not None, outcome
    plan = outcome.plan
    others = [o.schedule for o in plan.schedules if o.feasible and not o.chosen]
    print(f"{plan.stability_summary()}; other feasible schedules: {others}")
    assert others and plan.stability != "unique" and plan.runner_up is not None
    times = [o.predicted_iteration_time_s for o in plan.schedules if o.feasible and not o.chosen]
    times += [b.iteration_time_s for b in plan.baselines if b.iteration_time_s is not None]
    slower = [t for t in times if t is not None and t > plan.predicted_iteration_time_s * 1.000001]
    assert all(plan.runner_up.predicted_iteration_time_s <= t for t in slower)
    summary = plan.stability_summary() or ""
    assert ("runner-up partly estimated" in summary) == plan.runner_up.partly_estimated
