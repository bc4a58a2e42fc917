"""The gate on a real job with the estimate search (`--prune`: the job's default search):
a baseline whose stage that search would only estimate gets it measured by today's job,
and the verdict's figures for it are that measurement (embedded: SQLite, a local Ray)."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from cli.gate.baseline import read_baseline, write_baseline
from cli.gate.local import StoreProfiles
from cli.gate.recost import remeasure
from cli.gate.verdict import human_flops, same_layout
from cli.main import main
from schemas import Plan, PlannedStage
from store import JobCandidateRow, session_scope
from tests.support.models import tiny_gpt

pytestmark = [pytest.mark.ray]

Key = tuple[int, int, int, int]
# FAST_OPTIONS (tests/support/models.py) as flags, on two devices; --prune: the job runs its
# search (estimate) instead of measuring every candidate
FAST = [
    *("--devices-per-host", "2", "--schedule", "1f1b", "--remat", "as_written"),
    *("--micro-batches", "4", "--config-space", "data_parallel_only", "--strategies", "data"),
    *("--repeats", "2", "--warmup", "1", "--workers", "1", "--prune", "--json"),
]


@pytest.fixture
def ray_cluster() -> Iterator[None]:
    """A local Ray of 2 CPUs (as tests/runner's), which the embedded gate joins."""
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield


def gate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    """Run `stageprof gate` in this process: its exit code and its --json line."""
    code = main(["gate", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1])


def statuses(sessions: sessionmaker[Session], job_id: str) -> dict[Key, str | None]:
    c = JobCandidateRow
    stmt = select(c.start, c.end, c.submesh_id, c.config_id, c.status).where(c.job_id == job_id)
    with session_scope(sessions, write=False) as s:
        return {(a, b, m, k): status for a, b, m, k, status in s.execute(stmt)}


def cut(template: PlannedStage, start: int, end: int, names: list[str]) -> PlannedStage:
    """A stage of layers start..end on the template's submesh and config."""
    return template.model_copy(
        update={"start": start, "end": end, "layer_names": names[start : end + 1]}
    )


def test_a_baseline_stage_the_search_would_only_estimate_is_measured_and_used(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    ray_cluster: None,
    sessions: sessionmaker[Session],
    db_file: str,
) -> None:
    spec = tiny_gpt(num_layers=2)  # embedding, 2 blocks, head: 4 layers
    model = tmp_path / "gpt.json"
    model.write_text(spec.model_dump_json())
    argv = ["--model", str(model), *FAST, "--database-url", db_file]

    # 1. A plan without a baseline: the search leaves some stages estimated.
    first = tmp_path / "first.json"
    code, out = gate(capsys, *argv, "--write-baseline", str(first))
    assert code == 0, out
    before = statuses(sessions, out["job_id"])
    last = spec.num_layers - 1
    longer = [
        k for k, s in before.items() if s == "estimated" and k[2:] == (0, 0) and k[1] - k[0] < last
    ]
    assert longer, before
    a, b = max(longer, key=lambda k: (k[1] - k[0], k))[:2]

    # 2. A baseline of two stages on one device each, one of them that stage (as if an
    # exhaustive search had written it).
    template = next(st for st in read_baseline(first).stages if st.submesh_id == 0)
    assert template.config_id == 0  # one config per submesh (data parallel only)
    names = [layer.name for layer in spec.layers]
    cuts = [(0, a - 1), (a, b)] if a > 0 else [(a, b), (b + 1, last)]
    stages = [cut(template, s, e, names) for s, e in cuts]
    baseline: Plan = read_baseline(first).model_copy(update={"stages": stages})
    path = tmp_path / "baseline.json"
    write_baseline(path, baseline, job_id=out["job_id"], source={"test": "cut around"})

    # 3. The gate against it: today's job measures every baseline stage, and uses them.
    code, out = gate(capsys, *argv, "--baseline", str(path))
    assert code in (0, 1), out  # decided either way
    after = statuses(sessions, out["job_id"])
    key = (a, b, 0, 0)
    print(f"stage {key}: {before[key]} without a baseline, {after[key]} with one")
    assert [after[(st.start, st.end, 0, 0)] for st in stages] == ["ok"] * len(stages)
    today = remeasure(
        StoreProfiles(sessions), out["job_id"], stages, device_memory_bytes=16 * 2**30
    )
    assert all(r.result is not None and r.missing is None for r in today), today
    checks = {c["name"]: c for c in out["checks"]}
    prefix = (
        "stage" if same_layout(baseline, Plan.model_validate(out["plan"])) else "baseline stage"
    )
    for i, got in enumerate(today):
        assert got.result is not None
        reason, measured = checks[f"{prefix} {i} FLOPs"]["reason"], human_flops(got.result.flops)
        assert f"→ {measured}" in reason or reason.endswith(f"{measured}, unchanged"), reason
    assert not [c for c in out["checks"] if "not re-measured" in c["reason"]], out["checks"]
