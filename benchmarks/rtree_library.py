"""The ``rtree`` library (libspatialindex) against knnmon's packed R-tree, on the search a worker
runs per batch: every (object, keyword) pair's point ``(lon, lat, keyword code)`` against the
queries' kNN-region boxes, one entry per (query, keyword).

    python benchmarks/rtree_library.py --objects /tmp/full_default --queries /tmp/q100k.parquet

The queries' radii are their exact kNN radii over the first ``--initial`` objects; the batches
are the next objects. Both indexes are built over the same entries and asked the same points
(``rtree``: one ``intersection_v`` call per batch, the library's vectorised search); both must
find the same (pair, entry) set. Rounds alternate the two, best of ``--rounds`` per batch.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()

    from rtree import index as rindex

    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.preparation import prepare
    from knnmon.geo import cap_bbox
    from knnmon.workers.packed_rtree import PackedRTree

    prepared = prepare(a.objects, a.queries, RunConfig(initial=a.initial, batches=a.batches, batch=1000))
    q = prepared.queries
    x0, y0, x1, y1 = cap_bbox(q.column("lon").to_numpy(), q.column("lat").to_numpy(), prepared.radius)
    codes: dict[str, int] = {}
    words = q.column("keywords").to_pylist()
    per = np.fromiter(map(len, words), np.int64, len(words))
    ecode = np.array([codes.setdefault(w, len(codes)) for ws in words for w in ws], np.int64)
    ex0, ey0, ex1, ey1 = (np.repeat(v, per) for v in (x0, y0, x1, y1))
    n = len(ecode)

    t0 = time.perf_counter()
    packed = PackedRTree(ex0, ey0, ex1, ey1, ecode, fanout=16)
    packed_build = time.perf_counter() - t0
    props = rindex.Property()
    props.dimension = 3
    t0 = time.perf_counter()
    lib = rindex.Index(((i, (ex0[i], ey0[i], float(ecode[i]), ex1[i], ey1[i], float(ecode[i])), None)
                        for i in range(n)), properties=props)
    lib_build = time.perf_counter() - t0

    stream = prepared.stream
    rows = {"packed_ms": [], "rtree_ms": [], "pairs": [], "hits": []}
    for b in range(a.batches):
        batch = stream.slice(b * 1000, 1000)
        bw = batch.column("keywords").to_pylist()
        bper = np.fromiter(map(len, bw), np.int64, len(bw))
        known = np.array([w in codes for ws in bw for w in ws], bool)
        pc = np.array([codes.get(w, -1) for ws in bw for w in ws], np.int64)[known]
        px = np.repeat(batch.column("lon").to_numpy(), bper)[known]
        py = np.repeat(batch.column("lat").to_numpy(), bper)[known]
        pts = np.column_stack([px, py, pc.astype(np.float64)])
        best = {"packed": np.inf, "rtree": np.inf}
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            pair, entry = packed.search(px, py, pc)
            best["packed"] = min(best["packed"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            ids, counts = lib.intersection_v(pts, pts)
            best["rtree"] = min(best["rtree"], time.perf_counter() - t0)
        got = set(zip(np.repeat(np.arange(len(px)), counts.astype(np.int64)).tolist(), ids.tolist()))
        assert got == set(zip(pair.tolist(), entry.tolist())), f"batch {b}: the two indexes disagree"
        rows["packed_ms"].append(best["packed"] * 1e3)
        rows["rtree_ms"].append(best["rtree"] * 1e3)
        rows["pairs"].append(len(px))
        rows["hits"].append(len(ids))
    report = {"entries": n, "queries": q.num_rows, "build_s": {"packed": packed_build, "rtree": lib_build},
              "per_batch_ms_mean": {k: float(np.mean(rows[f"{k}_ms"])) for k in ("packed", "rtree")},
              "pairs_per_batch": float(np.mean(rows["pairs"])), "hits_per_batch": float(np.mean(rows["hits"]))}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
