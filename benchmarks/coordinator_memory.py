"""Bytes per object in the coordinator, structure by structure (issue: the paper's largest
setting needs at most 250 bytes per live object there).

In one process, the resident set size (``VmRSS``) is read before and after building each of what
the coordinator holds for ``--n`` objects, the way the runtime builds it:

1. the objects' Arrow table (``read_objects``, the columns the runtime reads);
2. the object index over them (:class:`~knnmon.coordinator.runtime.object_index.ObjectIndex`,
   without its per-keyword trees);
3. the per-keyword trees that the initial kNN of ``--queries-n`` queries builds (what a run's
   start-up and every registration search);
4. the ids seen (the dispatcher's duplicate check,
   :class:`~knnmon.coordinator.runtime.seen_ids.SeenIds`);
5. dropping the trees, as the runtime does once its start-up searches are done (negative: freed).

Each step is also reported as Arrow's allocation (``pa.total_allocated_bytes``). RSS deltas in
one process are what the process keeps, allocator slack included.

    python benchmarks/coordinator_memory.py --objects /tmp/synth2m --queries /tmp/sq100k.parquet \\
        --report /tmp/knnmon-bench/coordinator_memory.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from knnmon.coordinator.runtime.seen_ids import SeenIds
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.heap import resident_bytes
from knnmon.ingest.reading import OBJECT_COLUMNS, read_objects, stream_order


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--n", type=int, default=None, help="objects (default all)")
    ap.add_argument("--queries-n", type=int, default=100_000)
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    steps, keep = [], []

    def step(name: str, build) -> None:
        gc.collect()
        pa.default_memory_pool().release_unused()
        r0, p0, t0 = resident_bytes(), pa.total_allocated_bytes(), time.perf_counter()
        keep.append(build())
        gc.collect()
        pa.default_memory_pool().release_unused()
        steps.append({"step": name, "rss_bytes": resident_bytes() - r0, "arrow_bytes": pa.total_allocated_bytes() - p0,
                      "s": round(time.perf_counter() - t0, 1)})
        print(steps[-1], flush=True)

    step("arrow table", lambda: stream_order(read_objects(a.objects, OBJECT_COLUMNS), None)
         .slice(0, a.n).combine_chunks())
    table = keep[-1]
    n = table.num_rows
    step("object index (no trees)", lambda: ObjectIndex(table))
    index = keep[-1]
    q = pq.read_table(a.queries).slice(0, a.queries_n)
    step(f"trees of {q.num_rows:,} queries' keywords",
         lambda: index.knn_v(q.column("lon").to_numpy(), q.column("lat").to_numpy(), q.column("keywords"),
                             q.column("k").to_numpy().astype(np.int64)) and index.trees_built)
    step("ids seen", lambda: SeenIds(table.column("id")))
    step("trees dropped after start-up", lambda: index.drop_trees())
    for s in steps:
        s["bytes_per_object"] = round(s["rss_bytes"] / n, 1)
    out = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
           "command": " ".join(sys.argv), "objects": n, "keyword_pairs": int(len(index._post)),
           "trees_built": index.trees_built, "steps": steps,
           "total_bytes_per_object": round(sum(s["rss_bytes"] for s in steps) / n, 1),
           "peak_bytes_per_object": round(sum(s["rss_bytes"] for s in steps[:-1]) / n, 1)}
    print(json.dumps(out, indent=2))
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
