"""Benchmark: why a windowed stream's first seconds refill many queries at once, and whether a
reserve drawn per query would spread those refills (issue 35's refill waves).

The chaos soak's window as the stream starts: the first ``--window-rows`` places in stream order,
one per ms (as ``benchmarks/chaos_soak.py`` prefills them), and ``--queries-n`` queries with their
``k + --reserve-max`` nearest over them (``ObjectStore.knn_v``). Reports, for 1,000-row slices at
``--slices``, how many queries hold a list member in the slice; then replays the expiry in row
order for a fixed reserve (``--reserve``) and for one drawn per query by the CRC-32 of its id
(``reserve/2 .. 3*reserve/2``): a query's first refill comes when its ``reserve + 1``-th member
expires (k - 1 left), and the report gives the most first refills in one slice::

    python benchmarks/refill_spread.py --objects /tmp/full --queries /tmp/q110k.parquet \\
        --out /tmp/knnmon-bench/refill_spread.json
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.ingest.reading import load_queries, read_objects, stream_order

SLICE = 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--queries-n", type=int, default=100_000)
    ap.add_argument("--window-rows", type=int, default=450_000)
    ap.add_argument("--reserve", type=int, default=8)
    ap.add_argument("--slices", type=int, nargs="+", default=[0, 5000, 9000, 10000, 20000, 100000, 200000, 400000])
    ap.add_argument("--out")
    a = ap.parse_args()
    n = a.window_rows
    objs = stream_order(read_objects(a.objects, ["id", "lon", "lat", "t", "keywords"]), None).slice(0, n)
    objs = objs.set_column(objs.column_names.index("t"), "t", pa.array(np.arange(n, dtype=np.int64) + 1))
    q = load_queries(a.queries).slice(0, a.queries_n)
    k = q.column("k").to_numpy().astype(np.int64)
    hi = a.reserve + a.reserve // 2
    with ObjectStore(objs) as store:
        topk, _ = store.knn_v(q.column("lon").to_numpy(), q.column("lat").to_numpy(),
                              q.column("keywords").combine_chunks(), k + hi)
    row_of = {oid: i for i, oid in enumerate(objs.column("id").to_pylist())}
    counts = np.asarray(topk.counts)
    rows = np.fromiter((row_of[o] for o in topk.ids), dtype=np.int64, count=len(topk.ids))
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    holding = {}
    for lo in a.slices:  # queries whose k + reserve nearest hold a member in rows lo .. lo + SLICE
        rank = np.arange(len(rows)) - starts[owner]
        inside = (rows >= lo) & (rows < lo + SLICE) & (rank < k[owner] + a.reserve)
        holding[lo] = int(len(np.unique(owner[inside])))
    crc = np.array([zlib.crc32(x.encode()) for x in q.column("id").to_pylist()], dtype=np.int64)
    drawn = (a.reserve + 1) // 2 + crc % (hi - (a.reserve + 1) // 2 + 1)
    spread = {}
    for name, reserve in (("fixed", np.full(len(k), a.reserve)), ("drawn per query", drawn)):
        first = [np.sort(rows[starts[i]:starts[i] + k[i] + reserve[i]])[reserve[i]]
                 for i in range(len(k)) if counts[i] >= k[i] + reserve[i]]  # (fewer: r_q = inf, never refilled)
        per = np.bincount(np.asarray(first, dtype=np.int64) // SLICE)
        spread[name] = {"reserve": [int(reserve.min()), int(reserve.max())], "queries_refilled": len(first),
                        "most_first_refills_in_a_slice": int(per.max()), "at_slice": int(np.argmax(per)) * SLICE}
    report = {"window_rows": n, "queries": len(k), "slice_rows": SLICE,
              "queries_holding_a_member_of_the_slice": holding, "first_refills": spread}
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
