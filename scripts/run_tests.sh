#!/usr/bin/env bash
# The test suite on a Postgres database of its own (made here, dropped after), so two runs
# at once (a developer's and CI's) never share tables; and its own quiet-timing lock dir.
# PG_TEST_URL, when set, names an existing database to use instead.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
HOST="${PGHOST:-127.0.0.1}"
PORT="${PGPORT:-5432}"
owned=""
url="${PG_TEST_URL:-}"
if [ -z "$url" ]; then
  owned="stageprof_test_$(date +%s)_$$"
  STAGEPROF_TEST_DB="$owned" bash scripts/ensure_postgres.sh || exit 1
  url="postgresql+psycopg://postgres@$HOST:$PORT/$owned"
else
  bash scripts/ensure_postgres.sh || exit 1
fi
locks=$(mktemp -d -t stageprof-locks-XXXXXX)
cleanup() {
  rm -rf "$locks"
  if [ -n "$owned" ]; then
    for db in "$owned" "${owned}_e2e"; do
      psql -h "$HOST" -p "$PORT" -U postgres -d postgres -qc \
        "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    done
  fi
}
trap cleanup EXIT
STAGEPROF_DATABASE_URL="$url" "$BIN/stageprof" db upgrade || exit 1
STAGEPROF_LOCK_DIR="$locks" STAGEPROF_TEST_POSTGRES_URL="$url" "$BIN/pytest" -q -ra --durations=25 "$@"
