"""How skewed is the cost per object, and does the coordinator's estimate rank it? (SJF's premise.)

One inline worker holds the queries (exact radii over the first ``--initial`` objects, then
``--warm`` batches processed); for the next ``--batches`` batches of 1,000 in stream order, each
object's cost is its candidate pairs in the worker's grid index, and its estimate at the
coordinator is :meth:`~knnmon.coordinator.runtime.dispatch.Dispatcher.workload` with
``source="routing"`` (pairs x routed workers). Reports the share of all candidates the cheapest
objects cause, the rank correlation (Spearman) of estimate and cost, and the mean completion
time of that work in SJF order (by the exact cost, and by the estimate) against arrival order,
with release per object and a fixed cost of 0, 10 or 50 candidates per object.

    python benchmarks/cost_skew.py --objects /tmp/full_default --queries /tmp/q100k.parquet \\
        --report docs/bench/cost_skew.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from knnmon.coordinator.runtime.config import RunConfig

from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.store import StoreConfig


def ranks(a: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(a, kind="stable"), kind="stable")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--batches", type=int, default=35)
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    cfg = RunConfig(workers=1, executor="inline", initial=a.initial, store=StoreConfig(data_dir="/tmp/knnmon-cost-skew"))
    cost, est = [], []
    with Runtime(a.objects, a.queries, cfg) as rt:
        w = rt.pool.workers[0]
        for i in range(a.warm):
            rt.process(rt.stream_table.slice(i * 1000, 1000))
        for i in range(a.warm, a.warm + a.batches):
            t = rt.stream_table.slice(i * 1000, 1000)
            owner, codes = rt.dispatcher.routing.encode(t.column("keywords").combine_chunks())
            keep = codes >= 0
            obj, _ = w.index.candidates(t.column("lon").to_numpy(), t.column("lat").to_numpy(), owner[keep], codes[keep])
            cost.append(np.bincount(obj, minlength=t.num_rows))
            est.append(rt.dispatcher.workload(t, source="routing"))
    c, e = np.concatenate(cost), np.concatenate(est)
    cum = np.cumsum(np.sort(c)) / c.sum()
    out = {"command": " ".join(sys.argv), "objects": len(c), "zero_cost_share": float((c == 0).mean()),
           "cheapest_share_of_candidates": {q: float(cum[int(q * len(c)) - 1]) for q in (0.25, 0.5, 0.75, 0.9)},
           "spearman_estimate_vs_cost": float(np.corrcoef(ranks(e), ranks(c))[0, 1]), "sjf_gain": {}}
    for fixed in (0, 10, 50):
        work = fixed + c
        fifo = np.cumsum(work).mean()
        out["sjf_gain"][fixed] = {"by_cost": float(1 - np.cumsum(np.sort(work)).mean() / fifo),
                                  "by_estimate": float(1 - np.cumsum(work[np.argsort(e, kind="stable")]).mean() / fifo)}
    print(json.dumps(out, indent=2))
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
