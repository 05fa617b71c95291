# Sourced by build-image.sh and containers.sh: ENGINE is podman if present, else docker. With
# podman, CONTAINERS_CONF (if unset) names deploy/containers.conf: runc and no default ulimits.
if command -v podman >/dev/null 2>&1; then
    ENGINE=podman
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/containers.conf}"
elif command -v docker >/dev/null 2>&1; then
    ENGINE=docker
else
    echo "neither podman nor docker is installed" >&2
    exit 1
fi
