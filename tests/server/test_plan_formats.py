"""GET /v1/jobs/{id}/plan?format=: the same text as `stageprof export`, 409 where a form is
missing, the enum in the OpenAPI."""

import contextlib
import io

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from cli.main import main
from schemas import JobStatus, Plan
from schemas.trainer_export import EXPORT_FORMATS, export_plan
from store import finish_job, session_scope
from tests.planner.trainer_helpers import gpt_plan
from tests.server.factories import seed_job


def _job_with(db: sessionmaker[Session], plan: Plan) -> str:
    seeded = seed_job(db, finished=False)
    with session_scope(db) as s:
        assert finish_job(
            s, job_id=seeded.job_id, owner="test-runner", status=JobStatus.done, plan=plan
        )
    return seeded.job_id


def _cli_export(job_id: str, fmt: str, url: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["export", job_id, "--format", fmt, "--server", url])
    return code, out.getvalue()


@pytest.mark.parametrize("target", ["maxtext", "jaxpp"])
def test_api_formats_equal_the_cli(
    api: httpx.Client, db: sessionmaker[Session], target: str
) -> None:
    plan = gpt_plan(6, 1, 4, schedule="1f1b", target=target)
    job_id = _job_with(db, plan)
    stored = Plan.model_validate(api.get(f"/v1/jobs/{job_id}/plan").json())
    for fmt in EXPORT_FORMATS:
        if fmt == "maxtext" and target != "maxtext":
            continue
        r = api.get(f"/v1/jobs/{job_id}/plan", params={"format": fmt})
        assert r.status_code == 200, r.text
        assert r.text == export_plan(stored, fmt)
        code, text = _cli_export(job_id, fmt, str(api.base_url))
        assert code == 0 and text == r.text


def test_maxtext_export_of_an_unrestricted_plan_is_409(
    api: httpx.Client, db: sessionmaker[Session]
) -> None:
    job_id = _job_with(db, gpt_plan(6, 1, 4, schedule="1f1b"))
    r = api.get(f"/v1/jobs/{job_id}/plan", params={"format": "maxtext"})
    assert r.status_code == 409
    assert "--for maxtext" in r.text
    assert api.get(f"/v1/jobs/{job_id}/plan", params={"format": "jaxpp"}).status_code == 200
    assert api.get(f"/v1/jobs/{job_id}/plan", params={"format": "yaml"}).status_code == 422
    code, text = _cli_export(job_id, "maxtext", str(api.base_url))
    assert code == 1 and text == ""


def test_openapi_lists_the_formats(api: httpx.Client) -> None:
    spec = api.get("/openapi.json").json()
    params = spec["paths"]["/v1/jobs/{job_id}/plan"]["get"]["parameters"]
    fmt = next(p for p in params if p["name"] == "format")
    schema = fmt["schema"]
    enums = [s.get("enum") for s in schema.get("anyOf", [schema]) if s.get("enum")]
    assert enums and sorted(enums[0]) == sorted(EXPORT_FORMATS)


def test_job_page_offers_the_downloads(api: httpx.Client, db: sessionmaker[Session]) -> None:
    plan = gpt_plan(16, 1, 4, schedule="1f1b", target="maxtext")
    job_id = _job_with(db, plan)
    page = api.get(f"/jobs/{job_id}").text
    for fmt in ("json", "alpa", "jaxpp", "maxtext"):
        link = f"/v1/jobs/{job_id}/plan?format={fmt}"
        assert link in page
        assert api.get(link).status_code == 200
    assert "MaxText&#39;s best:" in page or "MaxText's best:" in page
    other = _job_with(db, gpt_plan(6, 1, 4, schedule="1f1b"))
    page = api.get(f"/jobs/{other}").text
    assert f"/v1/jobs/{other}/plan?format=maxtext" not in page
    assert "stageprof plan --for maxtext" in page
