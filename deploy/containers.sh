#!/usr/bin/env bash
# knnmon as a cluster of containers on one host, each in a container of its own (the image of
# deploy/build-image.sh): a Redis, a Ray head that runs `knnmon serve`, and two Ray worker nodes.
# All use the host network with ports of their own; Ray's token authentication is on.
#
#   deploy/containers.sh start      # prints the Redis URL clients use
#   deploy/containers.sh status
#   deploy/containers.sh restart worker1    # stop a worker container and start it again: its node
#                                           # leaves (the workers on it die) and joins again
#   deploy/containers.sh stop       # removes exactly the containers it started, by id
#
# The head node offers no CPU to Ray, so the service's workers (Ray actors) land on the worker
# containers; `knnmon status --redis URL` shows their nodes. A lost worker is revived by the
# service on a node that lives.
#
# Environment: KNNMON_IMAGE (default knnmon:<version in pyproject.toml>); KNNMON_CONTAINERS_DIR
# (default ./knnmon-containers: the containers' ids and the Ray token); KNNMON_REDIS_PORT (default
# 6479); KNNMON_RAY_PORT (default 6480: the head's GCS; each node takes the 10 ports above
# 6480+10*i and the 100 above 6480+100*i); KNNMON_METRICS_PORT (default 9465); KNNMON_SERVE_WORKERS
# (default 4); KNNMON_NODE_CPUS (default 1) CPUs per worker node. podman if present, else docker.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

DIR="${KNNMON_CONTAINERS_DIR:-knnmon-containers}"
DIR="$(mkdir -p "$DIR" && cd "$DIR" && pwd)"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -1)"
IMAGE="${KNNMON_IMAGE:-knnmon:$VERSION}"
REDIS_PORT="${KNNMON_REDIS_PORT:-6479}"
PORT="${KNNMON_RAY_PORT:-6480}"
METRICS_PORT="${KNNMON_METRICS_PORT:-9465}"
WORKERS="${KNNMON_SERVE_WORKERS:-4}"
CPUS="${KNNMON_NODE_CPUS:-1}"
TOKEN=/run/knnmon/auth_token  # where each container sees the token
NAME="knnmon-$PORT"           # containers are named $NAME-redis, $NAME-head, $NAME-worker1, ...

STARTING=""
die() {  # a failed start removes what it started (the logs of a container that exited are shown first)
    echo "containers: $*" >&2
    if [ -n "$STARTING" ]; then
        STARTING=""
        local role
        for role in redis head worker1 worker2; do
            if [ -s "$DIR/$role.id" ] && ! running "$role"; then
                echo "--- $role exited; its last lines:" >&2
                "$ENGINE" logs --tail 20 "$(id_of "$role")" >&2 2>&1 || true
            fi
        done
        stop >/dev/null
    fi
    exit 1
}

# shellcheck source=deploy/engine.sh
. "$ROOT/deploy/engine.sh"

# shellcheck source=deploy/ray-ports.sh
. "$ROOT/deploy/ray-ports.sh"

run() {  # run ROLE ARGS...: a detached container named $NAME-ROLE; its id recorded in $DIR/ROLE.id
    local role=$1; shift
    "$ENGINE" run --detach --network=host --shm-size=512m --name "$NAME-$role" \
        --volume "$DIR/auth_token:$TOKEN:ro" --env RAY_AUTH_MODE=token --env RAY_AUTH_TOKEN_PATH="$TOKEN" \
        "$@" >"$DIR/$role.id"
}

id_of() { [ -s "$DIR/$1.id" ] && cat "$DIR/$1.id"; }

running() {  # running ROLE: its container runs
    local id
    id=$(id_of "$1") || return 1
    [ "$("$ENGINE" inspect --format '{{.State.Running}}' "$id" 2>/dev/null)" = true ]
}

wait_for() {  # wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds
    local what=$1 seconds=$2 i; shift 2
    for i in $(seq 1 "$seconds"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
    die "$what did not come up in $seconds s"
}

nodes_alive() {  # nodes_alive N: the cluster has N alive nodes (asked from the head container)
    running head || die "the head container exited"
    "$ENGINE" exec "$(id_of head)" python -c "
import sys, ray
ray.init(address='127.0.0.1:$PORT', log_to_driver=False)
sys.exit(0 if sum(n['Alive'] for n in ray.nodes()) >= $1 else 1)"
}

worker_node() {  # worker_node NAME INDEX
    run "$1" --entrypoint ray "$IMAGE" start --block --address "127.0.0.1:$PORT" --num-cpus "$CPUS" \
        $(ray_ports "$PORT" "$2")
}

start() {
    local role
    for role in redis head worker1 worker2; do
        ! running "$role" || die "already running ($NAME-$role); run '$0 stop' first"
    done
    STARTING=1
    "$ENGINE" image exists "$IMAGE" 2>/dev/null || "$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1 \
        || die "no image $IMAGE: build it with deploy/build-image.sh"
    # One token for every node and driver; readable by the image's user (uid 10001) alone.
    [ -s "$DIR/auth_token" ] || python3 -c 'import secrets, sys; open(sys.argv[1], "w").write(secrets.token_hex(32))' \
        "$DIR/auth_token"
    chmod 600 "$DIR/auth_token" && chown 10001 "$DIR/auth_token" 2>/dev/null || true

    # Redis: the server knnmon embeds, with an append-only file inside its container.
    run redis --entrypoint python "$IMAGE" -c "import os; from knnmon.redis_server import redis_server_binary as b
os.execv(b(), [b(), '--port', '$REDIS_PORT', '--bind', '127.0.0.1', '--save', '', '--appendonly', 'yes',
               '--dir', '/home/knnmon'])"
    wait_for "Redis" 60 "$ENGINE" exec "$(id_of redis)" python -c \
        "import redis; redis.Redis(port=$REDIS_PORT).ping()"

    # The head: Ray's GCS with no CPU for actors; once both worker nodes joined, `knnmon serve`.
    run head --entrypoint sh "$IMAGE" -c "ray start --head --port $PORT --num-cpus 0 --include-dashboard=false \
        $(ray_ports "$PORT" 0) && python -c \"
import time, ray
ray.init(address='127.0.0.1:$PORT', log_to_driver=False)
while sum(n['Alive'] for n in ray.nodes()) < 3: time.sleep(1)
\" && exec knnmon serve --ray-address 127.0.0.1:$PORT --redis redis://127.0.0.1:$REDIS_PORT/0 --workers $WORKERS \
        --metrics 127.0.0.1:$METRICS_PORT --log-format json"
    wait_for "the Ray head" 120 nodes_alive 1
    worker_node worker1 1
    wait_for "worker1" 120 nodes_alive 2
    worker_node worker2 2
    wait_for "worker2" 120 nodes_alive 3
    wait_for "knnmon serve's readiness" 300 "$ENGINE" exec "$(id_of head)" python -c \
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/readyz', timeout=5)"
    STARTING=""
    cat <<MSG
knnmon containers up: Redis, a Ray head running knnmon serve ($WORKERS workers), 2 Ray worker nodes
clients use: redis://127.0.0.1:$REDIS_PORT/0   (knnmon status --redis redis://127.0.0.1:$REDIS_PORT/0)
metrics: http://127.0.0.1:$METRICS_PORT/metrics
stop them with: $0 stop
MSG
}

stop_role() {  # stop_role ROLE: stop and remove the container by the id recorded at its start
    local id
    id=$(id_of "$1") || return 0
    "$ENGINE" rm --force --time 20 "$id" >/dev/null 2>&1 || "$ENGINE" rm --force "$id" >/dev/null 2>&1 || true
    rm -f "$DIR/$1.id"
}

stop() {
    local role
    for role in head worker2 worker1 redis; do stop_role "$role"; done
    echo "knnmon containers stopped"
}

restart() {  # restart worker1|worker2: the container stops (its node and the actors on it die) and starts again
    local role=${1:-}
    case "$role" in worker1|worker2) ;; *) die "restart needs worker1 or worker2" ;; esac
    running "$role" || die "$role is not running"
    "$ENGINE" stop --time 10 "$(id_of "$role")" >/dev/null
    "$ENGINE" start "$(id_of "$role")" >/dev/null
    wait_for "$role (again)" 120 nodes_alive 3
    echo "$role restarted"
}

status() {
    local role
    for role in redis head worker1 worker2; do
        if running "$role"; then echo "$role: running ($(id_of "$role" | cut -c1-12))"; else echo "$role: stopped"; fi
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    restart) restart "${2:-}" ;;
    *) die "usage: $0 start|stop|status|restart worker1|worker2" ;;
esac
