#!/usr/bin/env bash
# A Ray cluster of N nodes on this one machine, each node offering DEVICES virtual devices
# (the `stageprof_devices` resource), to try measuring across hosts without a second host:
#
#   bash scripts/ray_cluster.sh start 2 2     # 2 nodes x 2 devices; prints RAY_ADDRESS
#   RAY_ADDRESS=<printed> .venv/bin/stageprof plan --zoo mlp --hosts 2 --devices-per-host 2
#   bash scripts/ray_cluster.sh status        # `ray status` of the cluster
#   bash scripts/ray_cluster.sh stop
#
# Every node is a `ray start` of its own (the first the head, the others joining it with
# --address), with its own temp dir (so its own session dir, sockets and logs) and its own
# worker-port range and dashboard-agent port, as several raylets on one host need. `stop`
# ends only this cluster's processes (those whose command line names its directory, and their
# descendants: Ray's agents and workers rename themselves), never another Ray of the machine,
# so it is not `ray stop` (which stops every Ray process of the user).
#
# Environment:
#   STAGEPROF_RAY_CLUSTER_DIR  state and the nodes' temp dirs (default /tmp/stageprof-ray-cluster;
#                              keep it short: Ray's socket paths must fit in 107 bytes)
#   RAY_CLUSTER_PORT           the head's GCS port (default 6390; 6379 is often Redis's)
#   RAY_CLUSTER_NODE_CPUS      CPUs each node offers (default 2)
#   RAY_CLUSTER_OBJECT_STORE   object store bytes per node (default 512 MiB)
#   RAY_AUTH_MODE              unset: `disabled`, on every node; `token`: every node and
#                              every driver needs `RAY_AUTH_MODE=token` and the token
#                              (RAY_AUTH_TOKEN, or ~/.ray/auth_token). Left to Ray, an unset
#                              mode splits the cluster: a head turns token auth on when
#                              ~/.ray/auth_token exists (a local `ray.init()` writes one), but a
#                              node joining with --address and a driver given an address
#                              (RAY_ADDRESS, as stageprof's) stay off, and the head refuses them.
# The nodes listen on this machine's address without a token by default: for a development
# machine, not a shared network.
set -uo pipefail
cd "$(dirname "$0")/.."
RAY="$PWD/.venv/bin/ray"
DIR="${STAGEPROF_RAY_CLUSTER_DIR:-/tmp/stageprof-ray-cluster}"
DIR="${DIR%/}"
if [[ "$DIR" != /?* ]]; then
  echo "STAGEPROF_RAY_CLUSTER_DIR must be an absolute path, got '$DIR'" >&2
  exit 2
fi
# Each node's temp dir; every process of the cluster names one in its command line.
NODE_PREFIX="$DIR/ray-node-"
PORT="${RAY_CLUSTER_PORT:-6390}"
NODE_CPUS="${RAY_CLUSTER_NODE_CPUS:-2}"
OBJECT_STORE="${RAY_CLUSTER_OBJECT_STORE:-$((512 * 1024 * 1024))}"
# Each node's worker ports: a slice of Ray's default range 10002-19999 of its own.
WORKER_PORTS_PER_NODE=400
export RAY_USAGE_STATS_ENABLED=0
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"

usage() {
  echo "usage: $0 start N [DEVICES] | status | stop" >&2
  exit 2
}

# PIDs of this cluster's processes: those whose command line names a node's temp dir, and
# every descendant of those (agents `ray::DashboardAgent`, workers `ray::IDLE`, actors).
cluster_pids() {
  # (the prefix goes to awk in its environment: in its arguments awk would find itself)
  ps -eo pid=,ppid=,args= | NODE_PREFIX="$NODE_PREFIX" awk '
    { pid = $1; parent[pid] = $2; if (index($0, ENVIRON["NODE_PREFIX"]) > 0) mine[pid] = 1 }
    END {
      do {
        grown = 0
        for (p in parent) if (!(p in mine) && (parent[p] in mine)) { mine[p] = 1; grown = 1 }
      } while (grown)
      for (p in mine) print p
    }'
}

stop() {
  local pids all=""
  pids=$(cluster_pids)
  if [ -n "$pids" ]; then
    all="$pids"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 20); do
      pids=$(cluster_pids)
      [ -z "$pids" ] && break
      all="$all $pids"
      sleep 0.1
    done
    # Ray's agents ignore SIGTERM.
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    for _ in $(seq 30); do
      [ -z "$(cluster_pids)" ] && break
      sleep 0.1
    done
    # Until their parent (init: `ray start` daemonized them) has reaped them, the processes
    # linger as zombies, still listed by `pgrep raylet`: wait for that too, a few seconds.
    for _ in $(seq 100); do
      local left=""
      for pid in $all; do [ -e "/proc/$pid" ] && left=1 && break; done
      [ -z "$left" ] && break
      sleep 0.1
    done
  fi
  rm -rf "$NODE_PREFIX"* "$DIR/address"
  rmdir "$DIR" 2>/dev/null
  if [ -n "$(cluster_pids)" ]; then
    echo "some processes of the cluster in $DIR are still running" >&2
    return 1
  fi
  echo "stopped the Ray cluster in $DIR"
}

start_node() { # INDEX DEVICES [ARGS...]
  local i=$1 devices=$2
  shift 2
  local low=$((10002 + i * WORKER_PORTS_PER_NODE))
  mkdir -p "$NODE_PREFIX$i"
  "$RAY" start "$@" \
    --num-cpus="$NODE_CPUS" \
    --resources="{\"stageprof_devices\": $devices}" \
    --object-store-memory="$OBJECT_STORE" \
    --temp-dir="$NODE_PREFIX$i" \
    --min-worker-port="$low" --max-worker-port="$((low + WORKER_PORTS_PER_NODE - 1))" \
    --dashboard-agent-listen-port="$((PORT + 100 + i))" \
    --disable-usage-stats >"$NODE_PREFIX$i/ray-start.log" 2>&1
}

start() {
  local nodes=${1:-} devices=${2:-2}
  [[ "$nodes" =~ ^[1-9][0-9]*$ && "$devices" =~ ^[1-9][0-9]*$ ]] || usage
  if [ "$nodes" -gt 24 ]; then
    echo "at most 24 nodes (each takes a slice of the worker ports 10002-19999)" >&2
    exit 2
  fi
  if [ -f "$DIR/address" ]; then
    echo "a cluster is already running from $DIR (RAY_ADDRESS=$(cat "$DIR/address")); stop it first" >&2
    exit 1
  fi
  mkdir -p "$DIR"
  if ! start_node 0 "$devices" --head --port="$PORT" --include-dashboard=false; then
    cat "${NODE_PREFIX}0/ray-start.log" >&2
    stop >/dev/null
    echo "the head did not start (is port $PORT free? set RAY_CLUSTER_PORT)" >&2
    exit 1
  fi
  local address
  address=$(grep -o "ray start --address='[^']*'" "${NODE_PREFIX}0/ray-start.log" | head -n 1 | cut -d"'" -f2)
  [ -n "$address" ] || address="127.0.0.1:$PORT"
  echo "$address" >"$DIR/address"
  for i in $(seq 1 $((nodes - 1))); do
    if ! start_node "$i" "$devices" --address="$address"; then
      cat "$NODE_PREFIX$i/ray-start.log" >&2
      stop >/dev/null
      echo "node $i did not join the head at $address" >&2
      exit 1
    fi
  done
  echo "a Ray cluster of $nodes nodes x $devices stageprof_devices ($NODE_CPUS CPUs each)," \
    "auth $RAY_AUTH_MODE, in $DIR"
  echo "export RAY_ADDRESS=$address"
  [ "$RAY_AUTH_MODE" = disabled ] || echo "export RAY_AUTH_MODE=$RAY_AUTH_MODE"
}

case "${1:-}" in
  start)
    shift
    start "$@"
    ;;
  status)
    [ -f "$DIR/address" ] || { echo "no cluster running from $DIR" >&2; exit 1; }
    "$RAY" status --address="$(cat "$DIR/address")"
    ;;
  stop) stop ;;
  *) usage ;;
esac
