"""Bytes per query in a worker, structure by structure (issue: at most 1 KB per query).

One :class:`~knnmon.workers.worker.KnnWorker` in this process, writing to an embedded Redis as a
worker does, loads ``--queries-n`` queries with their exact initial kNN over the first
``--initial`` objects, then streams ``--batches`` batches of 1,000 objects. The resident set
size is read after the load, after the stream, and once the worker is gone (the difference is
what it held; freed heap handed back with ``malloc_trim`` each time); the worker's own
structures are sized with ``sys.getsizeof`` (containers and the strings they hold) and
``nbytes`` (arrays).

    python benchmarks/worker_memory.py --objects /tmp/synth2m --queries /tmp/sq250k.parquet \\
        --report /tmp/knnmon-bench/worker_memory.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys

import numpy as np
import pyarrow.parquet as pq

from knnmon.coordinator.bench.worker_load import initial_load
from knnmon.heap import give_back, resident_bytes
from knnmon.ingest.reading import OBJECT_COLUMNS, stream_head
from knnmon.redis_server import EmbeddedRedis
from knnmon.workers.worker import KnnWorker
from knnmon.workers.settings import WorkerSettings


def deep(obj, seen: set[int] | None = None) -> int:
    """Bytes of a container and what it holds (strings, tuples, lists, dicts, sets, arrays)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes + 112
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep(k, seen) + deep(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep(x, seen) for x in obj)
    elif type(obj).__module__.startswith("knnmon") and hasattr(obj, "__dict__"):
        size += deep(vars(obj), seen)  # a worker's room (QueryTable, TopKLists, ObjectHandles, ...)
    return size


def sizes(w: KnnWorker) -> dict[str, int]:
    """Bytes per attribute of the worker (its rooms, the query index and the load tracker
    attribute by attribute; not the writer's connection)."""
    out = {}
    seen: set[int] = set()
    for name, value in sorted(vars(w).items()):
        if name in ("writer", "queue"):
            continue
        if type(value).__module__.startswith("knnmon") and hasattr(value, "__dict__"):
            for part, v in vars(value).items():  # a room, attribute by attribute
                out[f"{name}.{part}"] = deep(v, seen)
        else:
            out[name] = deep(value, seen)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--queries-n", type=int, default=250_000)
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--index", default="grid")
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    objects = stream_head(a.objects, a.initial + a.batches * 1000, OBJECT_COLUMNS)  # only the rows used
    initial, stream = objects.slice(0, a.initial), objects.slice(a.initial, a.batches * 1000)
    q = pq.read_table(a.queries).slice(0, a.queries_n)
    cols, topk, info = initial_load(initial, q, processes=2)
    out = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
           "command": " ".join(sys.argv), "queries": q.num_rows, "places": sum(len(t) for t in topk)}
    with EmbeddedRedis() as server:
        w = KnnWorker(0, WorkerSettings(server.url, "bench", index=a.index))
        w.load_queries(cols, topk, info)
        del topk, info
        gc.collect()
        give_back()
        r_load = resident_bytes()
        out["after_load"] = {k: round(v / q.num_rows, 1) for k, v in sizes(w).items()}
        for b in range(a.batches):
            part = stream.slice(b * 1000, 1000)
            w.process_batch(b, part.column("id").to_pylist(), part.column("lon").to_numpy(),
                            part.column("lat").to_numpy(), part.column("t").to_numpy(),
                            part.column("keywords").to_pylist())
        gc.collect()
        give_back()
        r_stream = resident_bytes()
        out["after_stream"] = {k: round(v / q.num_rows, 1) for k, v in sizes(w).items()}
        out["objects_held"] = len(w.state.handles)
        w.state.writer.close()
        del w
        gc.collect()
        give_back()
        r0 = resident_bytes()  # the process without the worker: the difference is what the worker held
        out["rss_after_load_bytes_per_query"] = round((r_load - r0) / q.num_rows, 1)
        out["rss_after_stream_bytes_per_query"] = round((r_stream - r0) / q.num_rows, 1)
        out["sized_after_load_bytes_per_query"] = round(sum(out["after_load"].values()), 1)
        out["sized_after_stream_bytes_per_query"] = round(sum(out["after_stream"].values()), 1)
    print(json.dumps(out, indent=2))
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
