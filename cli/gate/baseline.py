"""Baseline files: a plan JSON as `stageprof plan --json` prints it (`{"job_id", "plan",
"stats"}`), as `stageprof gate --json` or `--write-baseline` writes it, or a bare `Plan`."""

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas import Plan

BASELINE_FORMAT = "stageprof-gate-baseline/1"


class BaselineError(Exception):
    """The baseline file cannot be read as a plan; the message says why, on one line."""


def read_baseline(path: Path) -> Plan:
    """The plan in `path`: the whole file as JSON, else its last JSON line (a `--json` run's
    output redirected to the file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BaselineError(f"cannot read baseline {path}: {err.strerror or err}") from err
    obj = _json_object(text)
    if obj is None:
        raise BaselineError(f"baseline {path} holds no JSON object")
    if "plan" in obj:
        if obj["plan"] is None:
            why = f": {obj['error']}" if obj.get("error") else ""
            raise BaselineError(f"baseline {path} is a run without a plan{why}")
        obj = obj["plan"]
    try:
        return Plan.model_validate(obj)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BaselineError(f"baseline {path} is not a plan: {where}: {first['msg']}") from err


def _json_object(text: str) -> dict[str, Any] | None:
    candidates = [text] + [line for line in reversed(text.splitlines()) if line.strip()]
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def write_baseline(path: Path, plan: Plan, *, job_id: str, source: dict[str, Any]) -> None:
    """Write `plan` as a baseline: the plan, where it came from (model, cluster, options as
    given on the command line) and when, sorted and indented so a refresh diffs well."""
    doc = {
        "format": BASELINE_FORMAT,
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "job_id": job_id,
        "source": source,
        "plan": plan.model_dump(mode="json", exclude={"schedule"}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
