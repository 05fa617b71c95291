#!/usr/bin/env bash
# Build knnmon's container image from this checkout (deploy/Containerfile) and tag it
# knnmon:<version>; prints the image id last.
#
#   deploy/build-image.sh            # FROM python:3.11-slim, pulled from a registry
#   deploy/build-image.sh --base     # FROM a Debian bookworm base made here with mmdebstrap and
#                                    # imported (localhost/knnmon-base:bookworm): no registry needed
#   deploy/build-image.sh --worker   # knnmon-worker:<version>: serves and runs workers, without
#                                    # Java and pyspark (no ingest, no demo)
#
# It builds with podman if present, else docker. With podman it uses runc and a containers.conf
# without default ulimits (CONTAINERS_CONF, if unset, gets deploy/containers.conf), and the host
# network. The CA bundle of $PIP_CERT (or --ca-bundle FILE) is mounted for pip when building
# with podman (docker builds have no mounts: pip uses the image's bundle).
# To run the image elsewhere, push it to your own registry:
#   podman tag knnmon:0.1.0 registry.example.com/you/knnmon:0.1.0 && podman push registry.example.com/you/knnmon:0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build-image: $*" >&2; exit 1; }

base="" ca="${PIP_CERT:-}" name=knnmon
while [ $# -gt 0 ]; do
    case "$1" in
        --base) base=debian ;;
        --worker) name=knnmon-worker ;;
        --ca-bundle) ca="${2:?--ca-bundle needs a file}"; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
    shift
done

# shellcheck source=deploy/engine.sh
. deploy/engine.sh
version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)"
[ -n "$version" ] || die "no version in pyproject.toml"

args=(--network=host --tag "$name:$version" --file deploy/Containerfile)
[ "$name" = knnmon ] || args+=(--build-arg WITH_SPARK=0)
if [ "$base" = debian ]; then
    [ "$ENGINE" = podman ] || die "--base imports the Debian base with podman"
    command -v mmdebstrap >/dev/null 2>&1 || die "--base needs mmdebstrap (apt-get install mmdebstrap)"
    tar="$(mktemp --suffix=.tar)"
    trap 'rm -f "$tar"' EXIT
    echo "build-image: making a Debian bookworm base with mmdebstrap" >&2
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$tar" >&2
    podman import --quiet "$tar" localhost/knnmon-base:bookworm >/dev/null
    args+=(--build-arg BASE=localhost/knnmon-base:bookworm)
fi
if [ -n "$ca" ] && [ "$ENGINE" = podman ]; then
    [ -r "$ca" ] || die "cannot read the CA bundle $ca"
    args+=(--volume "$ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi
echo "build-image: $ENGINE build $name:$version" >&2
"$ENGINE" build "${args[@]}" . >&2
"$ENGINE" image inspect --format '{{.Id}}' "$name:$version"
