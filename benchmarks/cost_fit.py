"""Fit a worker's busy time to its work counts, and check predicted vs measured load, from
``knnmon bench`` reports (the "cost model" figures of /tmp/knnmon-benchmarks.md and
src/knnmon/costs.py):

    knnmon bench --objects /tmp/full_default --queries 100000 --workers 4,12 \\
        --algorithms proposed,keyword,random --batches 60 --report /tmp/diag.json
    python benchmarks/cost_fit.py /tmp/diag.json                 # the least-squares fit
    python benchmarks/cost_fit.py /tmp/knnmon-bench/workers.json        # + pooled Spearman per W

Least squares over every (run, worker): ``busy_ms = a * batches + b * delivered objects +
c * candidates + d * changed results``; then, per worker count, the Spearman correlation of
predicted and measured busy time pooled over the plans of every algorithm.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from knnmon.coordinator.bench.runner import spearman


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+")
    a = p.parse_args()
    rows = [r for f in a.reports for r in json.load(open(f))["rows"] if r["algorithm"] != "single"]
    X, y = [], []
    for r in rows:
        t = r["per_worker_totals"]
        for w in range(r["workers"]):
            X.append([r["batches"], t["objects"][w], t["candidates"][w], t["changed"][w]])
            y.append(r["busy_ms_per_worker"][w])
    X, y = np.array(X, dtype=float), np.array(y)
    c = np.linalg.lstsq(X, y, rcond=None)[0]
    r2 = 1 - ((y - X @ c) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    share = (X * c).sum(axis=0) / y.sum()
    print(f"busy = {c[0]:.3f} ms/batch + {c[1] * 1e3:.2f} us/delivered object + {c[2] * 1e3:.3f} us/candidate "
          f"+ {c[3] * 1e3:.2f} us/change   (R^2 {r2:.3f}, {len(y)} workers)")
    print("share of busy time: batch {:.0%}, deliveries {:.0%}, candidates {:.0%}, changes {:.0%}".format(*share))
    for W in sorted({r["workers"] for r in rows}):
        pred = [x for r in rows if r["workers"] == W for x in r["predicted_worker_loads"]]
        meas = [x for r in rows if r["workers"] == W for x in r["busy_ms_per_worker"]]
        print(f"W={W}: Spearman(predicted, measured) pooled over {sum(r['workers'] == W for r in rows)} plans: "
              f"{spearman(pred, meas):.2f}")


if __name__ == "__main__":
    main()
