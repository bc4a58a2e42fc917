"""`stageprof plan` embedded: a JSON last line, a report, and a second run that reuses all."""

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.plan_layers import assert_every_layer_planned

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = [
    "--set",
    "num_layers=2",
    "--set",
    "hidden_size=16",
    "--set",
    "num_heads=2",
    "--set",
    "seq_len=8",
    "--set",
    "vocab_size=64",
    "--set",
    "batch_size=4",
]
FAST = ["--config-space", "data_parallel_only", "--strategies", "data", "--repeats", "2"]


def _plan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STAGEPROF_DATABASE_URL=f"sqlite:///{tmp_path / 'plan.db'}")
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--zoo", "gpt", *TINY, *FAST, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _without_estimate(stage: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stage.items() if k != "estimated_cost_s"}


def test_plan_prints_json_then_reuses_everything(tmp_path: Path) -> None:
    first = _plan(
        tmp_path, "--hosts", "1", "--devices-per-host", "2", "--json", "--report", "report.html"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    out = json.loads(first.stdout.strip().splitlines()[-1])
    assert set(out) >= {"job_id", "plan", "stats"}
    stats = out["stats"]
    assert set(stats) >= {
        "candidates",
        "distinct_stages",
        "measured",
        "reused",
        "failed",
        "wall_seconds",
    }
    assert stats["measured"] > 0 and stats["reused"] == 0
    stages = out["plan"]["stages"]
    assert_every_layer_planned(out["plan"], ["embed", "block0", "block1", "head"])
    report = (tmp_path / "report.html").read_text()
    assert out["job_id"] in report and "<script" in report
    _counts_agree(stats, first.stderr, report)
    search = out["plan"]["search"]
    assert search is not None and search["mode"] == "estimate"  # the default search
    measured = search["layer_profiles"] + search["verified"]
    flat = " ".join(first.stderr.split())
    assert f"estimate search: {measured} measured ({search['layer_profiles']} layer" in flat
    assert "estimate error" in flat
    if any(s.get("estimated_cost_s") is not None for s in stages):  # a verified stage
        assert "est ms" in flat or "estimated " in flat  # table or block form
    assert 'id="plan-search"' in report

    second = _plan(tmp_path, "--hosts", "1", "--devices-per-host", "2", "--json")
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(second.stdout.strip().splitlines()[-1])
    assert again["stats"]["measured"] == 0
    assert again["stats"]["reused"] == stats["measured"]
    # the same stages; their estimates are the first job's own (made when it chose them)
    assert [_without_estimate(s) for s in again["plan"]["stages"]] == [
        _without_estimate(s) for s in stages
    ]


def test_plan_refuses_bad_input_with_a_clear_message(tmp_path: Path) -> None:
    bad = _plan(tmp_path, "--devices-per-host", "3")
    assert bad.returncode == 2
    assert "devices_per_host" in bad.stderr and "power of two" in bad.stderr
    bad = _plan(tmp_path, "--set", "num_layerz=2")
    assert bad.returncode == 2 and "num_layerz" in bad.stderr
    assert not (tmp_path / "plan.db").exists() or "Traceback" not in bad.stderr


def test_plan_through_a_pipe_prints_a_line_at_least_every_10_s(tmp_path: Path) -> None:
    env = dict(os.environ, STAGEPROF_DATABASE_URL=f"sqlite:///{tmp_path / 'plan.db'}")
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "cli", "plan", "--zoo", "gpt", *TINY, *FAST]
    started = time.monotonic()
    stamps: list[tuple[float, str]] = []
    with subprocess.Popen(
        [*cmd, "--hosts", "1", "--devices-per-host", "2"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            stamps.append((time.monotonic() - started, line.rstrip()))
        assert proc.wait(timeout=900) == 0, "\n".join(s for _, s in stamps[-30:])
    times = [t for t, _ in stamps]
    assert times[0] < 10, stamps[:3]
    progress = [(t, s) for t, s in stamps if s.startswith(("starting:", "profiling", "planning:"))]
    assert progress and any("stages done" in s for _, s in progress)
    end_of_progress = progress[-1][0]
    during = [t for t in times if t <= end_of_progress]
    gaps = [b - a for a, b in zip(during, during[1:], strict=False)]
    assert max(gaps, default=0) < 12, list(zip(during, gaps, strict=False))
    assert not any("\x1b[" in s for _, s in stamps)
    noise = [s for _, s in stamps if "WARNING" in s or "Token authentication" in s]
    assert not noise, noise  # quiet by default: library warnings only with --verbose


def _counts_agree(stats: dict, stderr: str, report: str) -> None:
    """One set of counters: the JSON, the summary line, the last progress line and the
    report say the same numbers, and they add up (estimated stages said when there are)."""
    keys = ("measured", "reused", "pruned", "failed", "estimated")
    assert stats["distinct_stages"] == sum(stats[k] for k in keys) == stats["done"]
    assert stats["pending"] == 0 and stats["candidates"] >= stats["distinct_stages"]
    n_est = stats["estimated"]
    summary = re.search(
        r"(\d+) candidates, (\d+) distinct stages: (\d+) measured, (\d+) reused, "
        r"(\d+) pruned, (\d+) failed(?:, (\d+) estimated)?",
        " ".join(stderr.split()),
    )
    assert summary, stderr[-2000:]
    want = [stats[k] for k in ("candidates", "distinct_stages", *keys)]
    assert [int(g or 0) for g in summary.groups()] == want
    last = [ln for ln in stderr.splitlines() if "stages done" in ln][-1]
    line = re.search(
        r"(\d+)/(\d+) stages done \(measured (\d+), reused (\d+), pruned (\d+)"
        r"(?:, estimated (\d+))?, failed (\d+); (\d+) candidates\)",
        last,
    )
    assert line, last
    order = ("done", "distinct_stages", "measured", "reused", "pruned", "estimated", "failed")
    assert [int(g or 0) for g in line.groups()] == [*(stats[k] for k in order), stats["candidates"]]
    facts = re.search(r'<span id="job-counts">([^<]*)</span>', report)
    assert facts, "no counts in the report"
    text = " ".join(facts.group(1).split())
    expected = (
        f"{stats['done']}/{stats['distinct_stages']} stages · {stats['measured']} measured · "
        f"{stats['reused']} reused · {stats['pruned']} pruned · "
        + (f"{n_est} estimated · " if n_est else "")
        + f"{stats['failed']} failed · {stats['candidates']} candidates"
    )
    assert text == expected


def test_micro_batches_searched_in_one_embedded_job(tmp_path: Path) -> None:
    """`--micro-batches 2,4` at global batch 8 (the model traced at 4): one job, its plan
    the fastest count's, the counts' table printed and the report showing them."""
    args = ["--hosts", "1", "--devices-per-host", "1", "--micro-batches", "2,4"]
    run = _plan(tmp_path, *args, "--global-batch", "8", "--json", "--report", "report.html")
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    plan = out["plan"]
    options = {o["num_microbatches"]: o for o in plan["microbatch_options"]}
    assert sorted(options) == [2, 4] and options[plan["num_microbatches"]]["chosen"]
    assert plan["micro_batch_size"] == 8 // plan["num_microbatches"]
    assert "micro-batches searched" in run.stderr  # --json: the tables go to stderr
    with sqlite3.connect(tmp_path / "plan.db") as db:  # one job planned every count
        assert db.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
    assert 'id="microbatch-options"' in (tmp_path / "report.html").read_text()
