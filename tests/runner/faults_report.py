"""Rows of the fault table that `scripts/faults.sh` prints: each fault scenario test appends
one JSON line to `STAGEPROF_FAULTS_REPORT` when it is set (nothing otherwise)."""

import json
import os

REPORT_ENV = "STAGEPROF_FAULTS_REPORT"


def record_fault(scenario: str, expected: str, observed: str, seconds: float) -> None:
    """Append (scenario, expected, observed, seconds) to the report file, if there is one."""
    path = os.environ.get(REPORT_ENV, "")
    if not path:
        return
    row = {"scenario": scenario, "expected": expected, "observed": observed}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row | {"seconds": round(seconds, 1)}) + "\n")
