"""Dashboard pages: rendered from the store, user text escaped, every asset our own."""

import re
from pathlib import Path

import httpx
from sqlalchemy.orm import Session, sessionmaker

from schemas import ClusterSpec, JobStatus, PlanOptions
from store import create_job, finish_job, put_model, session_scope
from tests.server.factories import estimated_keys, exported_chain_spec, make_plan, seed_job

STATIC = Path(__file__).resolve().parents[2] / "server" / "static"
TEMPLATES = STATIC.parent / "templates"
EVIL = "<script>alert('x')</script>"


def test_jobs_list(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=3)
    r = api.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert f'data-job-id="{seeded.job_id}"' in r.text
    assert f'href="/models/{seeded.model_id}"' in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]


def test_empty_jobs_list(api: httpx.Client) -> None:
    assert "No jobs yet" in api.get("/").text


def test_job_page_of_a_finished_job(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=6)
    assert seeded.plan is not None
    html = api.get(f"/jobs/{seeded.job_id}").text
    assert 'id="plan-stages"' in html and 'id="baselines"' in html
    assert html.count("<tr>") >= len(seeded.plan.stages)
    assert "data_parallel" in html and "3 stages do not fit 2 devices" in html
    assert seeded.plan.runner_up is not None
    assert 'id="plan-stability"' in html and 'id="runner-up-stages"' in html
    assert f"Plan is {seeded.plan.stability_summary()}." in html
    assert 'id="gantt"' in html and 'id="heatmap"' in html and 'id="profile-table"' in html
    for script in ("common.js", "heatmap.js", "gantt.js", "profiles.js", "job.js"):
        assert f"/static/{script}" in html
    assert '"schedule": [{' in html or '"schedule":[{' in html


def test_job_page_of_a_queued_job(api: httpx.Client, db: sessionmaker[Session]) -> None:
    with session_scope(db) as s:
        job_id = create_job(
            s, cluster=ClusterSpec(), options=PlanOptions(), zoo_name="gpt", zoo_config={}
        ).id
    html = api.get(f"/jobs/{job_id}").text
    assert "The plan appears here when the job is done" in html and "zoo:gpt" in html


def test_user_text_is_escaped(api: httpx.Client, db: sessionmaker[Session]) -> None:
    spec = exported_chain_spec(num_layers=2)
    layers = [spec.layers[0].model_copy(update={"jaxpr": "</pre>" + EVIL}), spec.layers[1]]
    spec = spec.model_copy(update={"layers": layers})
    with session_scope(db) as s:
        model, _ = put_model(s, spec=spec)
        job = create_job(
            s,
            cluster=ClusterSpec(device_kind=EVIL),
            options=PlanOptions(),
            zoo_name="gpt",
            zoo_config={"note": EVIL},
        )
        finish_job(s, job_id=job.id, owner=None, status=JobStatus.failed, error=EVIL)
        job_id, model_id = job.id, model.id
    for path in ("/", f"/jobs/{job_id}", f"/models/{model_id}"):
        html = api.get(path).text
        assert EVIL not in html, path
    assert "&lt;script&gt;" in api.get(f"/jobs/{job_id}").text
    assert "&lt;/pre&gt;&lt;script&gt;" in api.get(f"/models/{model_id}").text


def test_model_page(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=3)
    html = api.get(f"/models/{seeded.model_id}").text
    assert 'id="layers-table"' in html
    for i, layer in enumerate(exported_chain_spec(3).layers):
        assert layer.fingerprint[:12] in html and f"chain_layer{i}" in html
    assert "dot_general" in html and f'href="/jobs/{seeded.job_id}"' in html


def test_unknown_pages_are_404(api: httpx.Client) -> None:
    for path in ("/jobs/nope", "/models/nope"):
        r = api.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "nope" in r.text


def test_api_index_page(api: httpx.Client) -> None:
    html = api.get("/api").text
    assert "/v1/plans" in html and "/openapi.json" in html
    assert api.get("/docs").status_code == 404  # Swagger UI would load a CDN


def test_assets_are_served_by_the_app(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=2)
    for path in ("/", f"/jobs/{seeded.job_id}", f"/models/{seeded.model_id}", "/api"):
        html = api.get(path).text
        for url in re.findall(r'(?:src|href)="([^"]*)"', html):
            assert url.startswith(("/", "#", "http://127.0.0.1")), (path, url)
            if url.startswith("/static/") or "/static/" in url:
                asset = url[url.index("/static/") :]
                assert api.get(asset).status_code == 200, asset


def test_static_files_reference_nothing_outside() -> None:
    files = list(STATIC.iterdir()) + list(TEMPLATES.iterdir())
    assert len(files) >= 10
    for f in files:
        text = f.read_text()
        assert "https://" not in text, f
        for url in re.findall(r"http://[^\s\"')]+", text):
            assert url.startswith("http://www.w3.org/2000/svg"), (f, url)  # a namespace
        assert ".innerHTML" not in text and "insertAdjacentHTML" not in text, f


def test_job_page_of_an_estimate_search(api: httpx.Client, db: sessionmaker[Session]) -> None:
    seeded = seed_job(db, num_layers=6, estimated=True)
    assert seeded.plan is not None and seeded.plan.runner_up is not None
    html = api.get(f"/jobs/{seeded.job_id}").text
    search = re.search(r'<section class="card" id="plan-search">.*?</section>', html, re.S)
    assert search is not None
    text = " ".join(re.sub(r"<[^>]+>", " ", search.group(0)).split())
    for figure in (
        "12 stages measured: 10 layer profiles, 2 verified",
        "90 stages estimated, never measured",
        "2 verification rounds",
        "4.1% median estimate error, max 9.8%, over 8 stages",
        "15.0% error band trusted",
    ):
        assert figure in text, (figure, text)
    stages = re.search(r'<table[^>]*id="plan-stages".*?</table>', html, re.S)
    assert stages is not None and "<th" in stages.group(0)
    assert ">Estimate</th>" in stages.group(0)
    assert stages.group(0).count('class="badge measured"') == len(seeded.plan.stages)
    for st in seeded.plan.stages:
        assert st.estimated_cost_s is not None
        assert f">{st.estimated_cost_s * 1e3:.3g} ms</td>" in stages.group(0)
    runner = re.search(r'<table[^>]*id="runner-up-stages".*?</table>', html, re.S)
    assert runner is not None and runner.group(0).count('class="badge estimated"') == 1
    assert "1 of 2 stages estimated" in html and "1 of 1 stage estimated" in html
    assert '<option value="estimated">estimated</option>' in html
    n_estimated = len(estimated_keys(6, make_plan(6, 4, "fp")))
    assert f"0 pruned · {n_estimated} estimated · " in html  # the job's counts


def test_a_running_job_shows_its_phase(api: httpx.Client, db: sessionmaker[Session]) -> None:
    running = seed_job(db, num_layers=4, finished=False, salt="r", phase="verification round 2")
    done = seed_job(db, num_layers=3, salt="d")
    html = api.get(f"/jobs/{running.job_id}").text
    assert '<span class="badge phase" id="job-phase">verification round 2</span>' in html
    assert (
        '<span class="badge phase" id="job-phase" hidden></span>'
        in api.get(f"/jobs/{done.job_id}").text
    )
    listing = api.get("/").text
    assert 'data-field="phase">verification round 2</span>' in listing
    assert 'id="plan-search"' not in api.get(f"/jobs/{done.job_id}").text  # no search: no card
