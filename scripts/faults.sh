#!/usr/bin/env bash
# Fault scenarios against a local stack (Postgres, `stageprof serve --workers 2`, `stageprof
# worker` processes), each checked, then one table: scenario, expected, observed, seconds.
#   - a database outage 3x the lease, cut with a TCP proxy between the worker and Postgres
#   - SIGTERM of a worker mid-job; kill -9 of a worker (its Ray processes); DELETE with no
#     worker running; /metrics under `serve --workers 2`
#   - concurrent jobs of one model on two runners (stage claims)
#   - cancel, lost lease and shutdown during a slow phase
# The scenarios are the tests below, run by scripts/run_tests.sh on a database of their own.
set -uo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp -t stageprof-faults-XXXXXX.jsonl)
trap 'rm -f "$report"' EXIT
STAGEPROF_FAULTS_REPORT="$report" bash scripts/run_tests.sh -p no:cacheprovider -q \
  tests/e2e/test_faults.py \
  tests/runner/test_claims_across_jobs.py \
  tests/runner/test_leases.py "$@"
status=$?
.venv/bin/python - "$report" <<'PY'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
head = ("scenario", "expected", "observed", "seconds")
table = [head] + [(r["scenario"], r["expected"], r["observed"], f'{r["seconds"]:.1f}') for r in rows]
widths = [max(len(str(row[i])) for row in table) for i in range(4)]
for n, row in enumerate(table):
    print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    if n == 0:
        print("-+-".join("-" * w for w in widths))
PY
exit $status
