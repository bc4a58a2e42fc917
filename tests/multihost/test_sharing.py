"""Two runner processes (`stageprof worker`) on one two-node Ray cluster, four jobs at once of
two models, one with 2-host stages (docs/sharing-a-cluster.md): every job ends done, each
distinct stage is measured once, every wait for devices another job holds is said in time
and bounded, a rank killed while joining fails its group within seconds, and no placement
group is left at the end."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster
from ray.util.placement_group import remove_placement_group
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, JobStatus
from store import get_job, job_results, progress_of, session_scope
from tests.multihost.cluster import (
    OPTIONS,
    alive,
    held_rank,
    hold_the_cluster,
    rank0_of,
    wait_all_removed,
)
from tests.support.databases import postgres_url
from tests.support.jobs import queue_job
from tests.support.models import tiny_gpt
from workers.cluster.group_start import POLL_S, WAIT_NOTICE_S
from workers.cluster.host_group import HOLD_JOIN_ENV
from workers.jobs.runner import DEVICE_WAIT_S

pytestmark = [
    pytest.mark.ray,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.usefixtures("two_nodes"),
]

RUNNERS = 2
TIMEOUT_S = 480
NOTICE = "waiting for devices held by another job"
GOT = re.compile(r"devices for a group of (.+) after ([0-9.]+) s")


def _start_runner(cluster: Cluster, log: Path, hold: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "RAY_ADDRESS": cluster.address,
        "STAGEPROF_DATABASE_URL": postgres_url(),
        HOLD_JOIN_ENV: str(hold),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", "worker", "--idle-sleep", "0.5"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for(what: str, ok: Any, timeout_s: float, runners: list[Any]) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert all(r.poll() is None for r in runners), "a runner exited"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_two_runners_share_the_cluster_by_rule(
    two_nodes: Cluster,
    pg_sessions: sessionmaker[Session],  # noqa: F811
    tmp_path: Path,
) -> None:
    spread = tiny_gpt(num_layers=1)  # on 2 hosts x 1 device: 2-host stages
    local = tiny_gpt(num_layers=1, hidden_size=16)  # on 1 host x 1 device
    on_two, on_one = (ClusterSpec(num_hosts=h, devices_per_host=1) for h in (2, 1))
    job_ids = [
        queue_job(pg_sessions, spread, OPTIONS, on_two),
        queue_job(pg_sessions, local, OPTIONS, on_one),
        queue_job(pg_sessions, spread, OPTIONS, on_two),
        queue_job(pg_sessions, local, OPTIONS, on_one),
    ]
    hold = tmp_path / "hold"
    hold.mkdir()
    logs = [tmp_path / f"runner-{i}.log" for i in range(RUNNERS)]
    held = hold_the_cluster()  # another job holds every device as the runners start
    runners = [_start_runner(two_nodes, log, hold) for log in logs]
    try:
        # Both runners wait for their first group, and say so; then the holder lets go.
        _wait_for(
            "both runners to say they wait",
            lambda: all(NOTICE in log.read_text() for log in logs),
            120,
            runners,
        )
        remove_placement_group(held)
        # The first 2-host group to join has its rank 1 held before `initialize`: killed
        # there, its rank 0 stops waiting within seconds.
        port, pid = held_rank(hold)
        peer = rank0_of(hold, port)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        while alive(peer):
            assert time.monotonic() - killed < 10, "rank 0 still waits in its group's join"
            time.sleep(0.1)

        def ended() -> bool:
            with session_scope(pg_sessions) as s:
                rows = [get_job(s, job_id=j) for j in job_ids]
                return all(r is not None and r.finished_at is not None for r in rows)

        _wait_for("the four jobs to end", ended, TIMEOUT_S, runners)
        assert wait_all_removed(), "placement groups left after the jobs"
    finally:
        for runner in runners:
            runner.send_signal(signal.SIGTERM)
        for runner in runners:
            runner.wait(timeout=60)
        remove_placement_group(held)
    texts = [log.read_text() for log in logs]
    with session_scope(pg_sessions) as s:
        jobs = [get_job(s, job_id=j) for j in job_ids]
        results = [dict(job_results(s, job_id=j)) for j in job_ids]
    for job in jobs:
        assert job is not None and job.status == JobStatus.done.value, (job.error, texts)
    stages = {r.fingerprint for rs in results for r in rs.values()}
    assert all(r.ok for rs in results for r in rs.values())
    assert sum(progress_of(j).measured for j in jobs if j) == len(stages)  # each once
    assert any(r.submesh.hosts == 2 for rs in results for r in rs.values())
    for text in texts:
        _check_waits(text)


def _check_waits(log: str) -> None:
    """Every wait for devices that outlasted the notice was said before it ended, and none
    outlasted the bound."""
    said = False
    waits = 0
    for line in log.splitlines():
        if "workers.cluster.group_start" not in line:
            continue
        said = said or NOTICE in line
        got = GOT.search(line)
        if got is None:
            continue
        waited = float(got.group(2))
        assert waited <= DEVICE_WAIT_S, line
        assert said or waited < WAIT_NOTICE_S + 2 * POLL_S, f"a silent wait: {line}"
        waits += 1 if said else 0
        said = False
    assert waits >= 1  # the first group waited for the holder, and said so
