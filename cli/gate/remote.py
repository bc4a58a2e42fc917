"""Today's job on a stageprof server (`--server URL`): submit, wait, read the plan and the
profile table rows of the baseline's stages. Any transport or API error is a GateError."""

import time
from collections.abc import Callable, Sequence
from typing import Any

from cli.commands.plan_output import stats_of
from cli.gate.recost import remeasure
from cli.gate.source import GateError, TodayRun
from client.sdk import ServerUnreachable, StageprofClient, StageprofError
from schemas import Job, PlannedStage, PlanRequest, StageProfileResult

POLL_S = 1.0
MAX_PAGE = 1000


class ApiProfiles:
    """The job's profile table through the API (see recost.ProfileSource)."""

    def __init__(self, api: StageprofClient) -> None:
        self.api = api

    def candidates(self, job_id: str, stage: PlannedStage) -> list[dict[str, Any]]:
        page = self.api.list_profiles(
            sort="start",
            limit=MAX_PAGE,
            job_id=job_id,
            start_min=stage.start,
            end_max=stage.end,
            submesh_id=stage.submesh_id,
            config_id=stage.config_id,
        )
        return page.items

    def result(self, fingerprint: str) -> StageProfileResult | None:
        return self.api.get_profile(fingerprint)


def run_remote(
    server: str,
    token: str | None,
    request: PlanRequest,
    baseline_stages: Sequence[PlannedStage],
    *,
    wait_timeout_s: float,
    say: Callable[[str], None],
    idempotency_key: str | None = None,
    new: bool = False,
) -> TodayRun:
    """Run today's job on `server`; `say` shows progress lines. With `idempotency_key` (a CI
    run's id), a retried step follows the job its first attempt submitted."""
    started = time.monotonic()
    try:
        with StageprofClient(server, token=token) as api:
            ref = api.submit_plan(request, idempotency_key=idempotency_key, new=new)
            job_id = ref.job_id
            if ref.deduplicated:
                say(f"following job {job_id} ({ref.status.value}) at {server}: the same request")
            else:
                say(f"job {job_id} queued at {server}")
            job = _wait(api, job_id, wait_timeout_s, say)
            plan = api.get_plan(job_id) if job.has_plan else None
            remeasured = remeasure(
                ApiProfiles(api),
                job_id,
                baseline_stages,
                device_memory_bytes=request.cluster.device_memory_bytes,
            )
    except ServerUnreachable as err:
        raise GateError(_one_line(err)) from err
    except StageprofError as err:
        raise GateError(f"the server at {server}: {_one_line(err)}") from err
    error = None if plan is not None else f"job {job_id} {job.status.value}: {job.error}"
    return TodayRun(
        job_id=job_id,
        plan=plan,
        error=error,
        stats=stats_of(job.progress, time.monotonic() - started),
        remeasured=remeasured,
    )


def _wait(api: StageprofClient, job_id: str, timeout_s: float, say: Callable[[str], None]) -> Job:
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        job = api.get_job(job_id)
        p = job.progress
        line = f"job {job_id} {job.status.value}: {p.done}/{p.distinct_stages} stages done"
        if line != last:
            say(line)
            last = line
        if job.status.finished:
            return job
        if time.monotonic() >= deadline:
            raise GateError(
                f"job {job_id} is still {job.status.value} after {timeout_s:g} s "
                f"({p.done}/{p.distinct_stages} stages done); raise --wait-timeout"
            )
        time.sleep(POLL_S)


def _one_line(err: Exception) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]
