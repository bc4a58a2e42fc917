"""The standalone HTML report of a job (`stageprof plan --report FILE`).

One file a user can open from disk or attach to a ticket: the job page's facts, plan, 1F1B
Gantt chart and heatmap, rendered from the same templates and drawn by the same scripts as
the dashboard. Every style and script is inline and the data the scripts read is embedded
as page data, including the exact answer of GET /v1/jobs/{id}/cost-matrix, which
`SP.getJSON` serves from there. A Content-Security-Policy forbids any network access.
"""

import base64
import json
import logging
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from urllib.parse import quote

from markupsafe import Markup
from sqlalchemy.orm import Session

from server.routes.jobs import cost_matrices_out
from server.routes.pages import TEMPLATES, job_page_context
from store import get_job

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
STYLESHEET = "app.css"
# In the order the dashboard loads them; report.js replaces job.js (no polling, no profiles).
SCRIPTS = ("common.js", "heatmap.js", "gantt.js", "report.js")
FAVICON = "favicon.svg"


def stageprof_version() -> str:
    """The installed stageprof version, or 'unknown' when running from an uninstalled tree."""
    try:
        return metadata.version("stageprof")
    except metadata.PackageNotFoundError:
        return "unknown"


def cost_matrix_url(job_id: str) -> str:
    """The URL heatmap.js asks for (quoted as JavaScript's encodeURIComponent does)."""
    return "/v1/jobs/" + quote(job_id, safe="!'()*~") + "/cost-matrix"


def _inline_asset(name: str) -> Markup:
    """A static file's text, to be put inside <style> or <script> verbatim."""
    text = (STATIC_DIR / name).read_text(encoding="utf-8")
    closing = "</style" if name.endswith(".css") else "</script"
    if closing in text.lower() or "<!--" in text:
        raise ValueError(f"{name} cannot be inlined: it contains {closing!r} or '<!--'")
    return Markup(text)


def _favicon_data_uri() -> str:
    svg = (STATIC_DIR / FAVICON).read_bytes()
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


def render_job_report(
    session: Session, *, job_id: str, generated_at: datetime | None = None
) -> str:
    """The standalone HTML page of job `job_id` (ValueError if there is no such job).

    A job without a plan (failed, cancelled, still running) renders too, with its error.
    """
    row = get_job(session, job_id=job_id)
    if row is None:
        raise ValueError(f"there is no job {job_id!r}")
    context = job_page_context(session, row)
    # The API's JSON (non-finite costs become null), so JSON.parse reads what the API sends.
    matrices = json.loads(cost_matrices_out(session, row).model_dump_json())
    context["page_data"] = {
        **context["page_data"],
        "embedded": {cost_matrix_url(row.id): matrices},
    }
    html = TEMPLATES.get_template("report.html").render(
        **context,
        standalone=True,
        version=stageprof_version(),
        generated_at=generated_at or datetime.now(UTC),
        favicon=_favicon_data_uri(),
        css=_inline_asset(STYLESHEET),
        scripts=[(name, _inline_asset(name)) for name in SCRIPTS],
    )
    log.info("report of job %s: %d characters", job_id, len(html))
    return html
