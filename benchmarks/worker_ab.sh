#!/bin/sh
# worker_breakdown.py with two trees, alternating (new, old, old, new), in one sitting: the worker
# alone, per batch. Extra arguments go to worker_breakdown.py (e.g. --batches 60, or --batches 5
# --no-redis for the load alone).
#   OLD=/tmp/old NEW=/tmp/new sh benchmarks/worker_ab.sh --objects /tmp/full --queries /tmp/q100k.parquet --batches 60
py=${PYTHON:-$(pwd)/.venv/bin/python}
ov() { $py -c "import sys; sys.path.insert(0, 'benchmarks'); from ab_run import overlay; print(overlay(sys.argv[1]))" "$1"; }
OLDP=$(ov "$OLD"); NEWP=$(ov "$NEW")
for t in new old old new; do
  if [ $t = new ]; then tree=$NEW; path=$NEWP; else tree=$OLD; path=$OLDP; fi
  echo "== $t"
  (cd "$tree/benchmarks" && PYTHONPATH=$path $py worker_breakdown.py "$@")
done
