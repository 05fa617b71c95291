"""BatchSearch in one worker: Short-Job-First against FIFO per level L, and the adaptive level.

Wang, Zhang and Kitsuregawa's experiment (``shared/papers/batching_wang_fischer.md`` §1.6-1.7)
on knnmon's data: one worker's R-tree over real queries' kNN regions (the exact radii over the
first ``--initial`` objects, from :class:`~knnmon.coordinator.runtime.runtime.Runtime` with one inline
worker), and batches of the next real objects in stream order. Each object's **response time**
is from the batch's start to the end of its group's work: the candidates of
:meth:`~knnmon.workers.rtree_index.RTreeIndex.batch_search` and the exact check of each against
the query's ``r_q`` (the worker's post-filter). Per batch size and level ``L``: the mean
response time with SJF and in arrival order (FIFO), the same batches for every setting,
interleaved batch by batch; then the adaptive level (§4.2) on the same batches, its choice
against the best fixed level.

    python benchmarks/batch_search.py --objects /tmp/full_default --queries /tmp/q100k.parquet \\
        --report docs/bench/batch_search.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

from knnmon.coordinator.bench.speed_probe import speed_probe_ms
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.geo import haversine_m
from knnmon.store import StoreConfig
from knnmon.workers.adaptive_level import AdaptiveLevel
from knnmon.workers.rtree_index import RTreeIndex


def respond(index: RTreeIndex, q_lon, q_lat, q_r, batch, level, group, sjf) -> np.ndarray:
    """Per-object response times (s) of one batch, in batch order."""
    lon, lat, po, pc = batch
    t0 = time.perf_counter()
    out = np.empty(len(lon))
    for g in index.batch_search(lon, lat, po, pc, level=level, group=group, sjf=sjf):
        d = haversine_m(lon[g.obj], lat[g.obj], q_lon[g.slot], q_lat[g.slot])
        _ = g.slot[d <= q_r[g.slot]]  # the post-filter's survivors (their top-k merge is per batch)
        out[g.objects] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--sizes", default="16,64,256", help="objects per batch (Wang et al.: 2-128)")
    ap.add_argument("--batches", type=int, default=40, help="batches per size")
    ap.add_argument("--group", type=int, default=1, help="objects per SJF group (1: one at a time, as Wang et al.)")
    ap.add_argument("--loop", type=int, default=8, help="the adaptive level's loop counter")
    ap.add_argument("--report")
    a = ap.parse_args(argv)

    cfg = RunConfig(workers=1, executor="inline", initial=a.initial, index="rtree",
                    store=StoreConfig(data_dir="/tmp/knnmon-batch-search"))
    sizes = [int(s) for s in a.sizes.split(",")]
    with Runtime(a.objects, a.queries, cfg) as rt:
        w = rt.pool.workers[0]
        slot, code = w.queries.entries(np.flatnonzero(w.queries.alive))
        index = RTreeIndex()
        index.rebuild(slot, code, w.queries.lon[slot], w.queries.lat[slot], w.queries.radius[slot])
        q_lon, q_lat, q_r = w.queries.lon, w.queries.lat, w.queries.radius
        at, batches = 0, {}
        for n in sizes:
            batches[n] = []
            for _ in range(a.batches):
                t = rt.stream_table.slice(at, n)
                at += n
                owner, codes = rt.dispatcher.routing.encode(t.column("keywords").combine_chunks())
                keep = codes >= 0
                batches[n].append((t.column("lon").to_numpy(), t.column("lat").to_numpy(), owner[keep], codes[keep]))
    probe = speed_probe_ms()
    rows = []
    height = index.height
    for n in sizes:
        settings = [(lv, sjf) for lv in range(height + 1) for sjf in (True, False)]
        mean = {s: [] for s in settings}
        work = {lv: [] for lv in range(height + 1)}
        for b in batches[n]:  # interleaved: every setting on each batch before the next batch
            for lv, sjf in settings:
                mean[(lv, sjf)].append(respond(index, q_lon, q_lat, q_r, b, lv, a.group, sjf).mean())
        for lv in range(height + 1):
            work[lv] = float(np.mean([index.estimate(n, *bb, lv)[0].mean() for bb in batches[n]]))
            sj, ff = np.mean(mean[(lv, True)]) * 1e3, np.mean(mean[(lv, False)]) * 1e3
            rows.append({"batch": n, "level": lv, "sjf_mean_ms": sj, "fifo_mean_ms": ff,
                         "sjf_gain": 1 - sj / ff, "workload_mean": work[lv]})
        best = min((r for r in rows if r["batch"] == n), key=lambda r: r["sjf_mean_ms"])
        adaptive = AdaptiveLevel(loop=a.loop, threshold=10**9)
        index.adaptive = adaptive
        chosen, times = [], []
        for rep in range(3 * a.loop * 4 // len(batches[n]) + 1):  # enough batches for a few decisions
            for b in batches[n]:
                lv = adaptive.level(n, height)
                chosen.append(lv)
                times.append(respond(index, q_lon, q_lat, q_r, b, None, a.group, True).mean())
        state = adaptive.state()[AdaptiveLevel.bucket_of(n)]
        last = int(len(times) * 0.75)
        rows.append({"batch": n, "adaptive": state, "best_fixed_level": best["level"],
                     "best_fixed_sjf_mean_ms": best["sjf_mean_ms"],
                     "adaptive_mean_ms_last_quarter": float(np.mean(times[last:]) * 1e3),
                     "levels_chosen": np.bincount(chosen, minlength=height + 1).tolist()})
        print(json.dumps(rows[-1]), flush=True)
    report = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
              "command": " ".join(sys.argv), "config": vars(a), "tree_height": height, "entries": index.entries,
              "probe_ms_before": probe, "probe_ms_after": speed_probe_ms(), "rows": rows}
    for r in rows:
        if "level" in r:
            print(f"batch {r['batch']:4d} L={r['level']}: SJF {r['sjf_mean_ms']:.2f} ms  FIFO {r['fifo_mean_ms']:.2f} ms"
                  f"  gain {100 * r['sjf_gain']:.0f} %  workload {r['workload_mean']:.1f}")
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
