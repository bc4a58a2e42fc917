"""Faults an operator meets, on the local stack (Postgres, `stageprof serve`, `stageprof
worker`): a database outage longer than the lease, SIGTERM, kill -9 then DELETE, metrics.

Each scenario also appends a row to `STAGEPROF_FAULTS_REPORT` when set (`scripts/faults.sh`
prints them as a table).
"""

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec
from store import (
    JobCandidateRow,
    JobRow,
    StageProfileRow,
    create_job,
    get_job,
    make_engine,
    make_sessionmaker,
    session_scope,
    utcnow,
)
from store.counters import read_counters
from tests.e2e.stack import LocalStack, Service
from tests.e2e.test_stack import e2e_database_url, stack_env
from tests.runner.faults_report import record_fault as record
from tests.runner.tcp_proxy import TcpProxy
from tests.support.models import FAST_OPTIONS, TINY_GPT
from tests.support.processes import free_port
from tests.support.waiting import wait_until
from workers.cluster.ray_watchdog import session_pids

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.ray, pytest.mark.timeout(900)]

LEASE_S = 4.0
OUTAGE_S = 3 * LEASE_S
STOP_WITHIN_S = 5.0
CANCEL_MARGIN_S = 3.0
JOB_TIMEOUT_S = 480.0
ZOO_GPT = {"num_layers": 3, **TINY_GPT}
CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=4)
OPTIONS = FAST_OPTIONS.model_copy(update={"num_microbatches": 2, "candidate_timeout_s": 180})
WORKER_ARGS = ("worker", "--workers", "2", "--devices-per-worker", "4", "--idle-sleep", "0.5")


def _job(sessions: sessionmaker[Session], job_id: str) -> JobRow:
    with session_scope(sessions) as s:
        row = get_job(s, job_id=job_id)
        assert row is not None
        return row


def _wait(
    stack: LocalStack, what: str, ready: Callable[[], bool], timeout_s: float, alive: bool = True
) -> float:
    """Poll `ready` until true; seconds it took. Fails when a service exits (if `alive`)."""
    began = time.monotonic()
    wait_until(ready, timeout_s, what, check=stack.assert_running if alive else None)
    return time.monotonic() - began


def _queue_zoo_job(sessions: sessionmaker[Session]) -> str:
    with session_scope(sessions) as s:
        return create_job(
            s, zoo_name="gpt", zoo_config=ZOO_GPT, cluster=CLUSTER, options=OPTIONS
        ).id


def _stored_once(sessions: sessionmaker[Session], job_id: str) -> tuple[int, int, int]:
    """(candidates, candidates with an outcome, profile rows of the stages it measured)."""
    with session_scope(sessions) as s:
        total, done = s.execute(
            select(func.count(), func.count(JobCandidateRow.status)).where(
                JobCandidateRow.job_id == job_id
            )
        ).one()
        profiles = s.scalar(select(func.count()).select_from(StageProfileRow))
    return total, done, int(profiles or 0)


def test_worker_waits_out_a_database_outage_longer_than_its_lease(
    tmp_path: Path,
) -> None:
    url = e2e_database_url()
    pg = make_url(url)
    env = stack_env(url)
    sessions = make_sessionmaker(make_engine(url))
    with (
        TcpProxy(pg.host or "127.0.0.1", pg.port or 5432) as proxy,
        LocalStack(tmp_path, env) as stack,
    ):
        stack.run("migrate", "db", "upgrade")
        job_id = _queue_zoo_job(sessions)
        proxied = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
        worker = stack.start(
            "worker",
            *WORKER_ARGS,
            *("--lease-seconds", str(LEASE_S)),
            env=env | {"STAGEPROF_DATABASE_URL": proxied},
        )
        _wait(stack, "first result", lambda: _job(sessions, job_id).done > 0, JOB_TIMEOUT_S)
        proxy.cut()
        time.sleep(OUTAGE_S)
        stack.assert_running()  # the worker outlived the outage
        assert _job(sessions, job_id).lease_expires_at < utcnow()  # the lease ran out
        proxy.restore()
        took = _wait(
            stack, "job end", lambda: _job(sessions, job_id).finished_at is not None, JOB_TIMEOUT_S
        )
        stack.assert_running()
        row = _job(sessions, job_id)
        assert row.status == "done", row.error
        total, done, profiles = _stored_once(sessions, job_id)
        assert (
            total == done
            and profiles == row.measured == row.distinct_stages - row.pruned - row.estimated
        )
        assert "retrying" in worker.log() or "cannot reach the store" in worker.log()
        with session_scope(sessions) as s:
            retries = read_counters(s).get("db_retries", 0)
        assert retries > 0
    record(
        f"DB outage {OUTAGE_S:g} s (lease {LEASE_S:g} s) mid-job",
        "worker alive, job done, each stage stored once",
        f"worker alive, job {row.status}, {profiles} profiles for {row.measured} measured, "
        f"{retries} DB retries",
        took,
    )


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.add(pid)
    return alive


def _ray_session(worker: Service, stack: LocalStack) -> str:
    _wait(stack, "Ray start", lambda: "local Ray session" in worker.log(), 120)
    line = next(x for x in worker.log().splitlines() if "local Ray session" in x)
    return line.split("local Ray session ", 1)[1].split(",")[0]


def test_sigterm_kill9_and_cancel_without_a_worker(tmp_path: Path) -> None:
    url = e2e_database_url()
    env = stack_env(url)
    sessions = make_sessionmaker(make_engine(url))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    lease = ("--lease-seconds", str(LEASE_S))
    with LocalStack(tmp_path, env) as stack, httpx.Client(base_url=base, timeout=30) as api:
        stack.run("migrate", "db", "upgrade")
        stack.start(
            "api",
            *("serve", "--port", str(port), "--workers", "2", "--no-migrate"),
            *("--log-level", "warning"),
        )
        stack.wait_healthy(base)
        first = stack.start("worker-1", *WORKER_ARGS, *lease)
        r = api.post(
            "/v1/plans",
            json={
                "zoo": {"name": "gpt", "config": ZOO_GPT},
                "cluster": CLUSTER.model_dump(mode="json"),
                "options": OPTIONS.model_dump(mode="json"),
            },
        )
        assert r.status_code in (200, 202), r.text
        job_id = r.json()["job_id"]
        _wait(stack, "measuring", lambda: _job(sessions, job_id).done > 0, JOB_TIMEOUT_S)

        # SIGTERM mid-job: the worker exits within seconds and hands the job back.
        session = _ray_session(first, stack)
        ray_pids = _descendants(first.proc.pid) | set(session_pids(session))
        first.proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        first.proc.wait(timeout=60)
        sigterm_s = time.monotonic() - began
        stack.services.remove(first)
        row = _job(sessions, job_id)
        assert first.proc.returncode == 0, first.log()
        assert row.status == "profiling" and row.lease_expires_at <= utcnow()
        _wait(stack, "Ray stopped", lambda: not _alive(ray_pids), LEASE_S)
        record(
            "SIGTERM while measuring",
            f"exit within {STOP_WITHIN_S:g} s, job handed back",
            f"exit {first.proc.returncode}, job {row.status}, lease released",
            sigterm_s,
        )
        assert sigterm_s < STOP_WITHIN_S, first.log()

        # A second worker takes the job over at once; then it is killed with kill -9.
        second = stack.start("worker-2", *WORKER_ARGS, *lease)
        _wait(stack, "takeover", lambda: _job(sessions, job_id).attempts == 2, 180)
        session = _ray_session(second, stack)
        _wait(stack, "measuring again", lambda: _job(sessions, job_id).done > row.done, 300)
        ray_pids = _descendants(second.proc.pid) | set(session_pids(session))
        assert ray_pids
        os.kill(second.proc.pid, signal.SIGKILL)
        second.proc.wait(timeout=30)
        killed = time.monotonic()
        stack.services.remove(second)
        ray_gone_s = _wait(stack, "Ray gone", lambda: not _alive(ray_pids), LEASE_S + 2)
        record(
            "kill -9 of a worker",
            f"its Ray processes gone within the lease ({LEASE_S:g} s)",
            f"{len(ray_pids)} Ray processes, {len(_alive(ray_pids))} left",
            ray_gone_s,
        )

        # DELETE with no worker running: cancelled once the dead worker's lease expires.
        r = api.delete(f"/v1/jobs/{job_id}")
        assert r.status_code == 200 and r.json()["cancel_requested"], r.text
        asked = time.monotonic()
        cancel_s = _wait(
            stack,
            "cancelled",
            lambda: api.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled",
            LEASE_S + CANCEL_MARGIN_S,
        )
        record(
            "DELETE after kill -9, no worker",
            f"cancelled within lease + {CANCEL_MARGIN_S:g} s",
            "cancelled",
            time.monotonic() - asked,
        )
        assert time.monotonic() - killed < 2 * LEASE_S + CANCEL_MARGIN_S + cancel_s

        # /metrics of the two API processes: the same store-kept counters, all requests.
        for _ in range(20):
            assert api.get("/healthz").status_code == 200
        text = api.get("/metrics").text
        values = _metrics(text)
        assert values["stageprof_job_takeovers_total"] >= 1
        assert values["stageprof_jobs_reaped_total"] >= 1
        healthz = sum(
            v
            for k, v in values.items()
            if k.startswith("stageprof_http_requests_total{") and 'route="/healthz"' in k
        )
        assert healthz >= 20
        record(
            "/metrics under serve --workers 2",
            "takeovers, reaped jobs, all requests counted",
            f"takeovers {values['stageprof_job_takeovers_total']:g}, reaped "
            f"{values['stageprof_jobs_reaped_total']:g}, /healthz {healthz:g}",
            0.0,
        )


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
