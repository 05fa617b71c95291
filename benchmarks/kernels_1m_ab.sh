#!/bin/sh
# Issue 33 at 1 M queries: this tree (frozen at $NEW) against the tree before the kernels ($OLD), in
# one sitting, in process, shuffled; JSON in /tmp/knnmon-bench/$NAME_1m_inline_w1_shuffled.json (NAME:
# default kernels).
#   OLD=/tmp/old NEW=/tmp/new ROUNDS=1 sh benchmarks/kernels_1m_ab.sh /tmp/full /tmp/q1m.parquet
set -e
objects=$1; queries=$2
py=${PYTHON:-.venv/bin/python}
$py -c "from knnmon.coordinator.bench.speed_probe import speed_probe_ms as p; print('speed probe', round(p()), 'ms')"
$py benchmarks/ab_run.py --this "$NEW" --other "$OLD" --rounds "${ROUNDS:-1}" \
    --out "/tmp/knnmon-bench/${NAME:-kernels}_1m_inline_w1_shuffled.json" -- --objects "$objects" --queries "$queries" \
    --initial 1000000 --batch 1000 --batches 30 --workers 1 --executor inline --shuffle 1
$py -c "from knnmon.coordinator.bench.speed_probe import speed_probe_ms as p; print('speed probe', round(p()), 'ms')"
