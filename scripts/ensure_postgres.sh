#!/usr/bin/env bash
# Make sure the local Postgres answers on 127.0.0.1:5432 and the test database exists.
set -euo pipefail
DB="${STAGEPROF_TEST_DB:-stageprof_test}"
HOST="${PGHOST:-127.0.0.1}"
PORT="${PGPORT:-5432}"
PGUSER_="${PGUSER:-postgres}"

ready() { pg_isready -q -h "$HOST" -p "$PORT" 2>/dev/null; }

if ! ready; then
  echo "postgres is down; starting the local cluster"
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  fi
  for _ in $(seq 1 30); do ready && break; sleep 1; done
  ready || { echo "postgres is not reachable on $HOST:$PORT" >&2; exit 1; }
fi

exists=$(psql -h "$HOST" -p "$PORT" -U "$PGUSER_" -d postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname = '$DB'")
if [ "$exists" != "1" ]; then
  psql -h "$HOST" -p "$PORT" -U "$PGUSER_" -d postgres -qc "CREATE DATABASE \"$DB\""
  echo "created database $DB"
fi
