#!/bin/sh
# Issue 33's table, this tree (frozen at $NEW) against the tree before the kernels ($OLD), alternating,
# in one sitting: python benchmarks/ab_run.py per setting, JSON under /tmp/knnmon-bench/$NAME_*.json (NAME:
# default kernels; the holder counts' A/B used NAME=holders with OLD at cac49d4).
#   OLD=/tmp/old NEW=/tmp/new sh benchmarks/kernels_ab.sh /tmp/full /tmp/q100k.parquet
set -e
objects=$1; queries=$2; rounds=${ROUNDS:-2}
py=${PYTHON:-.venv/bin/python}
common="--objects $objects --queries $queries --initial 1000000 --batch 1000 --batches 50"
ab() { name=$1; shift; $py benchmarks/ab_run.py --this "$NEW" --other "$OLD" --rounds "$rounds" \
        --out "/tmp/knnmon-bench/${NAME:-kernels}_$name.json" -- $common "$@"; }
$py -c "from knnmon.coordinator.bench.speed_probe import speed_probe_ms as p; print('speed probe', round(p()), 'ms')"
ab inline_w1_shuffled --workers 1 --executor inline --shuffle 1
ab ray_w2_shuffled --workers 2 --shuffle 1
ab inline_w1_time --workers 1 --executor inline
ab ray_w2_window500s --workers 2 --window 500s --reserve 8 --shuffle 1 --arrival-ms 1
$py -c "from knnmon.coordinator.bench.speed_probe import speed_probe_ms as p; print('speed probe', round(p()), 'ms')"
