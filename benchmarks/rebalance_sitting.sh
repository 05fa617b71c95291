#!/usr/bin/env bash
# Issue 36's measurements in one sitting, each setting twice in ABBA order, at W = 4 and 12:
# the two-state drift (benchmarks/rebalance_drift.py: off, smoothed, predictive, predictive,
# smoothed, off), the places in time order and shuffled (knnmon bench: off, smoothed, predictive,
# predictive, smoothed, off). Writes JSON under $OUT; needs ../shared/data and an ingest of all
# places at $FULL (knnmon ingest ... --out $FULL). PREDICTIVE=0 leaves out the predictive runs.
set -euo pipefail
OUT=${OUT:-/tmp/knnmon-bench/sitting36}
DATA=${DATA:-../shared/data}
FULL=${FULL:-/tmp/full}
PY=${PY:-.venv/bin/python}
KNNMON=${KNNMON:-.venv/bin/knnmon}
PREDICTIVE=${PREDICTIVE:-1}
DRIFT_ORDER=off,smoothed,predictive,predictive,smoothed,off
[ "$PREDICTIVE" = 0 ] && DRIFT_ORDER=off,smoothed,smoothed,off
mkdir -p "$OUT"
date -u +"start %FT%TZ"
for W in 4 12; do
  $PY benchmarks/rebalance_drift.py --first "$DATA/places/places-us-ia.geojson.gz" \
      --second "$DATA/places/places-us-ks.geojson.gz" --queries 20000 --workers $W --work /tmp/drift \
      --order $DRIFT_ORDER --out "$OUT/drift_w$W.json"
done
bench() {  # name, extra args...
  local name=$1; shift
  $KNNMON bench --objects "$FULL" --queries 100000 --algorithms proposed --initial 1000000 --batch 1000 \
      --check-sample 1000 --quiet "$@" --report "$OUT/$name.json"
}
for stream in time_order shuffled; do
  extra=(); [ $stream = shuffled ] && extra=(--shuffle 1 --batches 200)
  for W in 4 12; do
    bench ${stream}_w${W}_1 --workers $W "${extra[@]}" --rebalance off,on --rebalance-trigger smoothed
    if [ "$PREDICTIVE" != 0 ]; then
      bench ${stream}_w${W}_2 --workers $W "${extra[@]}" --rebalance on --rebalance-trigger predictive
      bench ${stream}_w${W}_3 --workers $W "${extra[@]}" --rebalance on --rebalance-trigger predictive
    fi
    bench ${stream}_w${W}_4 --workers $W "${extra[@]}" --rebalance on,off --rebalance-trigger smoothed
  done
done
date -u +"end %FT%TZ"
