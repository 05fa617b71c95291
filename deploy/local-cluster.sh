#!/usr/bin/env bash
# A real multi-node Ray cluster on one machine: a head node and two worker nodes.
#
#   deploy/local-cluster.sh start   # prints the address and the environment drivers need
#   deploy/local-cluster.sh status
#   deploy/local-cluster.sh restart worker1   # stop one worker node (its raylet and the actors on
#                                             # it die) and start it again: a node restart
#   deploy/local-cluster.sh stop    # stops exactly the processes it started (by PID), never `ray stop`
#
# Every node is a `ray start --block` process of its own (its raylet, object store and, on the
# head, the GCS) with its own ports, all away from Redis's 6379. Token authentication stays on:
# the script generates one token and every node and driver uses it through RAY_AUTH_MODE=token
# and RAY_AUTH_TOKEN_PATH (Ray 2.60 refuses drivers whose auth mode differs from the cluster's).
#
# Environment: KNNMON_CLUSTER_DIR (default ./knnmon-cluster) holds PIDs, logs and the token;
# KNNMON_RAY_PORT (default 6380) is the head's GCS port; KNNMON_RAY (default: `ray` beside this
# Python, else on PATH) is the ray executable; KNNMON_NODE_CPUS (default 1) CPUs per node.
set -euo pipefail

DIR="$(mkdir -p "${KNNMON_CLUSTER_DIR:-knnmon-cluster}" && cd "${KNNMON_CLUSTER_DIR:-knnmon-cluster}" && pwd)"
PORT="${KNNMON_RAY_PORT:-6380}"
CPUS="${KNNMON_NODE_CPUS:-1}"
RAY="${KNNMON_RAY:-$(command -v ray || true)}"
ADDRESS="127.0.0.1:${PORT}"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$DIR/auth_token" RAY_USAGE_STATS_ENABLED=0

die() { echo "local-cluster: $*" >&2; exit 1; }

# shellcheck source=deploy/ray-ports.sh
. "$(dirname "$0")/ray-ports.sh"

node() {  # node NAME INDEX EXTRA-ARGS... : one `ray start --block` in the background, PID recorded
    # Every port a node binds is its own (ray_ports), so three nodes share one machine.
    local name=$1 index=$2; shift 2
    nohup "$RAY" start --block --num-cpus "$CPUS" $(ray_ports "$PORT" "$index") "$@" >"$DIR/$name.log" 2>&1 &
    echo $! >"$DIR/$name.pid"
}

wait_nodes() {  # wait until the cluster reports $1 alive nodes; fail early if a node process ($2...) died
    local want=$1 i
    for i in $(seq 1 120); do
        for n in "${@:2}"; do kill -0 "$(cat "$DIR/$n.pid")" 2>/dev/null || return 1; done
        if timeout 30 "$PYTHON" - "$ADDRESS" "$want" <<'PY' 2>/dev/null; then return 0; fi
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]
sys.exit(0 if len(alive) >= int(sys.argv[2]) else 1)
PY
        sleep 1
    done
    return 1
}

start() {
    [ -n "$RAY" ] || die "no ray executable (install knnmon, or set KNNMON_RAY)"
    PYTHON="$(dirname "$RAY")/python"; [ -x "$PYTHON" ] || PYTHON=python3
    for n in head worker1 worker2; do
        if [ -f "$DIR/$n.pid" ] && kill -0 "$(cat "$DIR/$n.pid")" 2>/dev/null; then
            die "already running ($n, PID $(cat "$DIR/$n.pid")); run '$0 stop' first"
        fi
    done
    [ -s "$RAY_AUTH_TOKEN_PATH" ] || "$PYTHON" -c 'import secrets, sys; open(sys.argv[1], "w").write(secrets.token_hex(32))' \
        "$RAY_AUTH_TOKEN_PATH"
    chmod 600 "$RAY_AUTH_TOKEN_PATH"
    node head 0 --head --include-dashboard=false --port "$PORT" --temp-dir "$DIR/tmp"
    wait_nodes 1 head || { stop >/dev/null; die "the head node did not come up; see $DIR/head.log"; }
    # One at a time: nodes on one machine share the head's session directory, and two raylets
    # starting together can pick the same socket file name there.
    node worker1 1 --address "$ADDRESS"
    wait_nodes 2 head worker1 || { stop >/dev/null; die "worker1 did not join; see $DIR/worker1.log"; }
    node worker2 2 --address "$ADDRESS"
    wait_nodes 3 head worker1 worker2 || { stop >/dev/null; die "the worker nodes did not join; see $DIR/worker2.log"; }
    cat <<MSG
local Ray cluster up: 3 nodes (head + 2 workers), ${CPUS} CPU each, GCS at $ADDRESS
use it from a driver with:
  export RAY_ADDRESS=$ADDRESS RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH
  knnmon run ... --set workers.ray_address=$ADDRESS     # or: knnmon serve --ray-address $ADDRESS
stop it with: $0 stop
MSG
}

stop() {
    local n
    for n in worker2 worker1 head; do stop_node "$n"; done
    echo "local Ray cluster stopped"
}

stop_node() {  # stop_node NAME: TERM the node's `ray start --block` (it stops its raylet), KILL after 15 s
    local pid
    [ -f "$DIR/$1.pid" ] || return 0
    pid=$(cat "$DIR/$1.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/$1.pid"
}

restart() {  # restart worker1|worker2: the node goes down and joins again under a new node id
    local name=${1:-} index
    case "$name" in worker1) index=1 ;; worker2) index=2 ;; *) die "restart needs worker1 or worker2" ;; esac
    [ -n "$RAY" ] || die "no ray executable (install knnmon, or set KNNMON_RAY)"
    PYTHON="$(dirname "$RAY")/python"; [ -x "$PYTHON" ] || PYTHON=python3
    stop_node "$name"
    node "$name" "$index" --address "$ADDRESS"
    wait_nodes 3 head "$name" || die "$name did not join again; see $DIR/$name.log"
    echo "$name restarted (PID $(cat "$DIR/$name.pid"))"
}

status() {
    local n
    for n in head worker1 worker2; do
        if [ -f "$DIR/$n.pid" ] && kill -0 "$(cat "$DIR/$n.pid")" 2>/dev/null; then
            echo "$n: running (PID $(cat "$DIR/$n.pid"))"
        else
            echo "$n: stopped"
        fi
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    restart) restart "${2:-}" ;;
    *) echo "usage: $0 start|stop|status|restart worker1|worker2" >&2; exit 2 ;;
esac
