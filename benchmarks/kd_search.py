"""Benchmark: the object index's k-d kernels on real places -- a search's time for queries in a
region whose objects are gone (a window's refill) and among live objects, and a box fit's time
for objects expiring together and all over the map.

    python benchmarks/kd_search.py --objects /tmp/full --out /tmp/knnmon-bench/kd_search.json

The live objects are ``--live`` places after the first ``--gone`` in stream order; the "gone"
queries stand on the first ``--gone`` places (not indexed), the "live" ones on places after the
live ones. Each search wants 10; the best of three calls of 3,000 queries is reported.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq

from knnmon.coordinator.bench.runner import machine_info
from knnmon.coordinator.runtime.object_index import ObjectIndex


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", required=True, help="an ingest output directory")
    p.add_argument("--gone", type=int, default=200_000)
    p.add_argument("--live", type=int, default=600_000)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    t = pq.read_table(f"{a.objects}/objects.parquet", columns=["id", "lon", "lat", "t", "keywords"])
    live = t.slice(a.gone, a.live)
    index = ObjectIndex(live)
    index.build_trees()
    words = pa.compute.value_counts(live.column("keywords").combine_chunks().flatten()).to_pylist()
    words = [w["values"] for w in sorted(words, key=lambda w: -w["counts"])][:40:8]
    rng = np.random.default_rng(0)
    searches = []
    for where, q in (("gone", t.slice(0, a.gone)), ("live", t.slice(a.gone + a.live, a.gone))):
        pick = rng.choice(q.num_rows, 3000, replace=False)
        lon, lat = q.column("lon").to_numpy()[pick], q.column("lat").to_numpy()[pick]
        for w in words:
            kws = pa.array([[w]] * len(pick), type=pa.list_(pa.string()))
            best = min(_timed(lambda: index.knn_v(lon, lat, kws, np.full(len(pick), 10))) for _ in range(3))
            searches.append({"queries": where, "keyword": w, "entries": len(index.postings(w)),
                             "us_per_search": round(best * 1e6 / len(pick), 1)})
    fits = []
    alive = np.ones(live.num_rows, dtype=bool)
    scattered = rng.choice(np.arange(live.num_rows // 2, live.num_rows), 1000, replace=False)
    for name, rows in (("together 0-1000", np.arange(0, 1000)), ("together 30000-31000", np.arange(30_000, 31_000)),
                       ("together 100000-101000", np.arange(100_000, 101_000)), ("all over the map", scattered)):
        alive[rows] = False
        t0 = time.perf_counter()
        nodes = index.refit(alive, rows)
        fits.append({"expired": name, "ms": round((time.perf_counter() - t0) * 1e3, 1), "nodes": nodes})
    report = {"machine": machine_info(), "args": vars(a), "entries": int(len(index._post)), "searches": searches,
              "fits": fits}
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({k: report[k] for k in ("entries", "searches", "fits")}, indent=1))


def _timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
